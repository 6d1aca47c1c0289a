"""Who may use the inbox: a token (a login form, or ``Authorization: Bearer``) or basic auth.

Nothing but the login page and the static files is served to a request without credentials;
:class:`ReviewerGate` refuses it (basic auth: 401 with a challenge; token only: the login page).
The reviewer's name is what the audit trail records as who decided a review (``inbox:NAME``), so
a name that could not be recorded is refused where it enters: at the login form, and for a
basic-auth account when the inbox starts. Wrong credentials are counted by a
:class:`LoginThrottle`; a token login lives in :class:`ReviewerSessions` until logout.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.inbox.sessions import ReviewerSessions
from coordinator.inbox.throttle import LoginThrottle
from coordinator.state import ReviewerError, check_reviewer
from shared.errors import OrgaError
from shared.settings import OrgaSettings

__all__ = [
    "Credentials",
    "InboxConfigError",
    "ReviewerAuth",
    "ReviewerGate",
    "check_name",
    "client_address",
    "decided_by",
]

PUBLIC_PATHS = ("/login", "/static/")
MIN_TOKEN_LENGTH = 16
HOW_TO_DRAW_ONE = "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
AUDIT_PREFIX = "inbox:"
MAX_NAME_LENGTH = 64 - len(AUDIT_PREFIX)
"""A reviewer's name with the audit trail's prefix fits ``check_reviewer``'s 64 characters."""


def decided_by(reviewer: str) -> str:
    """The audit trail's name for a reviewer's decisions, ``inbox:NAME``; ReviewerError when
    NAME cannot be recorded (the rule of ``orga review decide``)."""
    return check_reviewer(f"{AUDIT_PREFIX}{reviewer}")


def check_name(name: str) -> str:
    """``name`` when decisions can be recorded under it; ReviewerError saying the rule and a
    name that fits otherwise."""
    try:
        decided_by(name)
    except ReviewerError:
        ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        fits = re.sub(r"[^A-Za-z0-9._@:-]+", "-", ascii_name).strip("._@:-")[:MAX_NAME_LENGTH]
        raise ReviewerError(
            f"the name {name[:80]!r} cannot be recorded with your decisions: use 1 to "
            f"{MAX_NAME_LENGTH} letters, digits, '.', '_', '@', ':' or '-', starting with a "
            f"letter or digit (e.g. {fits or 'reviewer'!r})"
        ) from None
    return name


def client_address(connection: HTTPConnection) -> str:
    """The client's address (a trusted proxy's ``X-Forwarded-For``, as uvicorn applies it)."""
    return connection.client.host if connection.client else "unknown"


class InboxConfigError(OrgaError):
    """The inbox is not configured to authenticate reviewers (or the configuration is invalid)."""


@dataclass(frozen=True, slots=True)
class ReviewerAuth:
    """The credentials reviewers may present; at least one kind is configured."""

    token: str | None = field(default=None, repr=False)
    accounts: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.token and not self.accounts:
            raise InboxConfigError(
                "the inbox serves nothing without reviewer authentication: set ORGA_INBOX_TOKEN "
                f"(a long random secret, e.g. {HOW_TO_DRAW_ONE}) "
                "or ORGA_INBOX_BASIC_AUTH=user:password"
            )
        if self.token and len(self.token) < MIN_TOKEN_LENGTH:
            raise InboxConfigError(
                f"ORGA_INBOX_TOKEN is {len(self.token)} characters: anyone who guesses it decides "
                f"reviews, so use at least {MIN_TOKEN_LENGTH} random ones, "
                f"e.g. {HOW_TO_DRAW_ONE}"
            )
        for user in self.accounts:
            try:
                check_name(user)
            except ReviewerError as exc:
                raise InboxConfigError(
                    f"ORGA_INBOX_BASIC_AUTH: account {user[:80]!r}: {exc}; rename the account"
                ) from None

    @classmethod
    def from_settings(cls, settings: OrgaSettings) -> ReviewerAuth:
        """The credentials of ORGA_INBOX_TOKEN and ORGA_INBOX_BASIC_AUTH."""
        token = settings.inbox_token.get_secret_value() if settings.inbox_token else None
        basic = settings.inbox_basic_auth
        accounts = _parse_accounts(basic.get_secret_value()) if basic else {}
        return cls(token=token or None, accounts=accounts)

    @property
    def fingerprint(self) -> str:
        """Changes when the token changes: a session logged in with an old token is refused."""
        return hashlib.sha256((self.token or "").encode()).hexdigest()[:16]

    def token_matches(self, candidate: str) -> bool:
        """True when ``candidate`` is the configured token (constant-time)."""
        return bool(self.token) and hmac.compare_digest(
            candidate.encode(), str(self.token).encode()
        )

    def presented(self, authorization: str | None) -> Credentials | None:
        """The credentials in an ``Authorization`` header the inbox takes, right or wrong;
        None when it has none."""
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() == "basic" and self.accounts:
            return self._basic(value.strip())
        if scheme.lower() == "bearer" and self.token:
            matches = self.token_matches(value.strip())
            return Credentials("token", "token" if matches else None, bearer=True)
        return None

    def session_id(self, session: Mapping[str, Any]) -> str | None:
        """The id of the token login a signed session carries, if made with the current token."""
        if self.token and session.get("auth") == self.fingerprint:
            return str(session.get("sid") or "") or None
        return None

    def _basic(self, encoded: str) -> Credentials:
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Credentials("", None)
        expected = self.accounts.get(user)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            return Credentials(user, None)
        return Credentials(user, user)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request's ``Authorization`` header presents: for whom (an account, or ``token``),
    the reviewer it proves (None: wrong), and whether it is a bearer token (which names no
    account: its failures are counted per address only)."""

    user: str
    reviewer: str | None
    bearer: bool = False


def _parse_accounts(text: str) -> dict[str, str]:
    accounts: dict[str, str] = {}
    for number, entry in enumerate(text.split(","), start=1):
        user, colon, password = entry.strip().partition(":")
        if not colon or not user or not password:
            raise InboxConfigError(
                f"ORGA_INBOX_BASIC_AUTH: entry {number} is not `user:password` (both non-empty); "
                "separate several accounts with commas"
            )  # the value itself is a secret: never echoed
        accounts[user] = password
    return accounts


class ReviewerGate:
    """ASGI middleware: refuses unauthenticated requests, puts the reviewer in ``scope``.

    Runs inside Starlette's SessionMiddleware (a token login lives in the signed session, by its
    id in :class:`ReviewerSessions`); credentials in a request's header go by the throttle.
    """

    def __init__(
        self, app: ASGIApp, auth: ReviewerAuth, sessions: ReviewerSessions, throttle: LoginThrottle
    ) -> None:
        self.app = app
        self.auth = auth
        self.sessions = sessions
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope["path"]).startswith(PUBLIC_PATHS):
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        credentials = self.auth.presented(connection.headers.get("authorization"))
        if credentials is None:
            session_id = self.auth.session_id(connection.session) or ""
            reviewer = await run_in_threadpool(self.sessions.reviewer, session_id)
        else:
            refused = await run_in_threadpool(self._checked, connection, credentials)
            if refused is not None:
                await refused(scope, receive, send)
                return
            reviewer = credentials.reviewer
        if reviewer is None:
            await self._refusal(connection)(scope, receive, send)
            return
        scope.setdefault("state", {})["reviewer"] = reviewer
        await self.app(scope, receive, send)

    def _checked(self, connection: HTTPConnection, credentials: Credentials) -> Response | None:
        """429 while the address or the account is throttled; a wrong credential is counted
        (a bearer token's for the address only)."""
        retry_after_s = self.throttle.attempt(
            client_address(connection),
            None if credentials.bearer else credentials.user,
            failed=credentials.reviewer is None,
        )
        if retry_after_s is not None:
            return PlainTextResponse(
                self.throttle.refusal(retry_after_s),
                status_code=429,
                headers={"Retry-After": str(retry_after_s)},
            )
        return None

    def _refusal(self, connection: HTTPConnection) -> Response:
        if self.auth.accounts:
            hint = " or log in with the token at /login" if self.auth.token else ""
            return PlainTextResponse(
                f"authentication required: sign in with your inbox account{hint}",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="orga inbox", charset="UTF-8"'},
            )
        if connection.scope["method"] in ("GET", "HEAD"):
            return RedirectResponse(
                f"/login?{urlencode({'next': connection.url.path})}", status_code=303
            )
        return PlainTextResponse("authentication required: log in at /login", status_code=401)
