"""The peers of the slow-model benchmark: the same agent loop in LangGraph and in plain asyncio.

Run by ``bench/slow_model_bench.py``, each in a process of its own so that its memory can be
measured alone::

    python -m bench.slow_model_peers langgraph --base-url http://127.0.0.1:PORT/v1 \\
        --tasks 200 --iterations 5 --workspace DIR --run-id ID

Both run ``--tasks`` agent loops at once on one event loop, against the fake model server
(``bench/fake_model_server.py``), with one shared ``httpx.AsyncClient`` whose pool holds a
connection per loop. Each loop sends the chat completions request the runtime sends (model,
messages, the ``file_read`` tool), runs the tool call the model asks for (one line of
``note.txt`` in ``--workspace``), appends its result, and stops at the model's final answer:
``--iterations`` model calls per loop.

- ``langgraph``: a two-node ``StateGraph`` (``model`` → ``tools`` → ``model`` … until the model
  answers) compiled with LangGraph's in-memory checkpointer (``InMemorySaver``), one thread id
  per run, ``ainvoke`` for each;
- ``asyncio``: a plain ``for`` loop per run.

Prints one JSON line: ``peer``, ``started`` and ``finished`` (wall clock), ``completed``,
``failed``, the first ``errors``, the CPU seconds the process used (``cpu_s``), and
``unavailable`` when LangGraph is not installed.
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
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.fake_model_server import task_marker

__all__ = ["FILE_READ_TOOL", "PeerSettings", "initial_messages", "main", "run_peer"]

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


async def chat(
    client: httpx.AsyncClient, settings: PeerSettings, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    """One chat completions call; the reply's ``choices[0].message``."""
    response = await client.post(
        f"{settings.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {settings.api_key}"},
        json={
            "model": settings.model,
            "messages": messages,
            "tools": [FILE_READ_TOOL],
            "max_tokens": 1024,
            "temperature": 0.3,
        },
    )
    response.raise_for_status()
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def run_tool(call: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """The ``tool`` message answering one ``file_read`` call."""
    arguments = json.loads(call["function"]["arguments"] or "{}")
    lines = (workspace / str(arguments["path"])).read_text().splitlines()
    start = int(arguments.get("start_line", 1))
    end = int(arguments.get("end_line", len(lines)))
    content = "\n".join(lines[start - 1 : end])
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


# -- plain asyncio ------------------------------------------------------------------------


async def plain_run(client: httpx.AsyncClient, settings: PeerSettings, marker: str) -> None:
    """One agent loop: call the model, run its tool calls, until it answers."""
    messages = initial_messages(marker)
    for _ in range(settings.iterations + 1):
        message = await chat(client, settings, messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return
        messages.extend(run_tool(call, settings.workspace) for call in calls)
    raise RuntimeError(f"{marker}: no final answer after {settings.iterations} calls")


# -- LangGraph ----------------------------------------------------------------------------


class AgentState(TypedDict):
    """The graph's state: the conversation, appended to by each node."""

    messages: Annotated[list[dict[str, Any]], operator.add]


def langgraph_runner(
    client: httpx.AsyncClient, settings: PeerSettings
) -> Callable[[str], Awaitable[None]]:
    """A function running one agent loop in a compiled two-node graph with ``InMemorySaver``."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    async def model(state: AgentState) -> dict[str, Any]:
        return {"messages": [await chat(client, settings, state["messages"])]}

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

    async def run(marker: str) -> None:
        config: Any = {
            "configurable": {"thread_id": marker},
            "recursion_limit": 2 * settings.iterations + 5,
        }
        state = await compiled.ainvoke({"messages": initial_messages(marker)}, config)
        if state["messages"][-1].get("tool_calls"):
            raise RuntimeError(f"{marker}: the graph stopped before the final answer")

    return run


# -- running ------------------------------------------------------------------------------


async def run_peer(peer: str, settings: PeerSettings) -> dict[str, Any]:
    """``settings.tasks`` runs at once; what the benchmark reads back."""
    limits = httpx.Limits(max_connections=settings.tasks, max_keepalive_connections=settings.tasks)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        one: Callable[[str], Awaitable[None]] = (
            langgraph_runner(client, settings)
            if peer == "langgraph"
            else functools.partial(plain_run, client, settings)
        )
        markers = [task_marker(f"{settings.run_id}-{n}") for n in range(settings.tasks)]
        started = time.time()
        runs = [asyncio.ensure_future(one(marker)) for marker in markers]
        done, pending = await asyncio.wait(runs, timeout=settings.timeout_s)
        finished = time.time()
        for run in pending:
            run.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    errors = [repr(r.exception()) for r in done if r.exception() is not None]
    return {
        "peer": peer,
        "started": started,
        "finished": finished,
        "completed": len(done) - len(errors),
        "failed": len(errors),
        "unfinished": len(pending),
        "errors": errors[:ERRORS_KEPT],
        "cpu_s": time.process_time(),
    }


def langgraph_missing() -> str | None:
    """Why LangGraph cannot run here, or None."""
    try:
        import langgraph.graph  # noqa: F401
    except ImportError as exc:
        return f"langgraph is not installed ({exc}); install the extra: pip install -e '.[bench]'"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m bench.slow_model_peers PEER ...``; prints one JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("peer", choices=["langgraph", "asyncio"])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="bench-key")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--run-id", default="peer")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for all runs")
    args = parser.parse_args(argv)
    missing = langgraph_missing() if args.peer == "langgraph" else None
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
    print(json.dumps(asyncio.run(run_peer(args.peer, settings))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
