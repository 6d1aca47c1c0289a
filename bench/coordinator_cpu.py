"""The coordinator's own CPU and Redis commands per model call, without the rest of the stack.

``bench/slow_model_bench.py`` measures every process of the runtime at once, on a machine it
shares with them: the coordinator's share moves with the load. This benchmark runs the
coordinator's work alone, in this process, against a private ``redis-server``: ``--tasks``
tasks of ``--iterations`` model calls each (the slow-model benchmark's workload: one
``file_read`` call per turn, run inline by the reasoning worker, then a final answer), with
the worker's answers written straight to the observations stream in reads of ``--batch``
entries. Measured over the timed part (the intake and the starts are left out):

- CPU per model call of the coordinator's work: the observations' reads, decisions and
  commits, and the relay's send of what the commits hand it (a real ``CeleryPublisher`` to
  the same Redis) and removal, one round of its commits' loop per read (the workers' outbox,
  which this workload never writes, is not read) (``time.process_time`` around those calls
  only; the answers are built outside it);
- Redis commands per model call caused by that work (``INFO commandstats``, commands run by
  scripts included, the benchmark's own ``XADD``s of the answers left out);
- the same by command, to see where they go.

Run: ``.venv/bin/python bench/coordinator_cpu.py`` (``--quick``: 50 tasks, ``--repeats N``:
best and median of N timed runs; ``--count-calls``: one more run, untimed, that counts the
Python frames entered and C functions called per model call, a measure of the coordinator's
work that the machine's load moves far less than the CPU: a few per cent, as the applied
observations are deleted on a timer and the profile slows the run; compare counts of the same
plan only). Prints ``RESULT coordinator_cpu_ms_per_call <ms>`` (the median),
``RESULT coordinator_redis_commands_per_call <n>`` and, counted,
``RESULT coordinator_python_frames_per_call <n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis

from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator
from coordinator.state import TaskRecord
from orga.embedded import coordinator_settings
from orga.embedded_redis import EmbeddedRedis
from orga.redis_client import RedisClients
from shared import keys
from shared.actions import Observation, ToolCallAction
from shared.conversation import ConversationMessage
from shared.inference import ToolCall, Usage
from shared.protocol import ReasonedMessage, ToolObservedMessage, encode_entry
from shared.settings import OrgaSettings

NOTE_LINES = 50


@dataclass(frozen=True)
class Plan:
    tasks: int = 200
    iterations: int = 5
    batch: int = 20
    repeats: int = 3


def task_text(n: int, workspace: str) -> str:
    return json.dumps(
        {
            "goal": f"Coordinator benchmark {n}: read note.txt one line per turn, then answer.",
            "steps": [
                {"id": "read", "instruction": "Read note.txt, one line per turn, then answer."}
            ],
            "tools": ["file_read"],
            "workspace": workspace,
        }
    )


def answer(record: TaskRecord, turn: int, last: bool) -> ReasonedMessage:
    """What the reasoning worker sends for the record's awaited model call: a ``file_read`` of
    line ``turn`` run inline, or (``last``) the final answer."""
    awaiting = record.awaiting
    assert awaiting is not None, f"task {record.task_id} awaits nothing"
    fence = awaiting.fence
    usage = Usage(prompt_tokens=380 + 20 * turn, completion_tokens=12, total_tokens=392 + 20 * turn)
    if last:
        text = f"The note has {NOTE_LINES} lines; nothing to see."
        return ReasonedMessage(
            fence=fence,
            new_messages=[ConversationMessage(role="assistant", content=text)],
            usage=usage,
            terminal_output=text,
            duration_ms=1000.0,
        )
    call_id = f"call_{record.task_id[:8]}_{turn}"
    arguments = json.dumps({"path": "note.txt", "start_line": turn, "end_line": turn})
    call = ToolCallAction(call_id=call_id, name="file_read", arguments=arguments)
    content = f"line {turn}: nothing to see here\n[lines {turn}-{turn} of {NOTE_LINES}]"
    observation = Observation(
        source="file_read",
        content=content,
        call_id=call_id,
        metadata={
            "kind": "read",
            "path": "note.txt",
            "content_hash": f"{turn:064x}",
            "total_lines": str(NOTE_LINES),
            "tool_name": "file_read",
        },
    )
    return ReasonedMessage(
        fence=fence,
        new_messages=[
            ConversationMessage(
                role="assistant",
                content="",
                tool_calls=[ToolCall(id=call_id, name="file_read", arguments=arguments)],
            )
        ],
        actions=[call],
        approved_calls=[call],
        usage=usage,
        acted=[
            ToolObservedMessage(
                fence=fence.for_call(call_id), observation=observation, duration_ms=25.0
            )
        ],
        duration_ms=1000.0,
    )


async def commandstats(redis: Redis) -> Counter[str]:
    info = await redis.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()})


class CallCounter:
    """Python frames entered (a coroutine's each resumption counted) and C functions called in
    this thread while on (``sys.setprofile``, which replaces any profiler already on and sees
    no other thread): the interpreter's work, counted, not timed. "C functions" are the
    builtins and methods Python calls by name; C work reached through a type's slots (``d[k]``,
    ``==``, iteration) is not an event. The profile hook slows what it counts many times over:
    a counted run's CPU is not measured, and code that looks at the clock may do a little more
    or less work in it."""

    def __init__(self) -> None:
        self.python = 0
        self.native = 0

    def _event(self, _frame: object, event: str, _arg: object) -> None:
        if event == "call":
            self.python += 1
        elif event == "c_call":
            self.native += 1

    def __enter__(self) -> CallCounter:
        sys.setprofile(self._event)
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)


async def started(
    redis: Redis, settings: OrgaSettings, texts: Sequence[str]
) -> tuple[Coordinator, CeleryPublisher, list[str]]:
    """A coordinator on ``redis`` (emptied first) with a task taken in and started for each of
    ``texts``; its publisher (to close) and the tasks' ids."""
    await redis.flushall()
    publisher = CeleryPublisher.from_settings(settings)
    coordinator = Coordinator(
        redis, publisher=publisher, settings=coordinator_settings(settings), name="bench"
    )
    await coordinator._ensure_groups()
    for text in texts:
        await redis.xadd(keys.intake_stream(0), {"task": text})
    ids = await coordinator.store.active_task_ids()
    while len(ids) < len(texts):
        await coordinator._intake_once()
        ids = await coordinator.store.active_task_ids()
    return coordinator, publisher, ids


async def one_run(
    url: str, plan: Plan, workspace: str, counter: CallCounter | None = None
) -> tuple[float, Counter[str], int]:
    """CPU seconds, Redis commands by name and model calls of one timed run (with ``counter``:
    the coordinator's work counted there instead, and its CPU not meaningful)."""
    settings = OrgaSettings(redis_url=url, workspace_root=workspace)
    redis = RedisClients(url).asyncio()  # the coordinator's client, as orga coordinator builds it
    feeder = Redis.from_url(url)
    texts = [task_text(n, workspace) for n in range(plan.tasks)]
    coordinator, publisher, ids = await started(redis, settings, texts)
    relay = coordinator.relay
    assert relay is not None
    relay.block_ms = 1
    while await relay.relay_once():
        pass
    cpu = 0.0
    calls = 0
    before = await commandstats(feeder)
    fed = 0
    for turn in range(1, plan.iterations + 1):
        last = turn == plan.iterations
        for start in range(0, len(ids), plan.batch):
            pipe = feeder.pipeline(transaction=False)
            for task_id in ids[start : start + plan.batch]:
                record = coordinator.store.peek_kept(task_id)
                assert record is not None, f"task {task_id} is not kept"
                pipe.xadd(keys.observations_stream(0), encode_entry(answer(record, turn, last)))  # type: ignore[arg-type]
                fed += 1
            await pipe.execute()
            began = time.process_time()
            with counter if counter is not None else contextlib.nullcontext():
                await coordinator._observations_once()
                while await relay.commits_round():  # as its loop in ``run``: no read
                    pass
            cpu += time.process_time() - began
            calls += len(ids[start : start + plan.batch])
    after = await commandstats(feeder)
    spent = after - before
    spent["xadd"] -= fed  # the answers
    spent["info"] = 0
    for task_id in ids:
        record = await coordinator.store.load(task_id)
        assert record is not None, f"task {task_id} is gone"
        assert record.terminal, f"task {task_id} did not end: {record.status}"
    publisher.close()
    await redis.aclose()
    await feeder.aclose()
    return cpu, +spent, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=Plan.tasks)
    parser.add_argument("--iterations", type=int, default=Plan.iterations)
    parser.add_argument("--batch", type=int, default=Plan.batch, help="answers per read")
    parser.add_argument("--repeats", type=int, default=Plan.repeats)
    parser.add_argument("--quick", action="store_true", help="50 tasks, one run")
    parser.add_argument(
        "--count-calls",
        action="store_true",
        help="one more run, untimed, counting the Python and C calls per model call",
    )
    args = parser.parse_args()
    plan = Plan(args.tasks, args.iterations, args.batch, args.repeats)
    if args.quick:
        plan = Plan(50, plan.iterations, plan.batch, 1)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        run = asyncio.run
    with tempfile.TemporaryDirectory(prefix="orga-coordcpu-") as root:
        workspace = str(Path(root) / "ws")
        Path(workspace).mkdir()
        server = EmbeddedRedis(directory=Path(root) / "redis")
        server.start()
        try:
            results = [run(one_run(server.url, plan, workspace)) for _ in range(plan.repeats)]
            counter = CallCounter() if args.count_calls else None
            if counter is not None:
                counted = run(one_run(server.url, plan, workspace, counter))[2]
        finally:
            server.close()
    per_call = [1000 * cpu / calls for cpu, _spent, calls in results]
    _cpu, spent, calls = results[-1]
    total = sum(spent.values())
    print(f"{plan.tasks} tasks x {plan.iterations} model calls, reads of {plan.batch}")
    print("CPU ms per call, each run: " + ", ".join(f"{v:.3f}" for v in per_call))
    print("Redis commands per call (last run), by command:")
    for name, count in spent.most_common():
        print(f"  {name:18s} {count / calls:6.2f}")
    print(f"RESULT coordinator_cpu_ms_per_call {statistics.median(per_call):.3f}")
    print(f"RESULT coordinator_cpu_ms_per_call_best {min(per_call):.3f}")
    print(f"RESULT coordinator_redis_commands_per_call {total / calls:.2f}")
    if counter is not None:
        print(
            f"Python frames entered per call {counter.python / counted:.0f}, "
            f"C functions called per call {counter.native / counted:.0f} (a counted run)"
        )
        print(f"RESULT coordinator_python_frames_per_call {counter.python / counted:.0f}")


if __name__ == "__main__":
    main()
