"""Who may use the inbox: a token (a login form, or ``Authorization: Bearer``) or basic auth.

Nothing but the login page and the static files is served to a request without credentials;
:class:`ReviewerGate` refuses it (basic auth: 401 with a challenge; token only: the login page).
The reviewer's name is what the audit trail records as who decided a review.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.errors import OrgaError
from shared.settings import OrgaSettings

__all__ = ["InboxConfigError", "ReviewerAuth", "ReviewerGate"]

PUBLIC_PATHS = ("/login", "/static/")
MIN_TOKEN_LENGTH = 16
HOW_TO_DRAW_ONE = "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"


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

    def identify(self, authorization: str | None, session: Mapping[str, Any]) -> str | None:
        """The reviewer's name for a request, or None when it is not authenticated."""
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() == "basic" and self.accounts:
            return self._basic_user(value.strip())
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return "token"
        if self.token and session.get("auth") == self.fingerprint:
            return str(session.get("reviewer") or "reviewer")
        return None

    def _basic_user(self, encoded: str) -> str | None:
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self.accounts.get(user)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            return None
        return user


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

    Runs inside Starlette's SessionMiddleware (a token login lives in the signed session).
    """

    def __init__(self, app: ASGIApp, auth: ReviewerAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope["path"]).startswith(PUBLIC_PATHS):
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        reviewer = self.auth.identify(connection.headers.get("authorization"), connection.session)
        if reviewer is None:
            await self._refusal(connection)(scope, receive, send)
            return
        scope.setdefault("state", {})["reviewer"] = reviewer
        await self.app(scope, receive, send)

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
