"""A local fake OPA server that answers like OPA's REST data API.

It listens on 127.0.0.1 (a free port), serves from a background thread and records the input
of every query. Like OPA:

- ``POST /v1/data/<path>`` with ``{"input": ...}`` answers ``200 {"result": <document>}``, or
  ``200 {}`` when the document at ``<path>`` is undefined (no policy loaded there);
- a body that is not a JSON object answers ``400 {"code": "invalid_parameter", ...}``;
- any other path or method answers ``404``/``405`` with OPA's error shape.

Documents are programmed per path, as a constant or as a Python function of the input (a
stand-in for a Rego rule); failures (a status, a raw body, a delay) can be queued for the next
queries.

    with FakeOpaServer() as opa:
        opa.set_decision("orga/allow", lambda input: input["tool_name"] != "run_command")
        gate = OpaGate(opa.url, "orga/allow")
        ...
        assert opa.queries[-1].input["tool_name"] == "run_command"
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["FakeOpaServer", "OpaQuery", "QueuedAnswer", "closed_opa_url"]

_DATA_PREFIX = "/v1/data/"


def closed_opa_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass(frozen=True)
class OpaQuery:
    """One query as the server saw it: the rule path, the input and the headers (lowercase)."""

    path: str
    input: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class QueuedAnswer:
    """An answer to the next query, instead of the programmed document."""

    status: int = 200
    body: Any = None
    raw: str | None = None
    delay_s: float = 0.0


@dataclass
class _State:
    documents: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    queued: deque[QueuedAnswer] = field(default_factory=deque)
    queries: list[OpaQuery] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeOpaServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (timeout tests) are expected."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.server.fake.handle(self)

    def do_GET(self) -> None:
        self._answer(405, {"code": "method_not_allowed", "message": "the fake answers POST"})

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``queries`` instead."""

    def _answer(self, status: int, body: Any, raw: str | None = None) -> None:
        payload = raw.encode() if raw is not None else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except ConnectionError:
            return


class FakeOpaServer:
    """OPA's data API over programmed documents; records every query."""

    def __init__(self) -> None:
        self._state = _State()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, what the OPA gate takes as its URL."""
        assert self._server is not None, "start the server first (use it as a context manager)"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- programming --------------------------------------------------------------------------

    def set_decision(self, path: str, document: Any) -> None:
        """The document at ``path`` (``orga/allow``): a constant, or a function of the input."""
        rule = document if callable(document) else (lambda _input, value=document: value)
        with self._lock:
            self._state.documents[path.strip("/")] = rule

    def queue(self, *answers: QueuedAnswer) -> None:
        """Answer the next queries with these, in order, before the programmed documents."""
        with self._lock:
            self._state.queued.extend(answers)

    @property
    def queries(self) -> list[OpaQuery]:
        """Every query received so far (a copy)."""
        with self._lock:
            return list(self._state.queries)

    # -- serving ------------------------------------------------------------------------------

    def handle(self, handler: _Handler) -> None:
        """Record the query, then answer it as OPA would."""
        if not handler.path.startswith(_DATA_PREFIX):
            handler._answer(404, {"code": "resource_not_found", "message": handler.path})
            return
        path = handler.path.removeprefix(_DATA_PREFIX).strip("/")
        length = int(handler.headers.get("content-length") or 0)
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except ValueError as exc:
            handler._answer(400, {"code": "invalid_parameter", "message": f"body: {exc}"})
            return
        if not isinstance(body, dict):
            handler._answer(400, {"code": "invalid_parameter", "message": "body must be object"})
            return
        self._record(path, body, handler)
        self._answer(path, body.get("input"), handler)

    def _record(self, path: str, body: dict[str, Any], handler: _Handler) -> None:
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            self._state.queries.append(OpaQuery(path, body.get("input"), headers))

    def _answer(self, path: str, input_document: Any, handler: _Handler) -> None:
        with self._lock:
            queued = self._state.queued.popleft() if self._state.queued else None
            rule = self._state.documents.get(path)
        if queued is not None:
            if queued.delay_s and self._stopping.wait(queued.delay_s):
                return
            handler._answer(queued.status, queued.body, queued.raw)
        elif rule is None:
            handler._answer(200, {})
        else:
            handler._answer(200, {"result": rule(input_document)})
