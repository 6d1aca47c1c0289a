"""Local fake LLM servers that speak the real OpenAI and Anthropic wire formats.

Each server listens on 127.0.0.1 (a free port), serves from a background thread, records every
request (headers and JSON body) and answers from a queue of programmed responses. Like the real
APIs it checks what a real server would refuse (the path, the auth headers, the required body
fields) and answers those in the provider's own error shape, so a provider that builds a wrong
request fails here the way it would in production. An empty queue answers 500 with a message
saying so.

A request with ``"stream": true`` gets its programmed 200 reply streamed in the provider's
wire format (``bench/model_streams.py``: OpenAI ``data:`` chunks and ``[DONE]``, Anthropic's
named events), one frame every ``chunk_delay_s``; ``cut_after`` closes the connection after
that many frames, as a server that dies mid-answer.

    with FakeOpenAIServer(api_key="sk-test") as server:
        server.respond_text("Hello!")
        provider = OpenAICompatProvider(base_url=server.base_url, api_key="sk-test")
        ...
        assert server.last_request.body["model"] == "gpt-4o"
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from bench.model_streams import anthropic_frames, openai_frames

__all__ = [
    "FIXTURES_DIR",
    "FakeAnthropicServer",
    "FakeLLMServer",
    "FakeOpenAIServer",
    "ProgrammedResponse",
    "RecordedRequest",
    "RecordingSleep",
    "closed_port_url",
    "load_fixture",
]

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "providers"


def load_fixture(name: str) -> Any:
    """A recorded-shape response body from ``tests/fixtures/providers``."""
    return json.loads((FIXTURES_DIR / name).read_text(encoding="utf-8"))


class RecordingSleep:
    """An injectable ``sleep`` that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it; header names are lowercase."""

    method: str
    path: str
    headers: dict[str, str]
    raw_body: bytes
    body: Any


@dataclass(frozen=True)
class ProgrammedResponse:
    """What to answer: a JSON body (dict or list) or raw text/bytes, after ``delay_s``."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    cut_after: int | None = None
    """Streamed: close the connection after this many frames (None: send them all)."""
    content_type: str | None = None
    """The content type of a ``bytes`` body (None: ``application/octet-stream``)."""

    def encoded(self) -> tuple[bytes, str]:
        """The body bytes and their content type."""
        if isinstance(self.body, bytes):
            return self.body, self.content_type or "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), "text/html; charset=utf-8"
        return json.dumps(self.body).encode(), "application/json"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (timeout tests) are expected; anything else is recorded."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            self.fake.errors.append(repr(exc))


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.server.fake.handle(self)

    def do_GET(self) -> None:
        self.server.fake.handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``requests`` instead."""


class FakeLLMServer(ABC):
    """The server machinery; subclasses add the wire format (path, auth, error shape)."""

    endpoint_path: ClassVar[str] = "/v1/chat/completions"

    def __init__(self, *, api_key: str | None = None, chunk_delay_s: float = 0.0) -> None:
        self.api_key = api_key
        self.chunk_delay_s = chunk_delay_s
        self.stream_starts: list[float] = []
        """``time.monotonic()`` when each streamed answer's first frame was written."""
        self.stream_ends: list[float] = []
        """``time.monotonic()`` when each streamed answer's last frame was written."""
        self.errors: list[str] = []
        self._requests: list[RecordedRequest] = []
        self._queue: deque[ProgrammedResponse] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on a free port of 127.0.0.1 and serve from a daemon thread."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake delayed answers, close the socket."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        assert self._server is not None, "start the server first"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, what a provider takes as its base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- programming --------------------------------------------------------------------------

    def enqueue(self, *responses: ProgrammedResponse) -> None:
        """Answer the next requests with ``responses``, in order."""
        with self._lock:
            self._queue.extend(responses)

    def respond_json(
        self,
        body: Any,
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Queue a JSON answer."""
        self.enqueue(ProgrammedResponse(status, body, dict(headers or {}), delay_s))

    def respond_raw(self, text: str, *, status: int = 200) -> None:
        """Queue a non-JSON answer (an HTML error page from a proxy, say)."""
        self.enqueue(ProgrammedResponse(status, text))

    def respond_fixture(self, name: str, *, status: int = 200, **headers: str) -> None:
        """Queue a recorded-shape body from ``tests/fixtures/providers``."""
        self.respond_json(load_fixture(name), status=status, headers=headers)

    def respond_error(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Queue an error in this provider's wire shape."""
        self.respond_json(self.error_body(status, message), status=status, headers=headers)

    def respond_rate_limited(self, retry_after: str | None = None) -> None:
        """Queue a 429, with a ``Retry-After`` header when given."""
        headers = {"retry-after": retry_after} if retry_after is not None else {}
        self.respond_error(429, "Rate limit reached. Please try again later.", headers=headers)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest:
        """The most recent request."""
        requests = self.requests
        assert requests, "the fake server has received no request"
        return requests[-1]

    @property
    def pending(self) -> int:
        """Programmed responses not yet served."""
        with self._lock:
            return len(self._queue)

    # -- the wire format (overridden per provider) -------------------------------------------

    @abstractmethod
    def error_body(self, status: int, message: str) -> Any:
        """An error body in the provider's shape."""

    def refuse(self, request: RecordedRequest) -> ProgrammedResponse | None:
        """What the real server would answer to a malformed request, or None."""
        if urlsplit(request.path).path != self.endpoint_path:  # routed by path, as servers do
            return self._error(404, f"Unknown request URL: POST {request.path}")
        if request.method != "POST":
            return self._error(405, f"Method {request.method} not allowed")
        if not isinstance(request.body, dict):
            return self._error(400, "We could not parse the JSON body of your request.")
        missing = [key for key in self.required_fields() if key not in request.body]
        if missing:
            return self._error(400, f"{missing[0]}: Field required")
        return None

    def required_fields(self) -> Sequence[str]:
        """Body fields the real API requires."""
        return ("model", "messages")

    # -- serving ------------------------------------------------------------------------------

    def handle(self, handler: _Handler) -> None:
        """Record the request, then answer it."""
        request = self._record(handler)
        response = self.refuse(request) or self._next_response()
        if response.delay_s and self._stopping.wait(response.delay_s):
            return
        body = request.body if isinstance(request.body, dict) else {}
        if (
            body.get("stream") is True
            and response.status == 200
            and isinstance(response.body, dict)
        ):
            self._write_stream(handler, response, self.stream_frames(body, response.body))
            return
        self._write(handler, response)

    def stream_frames(self, request: Mapping[str, Any], reply: Mapping[str, Any]) -> list[str]:
        """The SSE frames of ``reply`` in this provider's streaming wire format."""
        raise NotImplementedError

    def _write_stream(
        self, handler: _Handler, response: ProgrammedResponse, frames: list[str]
    ) -> None:
        if response.cut_after is not None:
            frames = frames[: response.cut_after]
        try:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream; charset=utf-8")
            handler.send_header("cache-control", "no-cache")
            handler.send_header("connection", "close")
            for name, value in response.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            self.stream_starts.append(time.monotonic())
            for index, frame in enumerate(frames):
                if index and self.chunk_delay_s and self._stopping.wait(self.chunk_delay_s):
                    return
                handler.wfile.write(frame.encode())
                handler.wfile.flush()
            self.stream_ends.append(time.monotonic())
        except ConnectionError:
            return
        handler.close_connection = True

    def _record(self, handler: _Handler) -> RecordedRequest:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = RecordedRequest(
            method=handler.command,
            path=handler.path,
            headers={name.lower(): value for name, value in handler.headers.items()},
            raw_body=raw,
            body=body,
        )
        with self._lock:
            self._requests.append(request)
        return request

    def _next_response(self) -> ProgrammedResponse:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return self._error(500, "fake server: no programmed response left")

    def _error(self, status: int, message: str) -> ProgrammedResponse:
        return ProgrammedResponse(status, self.error_body(status, message))

    @staticmethod
    def _write(handler: _Handler, response: ProgrammedResponse) -> None:
        payload, content_type = response.encoded()
        try:
            handler.send_response(response.status)
            handler.send_header("content-type", content_type)
            handler.send_header("content-length", str(len(payload)))
            for name, value in response.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except ConnectionError:
            return


class FakeOpenAIServer(FakeLLMServer):
    """``POST /v1/chat/completions`` with ``Authorization: Bearer <key>``, OpenAI error shapes."""

    endpoint_path = "/v1/chat/completions"

    def error_body(self, status: int, message: str) -> Any:
        """``{"error": {message, type, param, code}}``."""
        kind = {401: "invalid_request_error", 429: "requests", 404: "invalid_request_error"}
        return {
            "error": {
                "message": message,
                "type": kind.get(
                    status, "invalid_request_error" if status < 500 else "server_error"
                ),
                "param": None,
                "code": None,
            }
        }

    def refuse(self, request: RecordedRequest) -> ProgrammedResponse | None:
        """Bad key (when one is configured), then the base checks, then tool_choice alone."""
        expected = f"Bearer {self.api_key}"
        if self.api_key is not None and request.headers.get("authorization") != expected:
            return self._error(401, "Incorrect API key provided: sk-wr*******ong.")
        refused = super().refuse(request)
        if refused is None and "tool_choice" in request.body and not request.body.get("tools"):
            return self._error(
                400,
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
                "are specified.",
            )
        return refused

    def stream_frames(self, request: Mapping[str, Any], reply: Mapping[str, Any]) -> list[str]:
        """Chunks and ``[DONE]``; the usage chunk only when ``include_usage`` was asked."""
        options = request.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return openai_frames(reply, include_usage=usage)

    def respond_text(
        self,
        content: str,
        *,
        model: str = "gpt-4o",
        finish_reason: str = "stop",
        usage: tuple[int, int, int] = (10, 5, 15),
    ) -> None:
        """Queue a plain text completion."""
        message = {"role": "assistant", "content": content, "refusal": None}
        self.respond_json(_openai_completion(message, model, finish_reason, usage))

    def respond_tool_calls(
        self,
        calls: Sequence[tuple[str, str, Mapping[str, Any]]],
        *,
        content: str | None = None,
        model: str = "gpt-4o",
        usage: tuple[int, int, int] = (20, 10, 30),
    ) -> None:
        """Queue a completion asking for ``(id, name, arguments)`` tool calls."""
        message = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(dict(arguments))},
                }
                for call_id, name, arguments in calls
            ],
        }
        self.respond_json(_openai_completion(message, model, "tool_calls", usage))


def _openai_completion(
    message: Mapping[str, Any], model: str, finish_reason: str, usage: tuple[int, int, int]
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake0001",
        "object": "chat.completion",
        "created": 1_735_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": dict(message), "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[2],
        },
        "system_fingerprint": "fp_fake",
    }


class FakeAnthropicServer(FakeLLMServer):
    """``POST /v1/messages`` with ``x-api-key`` and ``anthropic-version``, Anthropic errors."""

    endpoint_path = "/v1/messages"
    _ERROR_TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        529: "overloaded_error",
    }

    def error_body(self, status: int, message: str) -> Any:
        """``{"type": "error", "error": {type, message}}``."""
        kind = self._ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def required_fields(self) -> Sequence[str]:
        """The Messages API requires ``max_tokens`` too."""
        return ("model", "max_tokens", "messages")

    def refuse(self, request: RecordedRequest) -> ProgrammedResponse | None:
        """Auth headers, then the base checks, then no system role inside ``messages``."""
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            return self._error(401, "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return self._error(400, "anthropic-version: header is required")
        refused = super().refuse(request)
        if refused is not None:
            return refused
        roles = {m.get("role") for m in request.body["messages"] if isinstance(m, dict)}
        if not roles <= {"user", "assistant"}:
            return self._error(
                400,
                'messages: Unexpected role "system". The Messages API accepts a top-level '
                '`system` parameter, not "system" as an input message role.',
            )
        return None

    def stream_frames(self, request: Mapping[str, Any], reply: Mapping[str, Any]) -> list[str]:
        """``message_start`` ... ``message_stop``."""
        return anthropic_frames(reply)

    def respond_text(
        self,
        text: str,
        *,
        model: str = "claude-sonnet-4-20250514",
        stop_reason: str = "end_turn",
        usage: tuple[int, int] = (12, 6),
    ) -> None:
        """Queue a message with one text block."""
        blocks = [{"type": "text", "text": text}]
        self.respond_json(_anthropic_message(blocks, model, stop_reason, usage))

    def respond_tool_use(
        self,
        calls: Sequence[tuple[str, str, Mapping[str, Any]]],
        *,
        text: str | None = None,
        model: str = "claude-sonnet-4-20250514",
        usage: tuple[int, int] = (15, 20),
    ) -> None:
        """Queue a message with optional text and ``(id, name, input)`` tool_use blocks."""
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks.extend(
            {"type": "tool_use", "id": call_id, "name": name, "input": dict(tool_input)}
            for call_id, name, tool_input in calls
        )
        self.respond_json(_anthropic_message(blocks, model, "tool_use", usage))


def _anthropic_message(
    blocks: list[dict[str, Any]], model: str, stop_reason: str, usage: tuple[int, int]
) -> dict[str, Any]:
    return {
        "id": "msg_fake0001",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }
