"""``orga api``: the HTTP API for pipelines, on a deployment or the embedded runtime.

Routes (all under ``/v1``, bearer tokens from ``ORGA_API_TOKENS``; docs/protocol.md §API):
tasks (submit with an ``Idempotency-Key``, list by page, status, result, cancel, journal, events
as Server-Sent Events resumable with ``Last-Event-ID``) and reviews (list, show, decide). The
OpenAPI description is ``/v1/openapi.json`` (no token needed: it holds no data).

FastAPI, not hand-written Starlette routes: the task is a pydantic model already
(:class:`~shared.task_spec.TaskSpec`), so FastAPI validates the body with it, names the field
of each error, and writes the OpenAPI description from the same models, which cannot drift
from the code. Server-Sent Events are sse-starlette's (pings, disconnects). Everything reads
and writes through :class:`~coordinator.async_client.AsyncOrgaClient`: no Redis code here.

Errors are JSON, ``{"error": {"message", "field", "fix"}}`` (a list under ``errors`` for a
body with several invalid fields); bodies are capped before they are read (413, the inbox's
:class:`~coordinator.inbox.middleware.BodyLimit`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.async_client import AsyncOrgaClient
from coordinator.client import (
    WATCH_SOCKET_TIMEOUT_S,
    ReviewDecidedError,
    TaskFinishedError,
    TaskNotFoundError,
    TaskRejectedError,
    WaitTimeoutError,
)
from coordinator.inbox.middleware import BodyLimit
from coordinator.state import ReviewerError, TaskStatus
from coordinator.watch import Cursor, CursorError, TaskEvent
from orga.embedded import EmbeddedRuntime
from orga.inbox import SignalledServer, serve_announced
from orga.redis_client import RedisClients
from shared import approval
from shared.errors import ConfigError, OrgaError
from shared.settings import OrgaSettings
from shared.task_spec import TaskSpec

__all__ = ["API_MAX_BODY_BYTES", "ApiConfigError", "api_tokens", "create_api", "run_api"]

API_MAX_BODY_BYTES = 1 << 20
"""The largest request body the API reads (a task with its steps and scripted replies)."""
MIN_TOKEN_CHARS = 16


class ApiConfigError(ConfigError):
    """``orga api`` cannot start: no tokens, or a token too short to be secret."""


class ApiError(Exception):
    """An answer other than success: status, message, the field at fault, and the fix."""

    def __init__(self, status: int, message: str, fix: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.fix, self.field = status, message, fix, field


class Submitted(BaseModel):
    """A task on the intake: its id (the first one's, for a repeated idempotency key)."""

    task_id: str
    replayed: bool = False


class CancelRequest(BaseModel):
    """Why the task is cancelled (recorded as its error)."""

    reason: str = Field(default="cancelled through the API", max_length=2000)


class DecisionRequest(approval.DecisionRequest):
    """A reviewer's decision: ``retry`` (``message``: a hint), ``skip``, ``abort``; for a
    step's result before its critic ``approve`` or ``revise`` (``message``: the reason); for a
    held tool call ``approve``, ``edit`` (``arguments``: the whole new argument object, checked
    against the tool's schema) or ``reject`` (``message``: what the model reads)."""

    by: str = Field(default="api", description="who decides (recorded; `api:` is prefixed)")


def api_tokens(settings: OrgaSettings) -> list[bytes]:
    """The bearer tokens ``ORGA_API_TOKENS`` lists; ApiConfigError without one, or for one
    shorter than ``MIN_TOKEN_CHARS`` (never showing it)."""
    raw = settings.api_tokens.get_secret_value() if settings.api_tokens else ""
    tokens = [t.strip() for t in raw.split(",") if t.strip()]
    if not tokens:
        raise ApiConfigError(
            "ORGA_API_TOKENS is not set: `orga api` refuses to serve without authentication; "
            "set it to one or more random tokens separated by commas (`openssl rand -hex 32`)"
        )
    short = [i for i, t in enumerate(tokens, 1) if len(t) < MIN_TOKEN_CHARS]
    if short:
        raise ApiConfigError(
            f"ORGA_API_TOKENS: token number {short[0]} is shorter than {MIN_TOKEN_CHARS} "
            "characters; use long random tokens (`openssl rand -hex 32`)"
        )
    return [t.encode() for t in tokens]


def create_api(client: AsyncOrgaClient, tokens: list[bytes]) -> Any:
    """The ASGI application: FastAPI's routes inside the body cap."""
    app = FastAPI(
        title="orga-queue",
        version="1",
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    _errors(app)
    guard = Depends(_bearer(tokens))
    _task_routes(app, client, guard)
    _review_routes(app, client, guard)
    return BodyLimit(app, API_MAX_BODY_BYTES, refusal=_too_large)


# -- authentication and errors ----------------------------------------------------------------


_BEARER = HTTPBearer(auto_error=False, description="a token of ORGA_API_TOKENS")
"""Reads ``Authorization: Bearer`` (None when absent), and names the scheme in the OpenAPI."""


def _bearer(tokens: list[bytes]) -> Callable[..., None]:
    def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        offered = credentials.credentials.encode() if credentials is not None else b""
        # Every token compared, in constant time each: no early exit tells which was close.
        matched = [hmac.compare_digest(offered, token) for token in tokens]
        if not any(matched):
            raise ApiError(
                401,
                "missing or invalid bearer token",
                "send `Authorization: Bearer TOKEN` with a token of ORGA_API_TOKENS",
                field="Authorization",
            )

    return check


def _error(error: ApiError) -> JSONResponse:
    body = {"error": {"message": error.message, "field": error.field, "fix": error.fix}}
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def _too_large(what: str, cap: int) -> Response:
    response = _error(
        ApiError(413, f"request refused: {what}", f"send a body of at most {cap} bytes", "body")
    )
    response.headers["Connection"] = "close"
    return response


def _errors(app: FastAPI) -> None:
    """Every failure as ``{"error": ...}`` JSON naming the field and the fix."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_invalid_field(e) for e in exc.errors()]
        malformed = any(e.get("type") == "json_invalid" for e in exc.errors())
        first = errors[0] if errors else {"message": "invalid request", "field": None, "fix": ""}
        return JSONResponse(
            {"error": first, "errors": errors}, status_code=400 if malformed else 422
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fix = "see /v1/openapi.json for the routes and their methods"
        return _error(ApiError(exc.status_code, str(exc.detail), fix))


def _invalid_field(error: Any) -> dict[str, Any]:
    """One validation error: ``body.steps.0.id``, what is wrong with it, what to send."""
    location = ".".join(str(part) for part in error.get("loc", ()))
    if error.get("type") == "json_invalid":
        return {
            "message": f"the body is not valid JSON: {error.get('msg')} "
            f"({(error.get('ctx') or {}).get('error', '')})",
            "field": "body",
            "fix": "send the task as a JSON object (Content-Type: application/json)",
        }
    where = "a task and each route's body" if location.startswith("body") else "each parameter"
    return {
        "message": f"{location}: {error.get('msg')} (got {str(error.get('input'))[:80]!r})",
        "field": location,
        "fix": f"correct or remove that field; /v1/openapi.json describes {where}",
    }


async def _call(coroutine: Any, config_field: str | None = None) -> Any:
    """Await a client call, turning its errors into answers (a ConfigError names
    ``config_field``: the request's value the client refused)."""
    try:
        return await coroutine
    except TaskRejectedError as exc:
        raise ApiError(422, str(exc), "fix the task and submit it again", "task") from exc
    except TaskNotFoundError as exc:
        raise ApiError(
            404, str(exc), "GET /v1/tasks lists the tasks, /v1/reviews the reviews"
        ) from exc
    except (TaskFinishedError, ReviewDecidedError) as exc:
        raise ApiError(409, str(exc), "read the task's status: it changed meanwhile") from exc
    except WaitTimeoutError as exc:
        raise ApiError(504, str(exc), "check that a coordinator is running, then retry") from exc
    except ReviewerError as exc:
        raise ApiError(422, str(exc), "send a valid `by`", "body.by") from exc
    except approval.ArgumentsError as exc:
        raise ApiError(
            422, str(exc), "send arguments that fit the tool's input schema", "body.arguments"
        ) from exc
    except approval.DecisionError as exc:
        raise ApiError(
            422, str(exc), "send a decision this review takes (GET it)", "body.decision"
        ) from exc
    except CursorError as exc:
        raise ApiError(400, str(exc), "send an event's id, or none", "Last-Event-ID") from exc
    except ConfigError as exc:
        raise ApiError(400, str(exc), "see the message", config_field) from exc
    except OrgaError as exc:
        raise ApiError(400, str(exc), "see the message") from exc


# -- tasks ---------------------------------------------------------------------------------------


def _task_routes(app: FastAPI, client: AsyncOrgaClient, guard: Any) -> None:
    @app.post("/v1/tasks", status_code=201, dependencies=[guard])
    async def submit(
        task: TaskSpec,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Submitted:
        """Submit a task; an ``Idempotency-Key`` sent again returns the first task's id."""
        if idempotency_key is not None:
            task = _with_key(task, idempotency_key)
            existing = await asyncio.to_thread(client.sync.idempotent_task, idempotency_key)
            if existing is not None:
                response.headers["Idempotent-Replayed"] = "true"
                return Submitted(task_id=existing, replayed=True)
        return Submitted(task_id=await _call(client.submit(task)))

    @app.get("/v1/tasks", dependencies=[guard])
    async def tasks(
        status: TaskStatus | None = None,
        since: Annotated[float | None, Query(description="unix seconds")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Tasks newest first, by page: ``next_cursor`` asks for the next one."""
        rows, following = await _call(
            asyncio.to_thread(
                client.sync.page_tasks, status.value if status else None, since, limit, cursor
            ),
            config_field="cursor",
        )
        return {"tasks": rows, "next_cursor": following}

    @app.get("/v1/tasks/{task_id}", dependencies=[guard])
    async def status(task_id: str) -> dict[str, Any]:
        """Status, step, progress, usage, sub-agents (``rejected`` with the error for a task
        the coordinator refused)."""

        async def status_or_rejection() -> dict[str, Any]:
            try:
                return await client.status(task_id)
            except TaskRejectedError as exc:
                return {"task_id": task_id, "status": "rejected", "error": str(exc)}

        return dict(await _call(status_or_rejection()))

    @app.get("/v1/tasks/{task_id}/result", dependencies=[guard])
    async def result(task_id: str) -> dict[str, Any]:
        """What the task produced (so far, for a task that has not ended)."""
        return dict(await _call(client.result(task_id)))

    @app.post("/v1/tasks/{task_id}/cancel", status_code=202, dependencies=[guard])
    async def cancel(task_id: str, body: CancelRequest | None = None) -> dict[str, Any]:
        """Ask a coordinator to abort the task (409 for a task that ended)."""
        await _call(client.cancel(task_id, (body or CancelRequest()).reason))
        return {"task_id": task_id, "cancel": "sent"}

    @app.get("/v1/tasks/{task_id}/journal", dependencies=[guard])
    async def journal(task_id: str, after: int = -1) -> dict[str, Any]:
        """The journal entries with a sequence above ``after``."""
        entries = await _call(client.journal(task_id, after))
        return {"task_id": task_id, "entries": [e.model_dump(mode="json") for e in entries]}

    @app.get("/v1/tasks/{task_id}/events", dependencies=[guard])
    async def events(
        task_id: str,
        last_event_id: Annotated[str | None, Header()] = None,
        after: Annotated[str | None, Query(description="an event id (as Last-Event-ID)")] = None,
    ) -> EventSourceResponse:
        """Server-Sent Events of the task (journal, status, token, stream_restarted) until it
        ends; resume with ``Last-Event-ID`` (or ``?after=``)."""
        cursor = last_event_id or after
        await _call(_parsed(cursor))  # a bad cursor: a 400, not a stream
        real = await _accepted(client, task_id)  # an unknown task: a 404, not a stream
        # The response starts at once: a resumed watch of a quiet task (one awaiting review
        # for hours) has no event to send, and the pings keep it alive and notice a client
        # that left (no event awaited before the headers).
        return EventSourceResponse(_sse(client.events(real, after=cursor)), ping=SSE_PING_S)


ACCEPT_WAIT_S = 10.0
"""How long the events of a task just submitted wait for a coordinator to accept it."""


async def _accepted(client: AsyncOrgaClient, task_id: str) -> str:
    """The stored task's id, waiting a little for one just submitted; 404 when none comes."""
    try:
        return str(await _call(client.accepted(task_id, time.monotonic() + ACCEPT_WAIT_S)))
    except ApiError as exc:
        if exc.status != 504:
            raise
    raise ApiError(
        404,
        f"no task {task_id!r} (unknown, purged after its retention, or not accepted within "
        f"{ACCEPT_WAIT_S:g}s)",
        "GET /v1/tasks lists the tasks; is a coordinator running?",
    )


def _with_key(task: TaskSpec, key: str) -> TaskSpec:
    if task.idempotency_key not in (None, key):
        raise ApiError(
            422,
            f"the Idempotency-Key header {key!r} and the task's idempotency_key "
            f"{task.idempotency_key!r} differ",
            "send one of them, or the same key in both",
            "Idempotency-Key",
        )
    return task.model_copy(update={"idempotency_key": key})


SSE_PING_S = 15
"""How often a task's event stream sends a comment (``: ping``) while no event comes."""


async def _parsed(cursor: str | None) -> Cursor:
    return Cursor.parse(cursor)


async def _sse(stream: AsyncIterator[TaskEvent]) -> AsyncIterator[ServerSentEvent]:
    try:
        async for event in stream:
            yield _as_sse(event)
    except TaskNotFoundError:  # purged between the check and the first read: nothing to send
        return


def _as_sse(event: TaskEvent) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(event.data), event=event.kind, id=event.id)


# -- reviews -------------------------------------------------------------------------------------


def _review_routes(app: FastAPI, client: AsyncOrgaClient, guard: Any) -> None:
    @app.get("/v1/reviews", dependencies=[guard])
    async def reviews() -> dict[str, Any]:
        """The open reviews, oldest first."""
        items = await _call(client.reviews())
        return {"reviews": [item.model_dump(mode="json") for item in items]}

    @app.get("/v1/reviews/{review_id}", dependencies=[guard])
    async def review(review_id: str) -> dict[str, Any]:
        """One open review: its task, step, reason, deadline, default and snapshot."""
        return dict((await _call(client.review(review_id))).model_dump(mode="json"))

    @app.post("/v1/reviews/{review_id}/decision", dependencies=[guard])
    async def decide(review_id: str, body: DecisionRequest) -> dict[str, Any]:
        """Decide a review; answered once a coordinator applied it (409 when another
        decision came first, 504 when no coordinator applied it in time)."""
        by = body.by if body.by.startswith("api") else f"api:{body.by}"
        task_id = await _call(
            client.decide(review_id, body.decision, body.message, by, arguments=body.arguments)
        )
        return {"review_id": review_id, "task_id": task_id, "decision": body.decision}


# -- serving -------------------------------------------------------------------------------------


def run_api(
    settings: OrgaSettings,
    home: Path,
    host: str,
    port: int,
    announce: Callable[[str], None],
    *,
    key_fds: list[int] | None = None,
) -> None:
    """Serve until interrupted; ApiConfigError, before anything starts, without tokens."""
    tokens = api_tokens(settings)

    async def serve(redis_url: str, where: str, clients: RedisClients | None = None) -> None:
        injected: dict[str, Any] = {}
        if clients is not None:  # a deployment's, a Redis Cluster's among them
            injected = {
                "client": clients.asyncio(
                    decode_responses=True, socket_timeout=WATCH_SOCKET_TIMEOUT_S
                ),
                "sync_client": clients.sync(decode_responses=True),
            }
        async with AsyncOrgaClient(redis_url, partitions=settings.partitions, **injected) as client:
            app = create_api(client, tokens)
            # An open event stream must not hold the shutdown: 5 s, then it is closed.
            config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                    access_log=False, lifespan="off",
                                    timeout_graceful_shutdown=5)  # fmt: skip
            await serve_announced(SignalledServer(config), where, announce, "API", "/v1/")

    async def embedded() -> None:
        async with EmbeddedRuntime(settings, home, key_fds=key_fds) as runtime:
            await serve(runtime.url, f"the embedded runtime in {home}")

    if settings.redis_url:
        clients = RedisClients.from_settings(settings)
        asyncio.run(serve(settings.redis_url, "ORGA_REDIS_URL", clients))
    else:
        asyncio.run(embedded())
