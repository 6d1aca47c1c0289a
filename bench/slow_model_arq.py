"""The distributed peer of the slow-model benchmark: the same agent loop as arq jobs (issue 27).

arq (https://arq-docs.helpmanual.io) is an asyncio job queue on Redis: a worker process pulls
jobs from a sorted set, polling it every ``poll_delay`` (0.5 s by default) and runs up to
``max_jobs`` at once on its event loop. Here **one arq job is one iteration**: it calls the
model (one ``aiohttp`` session per worker process, the cheapest client measured), runs the
``file_read`` call the model asked for, and enqueues the run's next iteration with the
conversation so far as its argument; the iteration that gets the final answer pushes the run's
marker onto a list the submitter waits on. A competent arq user's set-up: ``max_jobs`` as large
as the calls each process should hold in flight (the runtime's ``ORGA_REASONING_CONCURRENCY``),
everything else arq's default (its job serializer, results kept an hour).

Two commands, run by ``bench/slow_model_bench.py`` as processes of their own::

    python -m bench.slow_model_arq worker --redis-url URL --base-url URL --workspace DIR \\
        --max-jobs 200 --poll-delay 0.5
    python -m bench.slow_model_arq submit --redis-url URL --tasks 200 --run-id ID --timeout 60

``submit`` enqueues ``--tasks`` runs at once, waits until each has answered (or the timeout)
and prints one JSON line as ``bench/slow_model_peers.py`` does (``cpu_s`` is the submitter's
own, which the benchmark does not count: it reads the workers' and Redis's CPU itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fake_model_server import task_marker
from bench.slow_model_peers import (
    AiohttpClient,
    PeerSettings,
    initial_messages,
    run_tool,
)
from shared.aio import new_event_loop

__all__ = ["DONE_KEY", "arq_missing", "main"]

DONE_KEY = "bench:arq:done"
"""The list each run's final iteration pushes its marker onto."""
JOB = "iterate"


def arq_missing() -> str | None:
    """Why the arq peer cannot run here, or None."""
    for module in ("arq", "aiohttp"):
        try:
            __import__(module)
        except ImportError as exc:
            return (
                f"{module} is not installed ({exc}); install the extra: pip install -e '.[bench]'"
            )
    return None


async def iterate(ctx: dict[str, Any], index: int, marker: str, messages: list[Any]) -> None:
    """One iteration of run ``marker``: a model call, its tool call, the next iteration."""
    settings: PeerSettings = ctx["settings"]
    message = await ctx["client"].chat(index, messages)
    messages.append(message)
    calls = message.get("tool_calls") or []
    if not calls:
        await ctx["redis"].rpush(DONE_KEY, marker)
        return
    messages.extend(run_tool(call, settings.workspace) for call in calls)
    await ctx["redis"].enqueue_job(JOB, index, marker, messages)


def worker(args: argparse.Namespace) -> int:
    """Run one arq worker until it is stopped (SIGTERM/SIGINT, handled by arq)."""
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    settings = PeerSettings(
        base_url=args.base_url.rstrip("/"),
        api_key=args.api_key,
        model=args.model,
        tasks=args.max_jobs,
        iterations=0,
        workspace=args.workspace,
        run_id="",
        timeout_s=0.0,
    )

    async def startup(ctx: dict[str, Any]) -> None:
        ctx["settings"] = settings
        ctx["client"] = AiohttpClient(settings)
        # arq logs a line per job at INFO once its CLI configures logging; unconfigured (as
        # here) only warnings reach stderr, like the runtime's workers at WARNING.
        print("arq worker ready", flush=True)

    async def shutdown(ctx: dict[str, Any]) -> None:
        await ctx["client"].aclose()

    asyncio.set_event_loop(new_event_loop())
    Worker(
        functions=[func(iterate, name=JOB)],
        redis_settings=RedisSettings.from_dsn(args.redis_url),
        max_jobs=args.max_jobs,
        poll_delay=args.poll_delay,
        on_startup=startup,
        on_shutdown=shutdown,
    ).run()
    return 0


async def submit(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue ``--tasks`` runs at once and wait for their final answers."""
    from arq import create_pool
    from arq.connections import RedisSettings

    redis = await create_pool(RedisSettings.from_dsn(args.redis_url))
    try:
        await redis.delete(DONE_KEY)
        markers = [task_marker(f"{args.run_id}-{n}") for n in range(args.tasks)]
        cpu_before = time.process_time()
        started = time.time()
        for n, marker in enumerate(markers):
            await redis.enqueue_job(JOB, n, marker, initial_messages(marker))
        deadline = time.monotonic() + args.timeout
        done = 0
        while time.monotonic() < deadline:
            done = int(await redis.llen(DONE_KEY))
            if done >= len(markers):
                break
            await asyncio.sleep(0.05)
        finished = time.time()
    finally:
        await redis.aclose()
    return {
        "peer": "arq",
        "started": started,
        "finished": finished,
        "completed": done,
        "failed": 0,
        "unfinished": args.tasks - done,
        "errors": [],
        "cpu_s": time.process_time() - cpu_before,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m bench.slow_model_arq worker|submit ...``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("worker", help="one arq worker process")
    run.add_argument("--redis-url", required=True)
    run.add_argument("--base-url", required=True)
    run.add_argument("--api-key", default="bench-key")
    run.add_argument("--model", default="fake-model")
    run.add_argument("--workspace", type=Path, required=True)
    run.add_argument("--max-jobs", type=int, default=200)
    run.add_argument("--poll-delay", type=float, default=0.5)
    send = commands.add_parser("submit", help="enqueue runs and wait for them")
    send.add_argument("--redis-url", required=True)
    send.add_argument("--tasks", type=int, default=200)
    send.add_argument("--run-id", default="arq")
    send.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    missing = arq_missing()
    if missing is not None:
        print(json.dumps({"peer": "arq", "unavailable": missing}), flush=True)
        return 0
    if args.command == "worker":
        return worker(args)
    loop = new_event_loop()
    try:
        print(json.dumps(loop.run_until_complete(submit(args))), flush=True)
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
