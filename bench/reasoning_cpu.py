"""The reasoning worker's own CPU and Python work per model call, without Celery's consumer.

``bench/slow_model_bench.py`` measures the reasoning process whole (Celery's consumer and
tracer, the event loop, the file reads' threads) on a machine it shares with every other
process of the runtime: its figures move with the load. This benchmark runs, in this process,
the part of a call that is the worker's own: the task body Celery's pool awaits on the
worker's event loop (:func:`workers.tasks.handle`: the request's validation, the model call
over HTTP, the gate, the inline ``file_read``, the writes of the start and of the
observation), on the worker's own services (:func:`workers.tasks.services` of an app made by
:func:`orga.celery.create_app`), for the requests a real coordinator dispatches. The workload
is the slow-model benchmark's (``--tasks`` runs of ``--iterations`` model calls, one
``file_read`` a turn), against its fake model server, in a process of its own, at zero
latency; a private ``redis-server``. Each turn: the coordinator (in this process, not
measured) applies the last answers and pushes the next requests onto the reasoning queue
(inline dispatch); the benchmark takes them off and the worker's loop runs them all at once.

Measured over the worker's part only:

- CPU per model call (``time.process_time``: the loop's thread and the file reads' threads;
  the fake model server is another process), after one untimed warm-up run;
- with ``--count-calls``, one more run, untimed: the Python frames entered and the C functions
  called per model call on the loop's thread (``bench.coordinator_cpu.CallCounter``), a
  measure of the work that the machine's load moves far less than the CPU (a few per cent: the
  writes of calls that run together are batched, and the profile slows the run); compare
  counts of the same plan only.

Not measured: Celery's consumer (fetching and decoding the message, the ``task-received``
event), its tracer (the ack, ``task-succeeded``), and the hand-offs between those threads.

Run: ``.venv/bin/python bench/reasoning_cpu.py`` (``--tasks N``, ``--iterations N``,
``--repeats N``, ``--count-calls``). Prints ``RESULT reasoning_cpu_ms_per_call <ms>`` (the
median) and, counted, ``RESULT reasoning_python_frames_per_call <n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis

from bench.coordinator_cpu import CallCounter, started
from bench.slow_model_bench import API_KEY, MODEL, ModelServer, make_workspace, task_spec
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.settings import OrgaSettings
from workers.runtime import ProcessServices
from workers.tasks import close_services, handle, services

ROUNDS = 1000
"""Reads of the observations after which a turn's answers must all be applied."""


@dataclass(frozen=True)
class Plan:
    tasks: int = 200
    iterations: int = 5
    repeats: int = 3


def payloads(messages: Sequence[bytes]) -> list[str]:
    """The single argument of each Celery message on the reasoning queue (kombu's envelope,
    its base64 body, Celery's ``[args, kwargs, embed]``)."""
    found = []
    for raw in messages:
        envelope = json.loads(raw)
        body = base64.b64decode(envelope["body"])
        args, _kwargs, _embed = json.loads(body)
        found.append(args[0])
    return found


async def take_queued(redis: Redis) -> list[str]:
    """Every request waiting on the reasoning queue, taken off it (oldest first)."""
    pipe = redis.pipeline(transaction=True)
    pipe.lrange(keys.reasoning_queue, 0, -1)
    pipe.delete(keys.reasoning_queue)
    messages, _ = await pipe.execute()
    return payloads(list(reversed(messages)))


def worker_turn(
    services: ProcessServices, requests: Sequence[str], counter: CallCounter | None
) -> float:
    """Run ``requests`` at once on the worker's loop; the CPU seconds it took."""

    async def all_at_once() -> None:
        with counter if counter is not None else contextlib.nullcontext():
            await asyncio.gather(*(handle(keys.reason_task_name, p) for p in requests))

    began = time.process_time()
    services.run(all_at_once())
    return time.process_time() - began


async def one_run(
    url: str, plan: Plan, root: Path, services: ProcessServices, counter: CallCounter | None = None
) -> tuple[float, int]:
    """CPU seconds of the worker's part and model calls of one run."""
    workspace = make_workspace(root)
    settings = OrgaSettings(redis_url=url, workspace_root=str(root))
    redis = Redis.from_url(url)
    marker = f"{time.monotonic_ns()}"
    texts = [json.dumps(task_spec(f"{marker}-{n}", workspace)) for n in range(plan.tasks)]
    coordinator, publisher, ids = await started(redis, settings, texts)
    assert coordinator.store.inline is not None, "the benchmark reads the requests off the queue"
    cpu, calls = 0.0, 0
    for _turn in range(plan.iterations):
        requests = await take_queued(redis)
        if not requests:
            break
        cpu += await asyncio.to_thread(worker_turn, services, requests, counter)
        calls += len(requests)
        for _read in range(ROUNDS):  # the coordinator applies (and deletes) them, unmeasured
            if not await redis.xlen(keys.observations_stream(0)):
                break
            await coordinator._observations_once()
        else:
            raise RuntimeError(f"the coordinator left answers unapplied after {ROUNDS} reads")
    for task_id in ids:
        record = await coordinator.store.load(task_id)
        assert record is not None, f"task {task_id} is gone"
        assert record.terminal, f"task {task_id} did not end: {record.status}"
    publisher.close()
    await redis.aclose()
    return cpu, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=Plan.tasks)
    parser.add_argument("--iterations", type=int, default=Plan.iterations)
    parser.add_argument("--repeats", type=int, default=Plan.repeats)
    parser.add_argument(
        "--count-calls",
        action="store_true",
        help="one more run, untimed, counting the Python and C calls per model call",
    )
    args = parser.parse_args()
    plan = Plan(args.tasks, args.iterations, args.repeats)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orga-reasoncpu-")))
        server = EmbeddedRedis(directory=root / "redis")
        stack.callback(server.close)  # registered before it starts: a failed start is stopped too
        server.start()
        model = ModelServer.start(root, 0.0, 0.0, plan.iterations)
        stack.callback(model.stop)
        os.environ.update(
            ORGA_REDIS_URL=server.url,
            ORGA_WORKSPACE_ROOT=str(root),
            ORGA_PROVIDER="openai",
            ORGA_BASE_URL=model.url,
            ORGA_API_KEY=API_KEY,
            ORGA_MODEL=MODEL,
        )
        from orga.celery import create_app  # after the environment it reads is set

        runtime = services(create_app())
        stack.callback(close_services)
        asyncio.run(one_run(server.url, plan, root, runtime))  # warm-up: connections, imports
        results = [
            asyncio.run(one_run(server.url, plan, root, runtime)) for _ in range(plan.repeats)
        ]
        counter = CallCounter() if args.count_calls else None
        counted = 0
        if counter is not None:
            counted = asyncio.run(one_run(server.url, plan, root, runtime, counter))[1]
    per_call = [1000 * cpu / calls for cpu, calls in results]
    print(f"{plan.tasks} tasks x {plan.iterations} model calls at zero latency")
    print("CPU ms per call, each run: " + ", ".join(f"{v:.3f}" for v in per_call))
    print(f"RESULT reasoning_cpu_ms_per_call {statistics.median(per_call):.3f}")
    print(f"RESULT reasoning_cpu_ms_per_call_best {min(per_call):.3f}")
    if counter is not None and counted:
        print(
            f"Python frames entered per call {counter.python / counted:.0f}, "
            f"C functions called per call {counter.native / counted:.0f} (a counted run)"
        )
        print(f"RESULT reasoning_python_frames_per_call {counter.python / counted:.0f}")


if __name__ == "__main__":
    main()
