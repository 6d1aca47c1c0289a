"""The peers of the slow-model benchmark: the same agent loop in plain asyncio and LangGraph,
each with the HTTP client set-up a competent user would pick (issue 27).

Run by ``bench/slow_model_bench.py``, each in a process of its own so that its memory and CPU
can be measured alone::

    python -m bench.slow_model_peers asyncio-aiohttp --base-url http://127.0.0.1:PORT/v1 \\
        --tasks 200 --iterations 5 --workspace DIR --run-id ID

Every peer runs ``--tasks`` agent loops at once on one event loop (uvloop's where installed,
as the runtime's workers use: :func:`shared.aio.run`), against the fake model server
(``bench/fake_model_server.py``). Each loop sends the chat completions request the runtime
sends (model, messages, the ``file_read`` tool), runs the tool call the model asks for (one
line of ``note.txt`` in ``--workspace``), appends its result, and stops at the model's final
answer: ``--iterations`` model calls per loop.

The loop (before the dash):

- ``asyncio``: a plain ``for`` loop per run;
- ``langgraph``: a two-node ``StateGraph`` (``model`` → ``tools`` → ``model`` … until the model
  answers) compiled with LangGraph's in-memory checkpointer (``InMemorySaver``), one thread id
  per run, ``ainvoke`` for each.

The HTTP client (after the dash):

- ``aiohttp``: one ``aiohttp.ClientSession`` (its connector keeps a connection per run; its
  pool is a dict of deques, cheap at any size);
- ``httpx20``: ``httpx.AsyncClient`` in pools of 20 connections (``tasks / 20`` clients, run
  ``i`` on client ``i mod n``): httpcore's pool scans every connection it holds for each queued
  request, so a competent user keeps pools small;
- ``httpx200``: one ``httpx.AsyncClient`` of ``tasks`` connections, the handicapped set-up the
  benchmark used before issue 27 (printed as a footnote only);
- ``orgapool``: the runtime's own HTTP path, the providers' ``JsonPoster`` (retries, status
  mapping, JSON decoding) on the worker's session (:func:`workers.http_pool.pooled_session`,
  aiohttp since issue 27), for the HTTP client comparison.

Before the timed batch each peer runs one warm-up run alone (as the runtime gets one warm-up
task; with ``--go-file`` it then says so and waits for that file, so that the benchmark can
zero the model server's counts); CPU is counted over the timed batch only. Prints one JSON
line: ``peer``, ``started`` and ``finished`` (wall clock), ``completed``, ``failed``, the first
``errors``, the CPU seconds of the batch (``cpu_s``), and ``unavailable`` when LangGraph or
aiohttp is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import operator
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.fake_model_server import task_marker
from shared.aio import run as run_on_loop

__all__ = [
    "CLIENTS",
    "FILE_READ_TOOL",
    "LOOPS",
    "PeerSettings",
    "chat_body",
    "initial_messages",
    "main",
    "peer_missing",
    "run_peer",
    "run_tool",
]

FILE_READ_TOOL = {
    "type": "function",
    "function": {
        "name": "file_read",
        "description": "Read lines of a UTF-8 text file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer"},
                "end_line": {"type": "integer"},
            },
            "required": ["path"],
        },
    },
}
ERRORS_KEPT = 5
POOL_SIZE = 20
"""Connections per httpx pool in the ``httpx20`` set-up."""
LOOPS = ("asyncio", "langgraph")
CLIENTS = ("aiohttp", "httpx20", "httpx200", "orgapool")


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """Where the model is and what each run does."""

    base_url: str
    api_key: str
    model: str
    tasks: int
    iterations: int
    workspace: Path
    run_id: str
    timeout_s: float


def initial_messages(marker: str) -> list[dict[str, Any]]:
    """A run's conversation before its first model call (the goal names its marker)."""
    return [
        {"role": "system", "content": "You are an autonomous software agent. Use the tools."},
        {
            "role": "user",
            "content": f"Slow-model benchmark {marker}: read note.txt one line per turn, "
            "then answer.",
        },
    ]


def chat_body(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completions request the runtime sends."""
    return {
        "model": model,
        "messages": messages,
        "tools": [FILE_READ_TOOL],
        "max_tokens": 1024,
        "temperature": 0.3,
    }


def run_tool(call: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """The ``tool`` message answering one ``file_read`` call."""
    arguments = json.loads(call["function"]["arguments"] or "{}")
    lines = (workspace / str(arguments["path"])).read_text().splitlines()
    start = int(arguments.get("start_line", 1))
    end = int(arguments.get("end_line", len(lines)))
    content = "\n".join(lines[start - 1 : end])
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


# -- HTTP clients -------------------------------------------------------------------------


class Chat(Protocol):
    """One chat completions call for run ``index``; the reply's ``choices[0].message``."""

    async def __call__(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]: ...


class Client(Protocol):
    """An HTTP set-up: its chat function, closed at the end."""

    chat: Chat

    async def aclose(self) -> None: ...


class HttpxClients:
    """``count`` httpx clients of ``size`` connections each; run ``i`` uses client ``i % count``."""

    def __init__(self, settings: PeerSettings, count: int, size: int):
        self.settings = settings
        self.url = f"{settings.base_url}/chat/completions"
        self.headers = {"Authorization": f"Bearer {settings.api_key}"}
        timeout = httpx.Timeout(120.0)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self.clients = [httpx.AsyncClient(limits=limits, timeout=timeout) for _ in range(count)]

    async def chat(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        client = self.clients[index % len(self.clients)]
        body = chat_body(self.settings.model, messages)
        response = await client.post(self.url, headers=self.headers, json=body)
        response.raise_for_status()
        message: dict[str, Any] = response.json()["choices"][0]["message"]
        return message

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


class AiohttpClient:
    """One ``aiohttp.ClientSession`` with a connection per run."""

    def __init__(self, settings: PeerSettings) -> None:
        import aiohttp

        self.settings = settings
        self.url = f"{settings.base_url}/chat/completions"
        self.headers = {"Authorization": f"Bearer {settings.api_key}"}
        connector = aiohttp.TCPConnector(limit=settings.tasks + 16, limit_per_host=0)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120.0)
        )

    async def chat(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = chat_body(self.settings.model, messages)
        async with self.session.post(self.url, headers=self.headers, json=body) as response:
            response.raise_for_status()
            reply = await response.json()
        message: dict[str, Any] = reply["choices"][0]["message"]
        return message

    async def aclose(self) -> None:
        await self.session.close()


class RuntimeClient:
    """The runtime's HTTP path: the providers' ``JsonPoster`` on the worker's pooled session."""

    def __init__(self, settings: PeerSettings) -> None:
        from workers.http_pool import pooled_session
        from workers.providers._http import Endpoint, JsonPoster
        from workers.providers.retry import RetryPolicy

        self.settings = settings
        self.headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {settings.api_key}",
        }
        self.session = pooled_session(max(64, settings.tasks + 16))
        endpoint = Endpoint("openai", settings.base_url, "ORGA_API_KEY")
        self.poster = JsonPoster(
            endpoint, timeout_s=120.0, retry=RetryPolicy(), sleep=asyncio.sleep,
            session=self.session,
        )  # fmt: skip

    async def chat(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = chat_body(self.settings.model, messages)
        reply = await self.poster.post(
            "chat/completions", headers=self.headers, body=body, model=self.settings.model
        )
        message: dict[str, Any] = reply["choices"][0]["message"]
        return message

    async def aclose(self) -> None:
        await self.session.close()


def make_client(kind: str, settings: PeerSettings) -> Client:
    """The HTTP set-up named ``kind`` (one of :data:`CLIENTS`)."""
    if kind == "aiohttp":
        return AiohttpClient(settings)
    if kind == "httpx20":
        count = max(1, -(-settings.tasks // POOL_SIZE))
        return HttpxClients(settings, count, POOL_SIZE)
    if kind == "httpx200":
        return HttpxClients(settings, 1, settings.tasks)
    if kind == "orgapool":
        return RuntimeClient(settings)
    raise ValueError(f"unknown HTTP client {kind!r}: one of {', '.join(CLIENTS)}")


# -- plain asyncio ------------------------------------------------------------------------


async def plain_run(chat: Chat, settings: PeerSettings, index: int, marker: str) -> None:
    """One agent loop: call the model, run its tool calls, until it answers."""
    messages = initial_messages(marker)
    for _ in range(settings.iterations + 1):
        message = await chat(index, messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return
        messages.extend(run_tool(call, settings.workspace) for call in calls)
    raise RuntimeError(f"{marker}: no final answer after {settings.iterations} calls")


# -- LangGraph ----------------------------------------------------------------------------


class AgentState(TypedDict):
    """The graph's state: the conversation, appended to by each node, and the run's index."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    index: int


def langgraph_runner(chat: Chat, settings: PeerSettings) -> Callable[[int, str], Awaitable[None]]:
    """A function running one agent loop in a compiled two-node graph with ``InMemorySaver``."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    async def model(state: AgentState) -> dict[str, Any]:
        return {"messages": [await chat(state["index"], state["messages"])]}

    async def tools(state: AgentState) -> dict[str, Any]:
        calls = state["messages"][-1].get("tool_calls") or []
        return {"messages": [run_tool(call, settings.workspace) for call in calls]}

    def route(state: AgentState) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    graph = StateGraph(AgentState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    compiled = graph.compile(checkpointer=InMemorySaver())

    async def run(index: int, marker: str) -> None:
        config: Any = {
            "configurable": {"thread_id": marker},
            "recursion_limit": 2 * settings.iterations + 5,
        }
        start = {"messages": initial_messages(marker), "index": index}
        state = await compiled.ainvoke(start, config)
        if state["messages"][-1].get("tool_calls"):
            raise RuntimeError(f"{marker}: the graph stopped before the final answer")

    return run


# -- running ------------------------------------------------------------------------------


def split_peer(peer: str) -> tuple[str, str]:
    """``asyncio-aiohttp`` -> (``asyncio``, ``aiohttp``)."""
    loop, _, client = peer.partition("-")
    if loop not in LOOPS or client not in CLIENTS:
        raise ValueError(
            f"unknown peer {peer!r}: LOOP-CLIENT with LOOP one of {', '.join(LOOPS)} and "
            f"CLIENT one of {', '.join(CLIENTS)}"
        )
    return loop, client


async def run_peer(
    peer: str, settings: PeerSettings, go_file: Path | None = None
) -> dict[str, Any]:
    """One warm-up run, then (once ``go_file`` exists, when given) ``settings.tasks`` runs at
    once; what the benchmark reads back."""
    loop, kind = split_peer(peer)
    client = make_client(kind, settings)
    try:
        one: Callable[[int, str], Awaitable[None]] = (
            langgraph_runner(client.chat, settings)
            if loop == "langgraph"
            else functools.partial(plain_run, client.chat, settings)
        )
        await asyncio.wait_for(one(0, task_marker(f"{settings.run_id}-warmup")), 120)
        if go_file is not None:
            # The benchmark zeroes the model server's counts, then lets the batch start.
            print("warmed up", flush=True)
            while not go_file.exists():
                await asyncio.sleep(0.02)
        markers = [task_marker(f"{settings.run_id}-{n}") for n in range(settings.tasks)]
        cpu_before = time.process_time()
        started = time.time()
        runs = [asyncio.ensure_future(one(n, m)) for n, m in enumerate(markers)]
        done, pending = await asyncio.wait(runs, timeout=settings.timeout_s)
        finished = time.time()
        cpu_s = time.process_time() - cpu_before
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await client.aclose()
    errors = [repr(r.exception()) for r in done if r.exception() is not None]
    return {
        "peer": peer,
        "started": started,
        "finished": finished,
        "completed": len(done) - len(errors),
        "failed": len(errors),
        "unfinished": len(pending),
        "errors": errors[:ERRORS_KEPT],
        "cpu_s": cpu_s,
    }


def peer_missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here (a library not installed), or None."""
    loop, client = split_peer(peer)
    needed = [m for m in (loop, client) if m in ("langgraph", "aiohttp")]
    for module in needed:
        try:
            __import__(module)
        except ImportError as exc:
            return (
                f"{module} is not installed ({exc}); install the extra: pip install -e '.[bench]'"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m bench.slow_model_peers PEER ...``; prints one JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("peer", help=f"LOOP-CLIENT: {'|'.join(LOOPS)} - {'|'.join(CLIENTS)}")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="bench-key")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--run-id", default="peer")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for all runs")
    parser.add_argument(
        "--go-file", type=Path, help="after the warm-up, print 'warmed up' and wait for this file"
    )
    args = parser.parse_args(argv)
    missing = peer_missing(args.peer)
    if missing is not None:
        print(json.dumps({"peer": args.peer, "unavailable": missing}), flush=True)
        return 0
    settings = PeerSettings(
        base_url=args.base_url.rstrip("/"),
        api_key=args.api_key,
        model=args.model,
        tasks=args.tasks,
        iterations=args.iterations,
        workspace=args.workspace,
        run_id=args.run_id,
        timeout_s=args.timeout,
    )
    print(json.dumps(run_on_loop(run_peer(args.peer, settings, args.go_file))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
