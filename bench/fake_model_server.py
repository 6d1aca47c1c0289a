"""A fake OpenAI-compatible model server that answers after a configurable latency.

Run: ``.venv/bin/python -m bench.fake_model_server --latency 1 --jitter 0.2 --iterations 5``
(it prints ``fake model server on http://127.0.0.1:PORT/v1`` once it listens). The slow-model
benchmark (``bench/slow_model_bench.py``) starts it as its own process; tests use
:class:`FakeModelServer` inside their own event loop.

One asyncio event loop, no threads, no dependency: HTTP/1.1 with keep-alive on
``asyncio.start_server``, enough of it for httpx and other ordinary clients
(``Content-Length`` or chunked request bodies).

``POST /v1/chat/completions`` speaks the real wire format: ``Authorization: Bearer KEY``
(401 otherwise), a JSON body with ``model`` and ``messages`` (and ``tools``), and a reply with
``choices[0].message`` (``tool_calls`` or ``content``), ``finish_reason`` and ``usage``, after
a latency drawn uniformly in ``latency ± jitter × latency``. The script: the turn is one more
than the number of ``tool`` messages in the conversation; turns ``1 .. N-1`` call a tool
(``file_read`` of one line of ``note.txt`` by default, a different line each turn), turn ``N``
answers. So each run of an agent loop against it is ``N`` model calls.

Counting, for every request to the chat completions endpoint:

- calls in flight now, at the peak, and their time-weighted mean between the first request's
  arrival and the last reply (or now);
- calls in all, and **duplicates**: a request is identified by the task marker found in its
  conversation (``SMB-TASK-<id>``, which the benchmark writes into each task's goal) and its
  turn; a second request for the same (task, turn) is a duplicate model call;
- one record per request (marker, turn, arrival and end, wall clock), for the benchmark to
  line up with its own timestamps.

Control endpoints (not counted): ``GET /stats`` (``?records=1`` adds the records),
``POST /reset`` (zero every count), ``GET /health``.

A request with ``"stream": true`` is answered in the streaming wire format
(``bench/model_streams.py``: ``chat.completion.chunk`` frames, the usage chunk when
``stream_options.include_usage`` asks for it, ``data: [DONE]``) as HTTP/1.1 chunks: the
latency passes before the first frame, then ``--chunk-delay`` between frames (a model's
per-token pace). ``--text-words`` adds that many words of text to every reply, so a streamed
answer has pieces to stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.model_streams import openai_frames

__all__ = [
    "MARKER_PATTERN",
    "CallRecord",
    "FakeModelServer",
    "InflightMeter",
    "ScriptConfig",
    "task_marker",
]

MARKER_PATTERN = re.compile(r"SMB-TASK-([A-Za-z0-9_-]+)")
"""How a task names itself in its conversation (the benchmark puts it in the goal)."""
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEADER_LINES = 100
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 413: "Too Large"}


def _run_index(marker: str | None) -> int | None:
    """``n`` of a marker ``<run>-<n>``, else None."""
    if marker is None:
        return None
    _, _, tail = marker.rpartition("-")
    return int(tail) if tail.isdigit() else None


def task_marker(identifier: str) -> str:
    """The text a task carries so the server can tell its requests apart."""
    return f"SMB-TASK-{identifier}"


@dataclass(frozen=True, slots=True)
class ScriptConfig:
    """What the fake model answers and how slowly."""

    latency_s: float = 1.0
    jitter: float = 0.2
    """The latency is drawn uniformly in ``latency_s × (1 ± jitter)``."""
    iterations: int = 5
    """Turns per run: ``iterations - 1`` tool calls, then a final answer."""
    api_key: str = "bench-key"
    tool_name: str = "file_read"
    tool_path: str = "note.txt"
    seed: int = 10
    text_words: int = 0
    """Words of text each reply carries (with its tool call, or as the answer's start)."""
    chunk_delay_s: float = 0.0
    """Streamed replies: the pause between two frames (the latency is the first frame's)."""


@dataclass(slots=True)
class CallRecord:
    """One chat completions request: its task marker, turn, and when it ran (wall clock)."""

    task: str | None
    turn: int
    start: float
    end: float = 0.0


@dataclass(slots=True)
class InflightMeter:
    """Calls in flight: now, peak, and the time-weighted mean over the busy window."""

    clock: Any = time.monotonic
    now: int = 0
    peak: int = 0
    area: float = 0.0
    first_start: float | None = None
    last_end: float | None = None
    _changed: float = 0.0

    def enter(self) -> None:
        """A call starts."""
        stamp = self._advance()
        if self.first_start is None:
            self.first_start = stamp
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        """A call ends."""
        self.last_end = self._advance()
        self.now -= 1

    def mean(self) -> float:
        """Mean calls in flight from the first arrival to the last reply (or now, if busy)."""
        if self.first_start is None:
            return 0.0
        stamp = self.clock()
        area = self.area + self.now * (stamp - self._changed)
        end = stamp if self.now or self.last_end is None else self.last_end
        return area / (end - self.first_start) if end > self.first_start else float(self.now)

    def _advance(self) -> float:
        stamp: float = self.clock()
        self.area += self.now * (stamp - self._changed)
        self._changed = stamp
        return stamp


@dataclass(slots=True)
class _Counts:
    """Everything ``/reset`` zeroes."""

    meter: InflightMeter = field(default_factory=InflightMeter)
    calls: int = 0
    duplicates: int = 0
    unmarked: int = 0
    rejected: int = 0
    seen: set[tuple[str, int]] = field(default_factory=set)
    records: list[CallRecord] = field(default_factory=list)


class _HttpError(Exception):
    """A request the server refuses, with its status and OpenAI-style error message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


class FakeModelServer:
    """The server; ``await start()``, then ``url`` is its OpenAI base URL; ``await close()``."""

    def __init__(self, config: ScriptConfig | None = None, host: str = "127.0.0.1") -> None:
        self.config = config or ScriptConfig()
        self.host = host
        self.port = 0
        self._counts = _Counts()
        self._random = random.Random(self.config.seed)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The base URL clients use (``.../v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self, port: int = 0) -> FakeModelServer:
        """Listen (a free port when ``port`` is 0)."""
        self._server = await asyncio.start_server(
            self._serve, self.host, port, backlog=4096, limit=MAX_BODY_BYTES
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    def reset(self) -> None:
        """Zero every count (calls still in flight are forgotten)."""
        self._counts = _Counts()

    def stats(self, records: bool = False) -> dict[str, Any]:
        """The counts, as ``GET /stats`` returns them."""
        counts, meter = self._counts, self._counts.meter
        result: dict[str, Any] = {
            "calls": counts.calls,
            "distinct_calls": len(counts.seen),
            "duplicates": counts.duplicates,
            "unmarked": counts.unmarked,
            "rejected": counts.rejected,
            "inflight": meter.now,
            "peak_inflight": meter.peak,
            "mean_inflight": meter.mean(),
            "busy_s": _busy_s(meter),
        }
        if records:
            result["records"] = [asdict(r) for r in counts.records]
        return result

    # -- HTTP -----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # close(): end quietly, the server is going away
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after the other on one connection, until it closes."""
        while True:
            try:
                request = await _read_request(reader)
            except _HttpError as exc:
                _write(writer, exc.status, _error_body(str(exc)), keep_alive=False)
                await writer.drain()
                return
            if request is None:
                return
            if _wants_stream(request):
                await self._stream(request, writer)
            else:
                status, body = await self._respond(request)
                _write(writer, status, body, keep_alive=request.keep_alive)
            await writer.drain()
            if not request.keep_alive:
                return

    async def _stream(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        """A streamed completion: the latency until the first frame, then one frame every
        ``chunk_delay_s``, as HTTP/1.1 chunks (``bench/model_streams.py``)."""
        try:
            body = self._validated(request)
        except _HttpError as exc:
            _write(writer, exc.status, _error_body(str(exc)), keep_alive=request.keep_alive)
            return
        messages: list[Any] = body["messages"]
        record = self._arrive(_marker_of(messages), _turn_of(messages))
        counts = self._counts
        try:
            await asyncio.sleep(self._latency(record))
            reply = self._reply(str(body["model"]), record, _prompt_tokens(request.body))
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            writer.write(_STREAM_HEAD.format(keep_alive=_connection_header(request)).encode())
            for index, frame in enumerate(openai_frames(reply, include_usage=usage)):
                if index and self.config.chunk_delay_s:
                    await asyncio.sleep(self.config.chunk_delay_s)
                data = frame.encode()
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        finally:
            record.end = time.time()
            counts.meter.leave()

    async def _respond(self, request: _Request) -> tuple[int, bytes]:
        route = request.path.split("?", 1)[0]
        try:
            if request.method == "POST" and route == "/v1/chat/completions":
                return 200, await self._completion(request)
            if request.method == "GET" and route == "/stats":
                return 200, json.dumps(self.stats("records=1" in request.path)).encode()
            if request.method == "POST" and route == "/reset":
                self.reset()
                return 200, b'{"reset": true}'
            if request.method == "GET" and route == "/health":
                return 200, b'{"ok": true}'
            raise _HttpError(404, f"no route {request.method} {route}")
        except _HttpError as exc:
            return exc.status, _error_body(str(exc))

    # -- the model ------------------------------------------------------------------------

    async def _completion(self, request: _Request) -> bytes:
        """Validate, count, wait the latency, answer."""
        body = self._validated(request)
        messages: list[Any] = body["messages"]
        record = self._arrive(_marker_of(messages), _turn_of(messages))
        counts = self._counts
        try:
            await asyncio.sleep(self._latency(record))
        finally:
            record.end = time.time()
            counts.meter.leave()
        reply = self._reply(str(body["model"]), record, _prompt_tokens(request.body))
        return json.dumps(reply).encode()

    def _validated(self, request: _Request) -> dict[str, Any]:
        expected = f"Bearer {self.config.api_key}"
        if request.headers.get("authorization") != expected:
            self._counts.rejected += 1
            raise _HttpError(401, "Incorrect API key provided")
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            self._counts.rejected += 1
            raise _HttpError(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict) or not body.get("model"):
            self._counts.rejected += 1
            raise _HttpError(400, "the body must be an object with 'model'")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._counts.rejected += 1
            raise _HttpError(400, "'messages' must be a non-empty list")
        return body

    def _arrive(self, marker: str | None, turn: int) -> CallRecord:
        counts = self._counts
        counts.calls += 1
        counts.meter.enter()
        if marker is None:
            counts.unmarked += 1
        elif (marker, turn) in counts.seen:
            counts.duplicates += 1
        else:
            counts.seen.add((marker, turn))
        record = CallRecord(marker, turn, time.time())
        counts.records.append(record)
        return record

    def _latency(self, record: CallRecord) -> float:
        """A draw in ``latency ± jitter``, the same for the same run and turn in every batch:
        a marker ending in ``-<n>`` (every benchmark's ``<run>-<n>``) seeds it with ``n`` and
        the turn, so each system meets the very same latencies (and the same slowest run)
        whatever order its calls arrive in; any other request draws from the server's
        sequence."""
        spread = self.config.latency_s * self.config.jitter
        draw = self._random
        index = _run_index(record.task)
        if index is not None:
            draw = random.Random(f"{self.config.seed}:{index}:{record.turn}")
        return max(0.0, self.config.latency_s + draw.uniform(-spread, spread))

    def _reply(self, model: str, record: CallRecord, prompt_tokens: int) -> dict[str, Any]:
        config = self.config
        text = " ".join(f"w{n}" for n in range(config.text_words)) or None
        if record.turn < config.iterations:
            arguments = {
                "path": config.tool_path,
                "start_line": record.turn,
                "end_line": record.turn,
            }
            call_id = f"call_{record.task or 'x'}_{record.turn}"
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": config.tool_name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            done = f"Done after {record.turn} turns."
            message = {"role": "assistant", "content": f"{text} {done}" if text else done}
            finish = "stop"
        return {
            "id": f"chatcmpl-{self._counts.calls}",
            "object": "chat.completion",
            "created": int(record.start),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 12,
                "total_tokens": prompt_tokens + 12,
            },
        }


# -- request parsing ------------------------------------------------------------------------


def _marker_of(messages: list[Any]) -> str | None:
    """The task marker of the first message that has one."""
    for message in messages:
        if isinstance(message, dict):
            found = MARKER_PATTERN.search(_text(message.get("content")))
            if found is not None:
                return found.group(1)
    return None


def _turn_of(messages: list[Any]) -> int:
    """One more than the tool results already in the conversation."""
    return 1 + sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _prompt_tokens(body: bytes) -> int:
    """A rough count: four bytes per token."""
    return max(1, len(body) // 4)


def _busy_s(meter: InflightMeter) -> float:
    if meter.first_start is None:
        return 0.0
    end = meter.clock() if meter.now or meter.last_end is None else meter.last_end
    return float(end - meter.first_start)


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on the connection; None when the client closed it."""
    line = await reader.readline()
    if not line.strip():
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _HttpError(400, f"not an HTTP/1.x request line: {line[:80]!r}")
    headers = await _read_headers(reader)
    return _Request(parts[0].upper(), parts[1], headers, await _read_body(reader, headers))


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise _HttpError(400, f"more than {MAX_HEADER_LINES} header lines")


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader)
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY_BYTES:
        raise _HttpError(413, f"body of {length} bytes; the limit is {MAX_BODY_BYTES}")
    return await reader.readexactly(length) if length else b""


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await _read_headers(reader)  # trailers, up to the blank line
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


_STREAM_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: {keep_alive}\r\n\r\n"
)


def _wants_stream(request: _Request) -> bool:
    """A chat completions request asking for ``stream: true``."""
    if request.method != "POST" or request.path.split("?", 1)[0] != "/v1/chat/completions":
        return False
    try:
        body = json.loads(request.body)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("stream") is True


def _connection_header(request: _Request) -> str:
    return "keep-alive" if request.keep_alive else "close"


def _write(writer: asyncio.StreamWriter, status: int, body: bytes, *, keep_alive: bool) -> None:
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)


def _error_body(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


# -- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[ScriptConfig, int]:
    """The script configuration and the port from the command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per call")
    parser.add_argument("--jitter", type=float, default=0.2, help="± share of the latency")
    parser.add_argument("--iterations", type=int, default=5, help="model calls per run")
    parser.add_argument("--api-key", default="bench-key")
    parser.add_argument("--tool", default="file_read", help="the tool turns 1..N-1 call")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--text-words", type=int, default=0, help="words of text per reply")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="streamed: seconds between two frames"
    )
    args = parser.parse_args(argv)
    config = ScriptConfig(
        latency_s=args.latency,
        jitter=args.jitter,
        iterations=args.iterations,
        api_key=args.api_key,
        tool_name=args.tool,
        text_words=args.text_words,
        chunk_delay_s=args.chunk_delay,
    )
    return config, args.port


async def serve_forever(config: ScriptConfig, port: int) -> None:
    """Listen until cancelled, printing the base URL once ready."""
    server = await FakeModelServer(config).start(port)
    print(f"fake model server on {server.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m bench.fake_model_server``."""
    config, port = parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(config, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
