"""The inbox's web application: pages, the decide form, login, live fragments.

Decisions go through :meth:`OrgaClient.decide`, the same control path as ``orga review decide``:
the coordinator applies or refuses them, so the deadline default, the two-reviewer race and
the audit trail (``by``: ``inbox:<reviewer>``) behave as from the CLI.

Middleware, outermost first: security headers, :class:`SecureCookies`, :class:`BodyLimit` (413
past the cap, before anything reads the body), the signed session, :class:`ReviewerGate`
(authentication, throttled), asgi-csrf (a signed double-submit cookie checked against every
form's ``csrftoken`` field), then the routes.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, cast

from asgi_csrf import asgi_csrf
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.client import OrgaClient, critic_status
from coordinator.inbox.auth import ReviewerAuth, ReviewerGate, check_name, client_address
from coordinator.inbox.middleware import MAX_BODY_BYTES, BodyLimit, SecureCookies
from coordinator.inbox.sessions import ReviewerSessions
from coordinator.inbox.throttle import LoginThrottle
from coordinator.inbox.views import journal_rows, review_cards, task_row, task_rows, utc
from coordinator.state import ReviewerError
from shared import keys
from shared.approval import DecisionError
from shared.errors import OrgaError

__all__ = ["DECISIONS", "InboxApp", "create_app"]

DECISIONS = ("retry", "skip", "abort", "approve", "revise", "edit", "reject")
"""``approve`` and ``revise`` (with its reason) decide a step's result: a critic review;
``approve``, ``edit`` (with the arguments as JSON), ``reject`` (with its message) and ``abort``
a held tool call."""
WITH_TEXT = frozenset({"retry", "revise", "reject"})
"""The decisions that carry the form's text: a retry's hint, a revision's reason, the
message of a rejected call."""
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
"""A Redis stream id (``after`` of the live answer's requests)."""

PROTECTED_FORMS = frozenset({"/decide", "/login", "/logout"})
"""Checked by asgi-csrf even on a request without cookies (basic auth sends none)."""
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


@dataclass(frozen=True, slots=True)
class InboxApp:
    """The routes' shared state: the client, the credentials, the logins, the templates."""

    client: OrgaClient
    auth: ReviewerAuth
    sessions: ReviewerSessions
    throttle: LoginThrottle
    templates: Jinja2Templates
    decide_timeout_s: float = 30.0

    def page(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        """Render a template with the reviewer, the flash messages and the CSRF token."""
        fragment = name.startswith("_")  # a live refresh leaves the messages to the page
        reviewer = getattr(request.state, "reviewer", None)
        context |= {
            "reviewer": reviewer,
            "open_reviews": self.client.open_review_count() if reviewer and not fragment else 0,
            "flashes": [] if fragment else request.session.pop("flashes", []),
            "csrftoken": request.scope["csrftoken"](),
            "token_login": bool(self.auth.token),
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    # -- reviews ----------------------------------------------------------------------------

    def reviews(self, request: Request) -> Response:
        """Open reviews, newest first, each with its context and its decisions (a step's
        result before its critic: approve or revise too)."""
        return self.page(request, "reviews.html", cards=review_cards(self.client.reviews()))

    def review_count(self, request: Request) -> Response:
        """How many reviews are open, for the live badge in the navigation."""
        return PlainTextResponse(str(self.client.open_review_count()))

    async def decide(self, request: Request) -> Response:
        """Send a decision through the client; redirect to the task, or back with the error."""
        form = await request.form()
        review_id, decision, hint = _decision(form)
        if decision not in DECISIONS or not review_id:
            return PlainTextResponse(
                f"decision {decision!r} for review {review_id!r} is not valid: choose one of "
                f"{', '.join(DECISIONS)} on the inbox page",
                status_code=400,
            )
        by = f"inbox:{request.state.reviewer}"
        typed = str(form.get("arguments") or "")
        try:
            arguments = _edited(typed) if decision == "edit" else None
            task_id = await run_in_threadpool(
                partial(self.client.decide, arguments=arguments),
                review_id, decision, hint if decision in WITH_TEXT else None,
                by, self.decide_timeout_s,
            )  # fmt: skip
        except DecisionError as exc:  # the form again, with what was typed and the error
            cards = review_cards(self.client.reviews())
            return self.page(
                request, "reviews.html", status_code=422, cards=cards,
                edits={review_id: typed}, errors={review_id: str(exc)},
            )  # fmt: skip
        except OrgaError as exc:
            _flash(request, "error", f"review {review_id}: {exc}")
            return RedirectResponse("/", status_code=303)
        _flash(request, "ok", f"{decision} applied to task {task_id} (review {review_id})")
        return RedirectResponse(f"/tasks/{task_id}", status_code=303)

    # -- tasks ------------------------------------------------------------------------------

    def tasks(self, request: Request) -> Response:
        """The recent tasks with live status and progress."""
        return self.page(request, "tasks.html", rows=task_rows(self.client))

    def task_rows(self, request: Request) -> Response:
        """The tasks table's rows alone, for the live refresh."""
        return self.page(request, "_task_rows.html", rows=task_rows(self.client))

    def task(self, request: Request) -> Response:
        """One task: status, steps, milestones, its sub-agent tree and its journal."""
        return self._task_page(request, "task.html")

    def task_live(self, request: Request) -> Response:
        """The live part of a task's page, for the refresh."""
        return self._task_page(request, "_task_live.html")

    def _task_page(self, request: Request, template: str) -> Response:
        task_id = str(request.path_params["task_id"])
        try:
            record = self.client.record(task_id)
        except OrgaError as exc:
            return self.page(request, "missing.html", status_code=404, message=str(exc))
        return self.page(
            request, template, row=task_row(record), result=record.result(),
            critic=critic_status(record),
            journal=journal_rows(self.client, record.task_id, record.journal_seq),
            updated=utc(record.updated_at), children=self.client.children(record),
            parent=record.spec.delegation.task_id if record.spec.delegation else None,
        )  # fmt: skip

    def task_tokens(self, request: Request) -> Response:
        """The task's streamed answers after the stream id ``after`` (JSON: ``entries`` as
        :meth:`shared.tokens.TokenEntry.as_json`, and ``ended`` once the task has ended), for
        the page's live answer."""
        task_id = str(request.path_params["task_id"])
        after = str(request.query_params.get("after") or "0-0")
        if not _STREAM_ID.fullmatch(after):
            message = f"after must be a stream id like 0-0, got {after[:40]!r}"
            return JSONResponse({"error": message}, status_code=400)
        try:
            record = self.client.record(task_id)
        except OrgaError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        entries = [e.as_json() for e in self.client.tokens(record.task_id, after)]
        return JSONResponse({"entries": entries, "ended": record.terminal})

    # -- login ------------------------------------------------------------------------------

    def login_form(self, request: Request) -> Response:
        """The token login form (basic auth needs none: the browser asks)."""
        return self.page(request, "login.html", next=_safe_next(request.query_params.get("next")))

    async def login(self, request: Request) -> Response:
        """Check the name and the token (throttled); on success a server-side login starts and
        the signed session carries its id."""
        form = await request.form()
        target = _safe_next(str(form.get("next") or "/"))
        name = " ".join(str(form.get("name") or "").split()) or "reviewer"
        try:
            check_name(name)
        except ReviewerError as exc:
            return self.page(request, "login.html", status_code=400, next=target, error=str(exc))
        token = str(form.get("token") or "")
        refused = await run_in_threadpool(self._login_refusal, request, name, token)
        if refused is not None:
            status_code, error, headers = refused
            response = self.page(request, "login.html", status_code, next=target, error=error)
            response.headers.update(headers)
            return response
        session_id = await run_in_threadpool(self._relogin, request, name)
        request.session.update({"auth": self.auth.fingerprint, "sid": session_id})
        return RedirectResponse(target, status_code=303)

    def _login_refusal(
        self, request: Request, name: str, token: str
    ) -> tuple[int, str, dict[str, str]] | None:
        """Why a login is refused: 429 while the address or name is throttled (right token or
        wrong), 401 for a wrong token (counted); None when it is right."""
        matches = self.auth.token_matches(token)
        retry_after_s = self.throttle.attempt(client_address(request), name, failed=not matches)
        if retry_after_s is not None:
            retry = {"Retry-After": str(retry_after_s)}
            return 429, self.throttle.refusal(retry_after_s), retry
        if not matches:
            return 401, "that token is not the inbox's token (ORGA_INBOX_TOKEN); try again", {}
        return None

    def _relogin(self, request: Request, name: str) -> str:
        """End the login this browser had, if any; start one for ``name``."""
        self.sessions.end(str(request.session.get("sid") or ""))
        return self.sessions.start(name)

    async def logout(self, request: Request) -> Response:
        """End the session's login, here and for any copy of its cookie."""
        await run_in_threadpool(self.sessions.end, str(request.session.get("sid") or ""))
        request.session.clear()
        return RedirectResponse("/login", status_code=303)


def _decision(form: FormData) -> tuple[str, str, str]:
    hint = str(form.get("hint") or "").replace("\r\n", "\n").strip()  # as typed, as on the CLI
    return str(form.get("review_id") or ""), str(form.get("decision") or ""), hint


def _edited(typed: str) -> dict[str, Any]:
    """The arguments typed in an edit form: a JSON object, or DecisionError saying what is
    wrong (where in the text, for bad JSON)."""
    try:
        value = json.loads(typed)
    except ValueError as exc:
        raise DecisionError(
            f"the edited arguments are not JSON ({exc}); write an object such as "
            '{"command": "git push origin feature"}'
        ) from exc
    if not isinstance(value, dict):
        raise DecisionError(
            f"the edited arguments must be a JSON object, got {type(value).__name__}"
        )
    return value


def _flash(request: Request, kind: str, text: str) -> None:
    request.session.setdefault("flashes", []).append([kind, text])


def _safe_next(target: str | None) -> str:
    """Only a path on this site (never ``//host`` or a URL) is a place to go after login."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _templates() -> Jinja2Templates:
    environment = Environment(
        loader=PackageLoader("coordinator.inbox", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    return Jinja2Templates(env=environment)


def _security_headers(app: ASGIApp) -> ASGIApp:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await app(scope, receive, send_with_headers)

    return wrapped


async def _csrf_failed(scope: Scope, send: Send, message_id: object) -> None:
    response = PlainTextResponse(
        "CSRF check failed: the form's csrftoken field does not match this browser's csrftoken "
        "cookie (a form from another site, or an old page): reload the page and submit again",
        status_code=403,
    )
    await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def create_app(
    client: OrgaClient,
    auth: ReviewerAuth,
    secret: str | None = None,
    decide_timeout_s: float = 30.0,
    *,
    secure_cookies: bool | Literal["auto"] = "auto",
    max_body_bytes: int = MAX_BODY_BYTES,
    max_failed_logins: int = 10,
) -> Starlette:
    """The inbox as an ASGI app; ``secret`` signs the cookies (random when None).

    ``secure_cookies`` is ORGA_INBOX_SECURE_COOKIES; logins and their failures are kept in the
    client's Redis, so every inbox replica on one deployment shares them.
    """
    secret = secret or secrets.token_urlsafe(32)
    sessions = ReviewerSessions(client.redis)
    throttle = LoginThrottle(client.redis, max_failures=max_failed_logins)
    inbox = InboxApp(client, auth, sessions, throttle, _templates(), decide_timeout_s)
    routes = [
        Route("/", inbox.reviews),
        Route("/reviews/count", inbox.review_count),
        Route("/decide", inbox.decide, methods=["POST"]),
        Route("/tasks", inbox.tasks),
        Route("/tasks/rows", inbox.task_rows),
        Route("/tasks/{task_id}", inbox.task),
        Route("/tasks/{task_id}/live", inbox.task_live),
        Route("/tasks/{task_id}/tokens", inbox.task_tokens),
        Route("/login", inbox.login_form),
        Route("/login", inbox.login, methods=["POST"]),
        Route("/logout", inbox.logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("coordinator.inbox", "static")]), name="static"),
    ]
    csrf_options = {"signing_secret": secret, "always_protect": PROTECTED_FORMS,
                    "send_csrf_failed": _csrf_failed}  # fmt: skip
    middleware = [
        Middleware(cast("Any", _security_headers)),
        Middleware(SecureCookies, secure=secure_cookies),
        Middleware(BodyLimit, max_body_bytes=max_body_bytes),
        Middleware(
            SessionMiddleware,
            secret_key=secret,
            session_cookie="orga_inbox",
            same_site="lax",
            max_age=keys.inbox_session_ttl_s,
        ),
        Middleware(ReviewerGate, auth=auth, sessions=sessions, throttle=throttle),
        Middleware(cast("Any", asgi_csrf), **csrf_options),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.inbox = inbox
    return app
