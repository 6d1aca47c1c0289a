"""The runtime's orchestration cost, next to the bare Celery substrate, measured in one run.

Run: ``.venv/bin/python bench/runtime_bench.py`` (``--quick`` for a smaller run; ``--help`` for
the sizes). Everything is real and runs on this machine: a private ``redis-server``, one Celery
worker (``celery -A bench.noop_worker worker -c 2``: the production configuration of
``orga.celery`` plus a no-op tool and a raw no-op task) and one coordinator (``python -m
orga.cli coordinator``, production settings). Tasks use the scripted provider (with a
fixed token usage per reply), the ``noop`` tool and the stagnation detector off, so that only
orchestration is timed. Method and results: ``docs/performance.md``.

Every figure is printed next to what it is compared with, measured in the same run, because the
machine is shared and noisy:

1. **Raw substrate**: a no-op Celery task round trip (send, run, result back through a result
   backend on the same Redis), sequentially; and no-op throughput, several threads sending at
   once, from the first send to the last result stored (the results' ``date_done``).
2. **Iteration latency**, for each ``tool_dispatch`` mode, of one task of many iterations, each
   calling the no-op tool once, from the coordinator's own journal timestamps (taken when it
   applies an observation): an iteration is ReasoningComplete(i) to ReasoningComplete(i+1). In
   ``queue`` mode that is two Celery round trips: the reasoning worker sends the tool call on
   to the tools queue itself (``ORGA_CHAIN_TOOLS``, on by default), the tool observation is
   applied, the coordinator dispatches the next reasoning; the tool leg is
   ToolsDispatched.duration (reasoned applied -> tool observation applied). In ``inline`` mode
   it is one (the reasoning worker runs the call). Target: iteration p50 <= 3 x raw p50.
3. **Throughput**, for each mode: concurrent tasks of 10 iterations submitted at once, from the
   first submission to the last terminal commit; iterations per second as a share of the raw
   no-op tasks per second. Target: >= 40 %. Beside it, the CPU-bound share: CPU per raw task
   over CPU per iteration, which other load on the machine disturbs much less.
4. **Pre-hydration** through the workers: ten references, each resolved by a tool that takes
   200 ms (``slow``), from the task's Started to its PreHydrationComplete journal entry.
5. **Scale**: thousands of one-iteration tasks queued at once; all must complete. Coordinator
   peak RSS (VmHWM), Redis memory per completed task, stream lengths and what stays in Redis.

A last table gives the CPU each process used per unit of work in each phase (from
``/proc/<pid>/stat``, the worker's pool processes included). The script prints PASS or FAIL for
each target and exits 0 either way (like ``tracker_cost.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import Celery

from bench.noop_tool import RAW_QUEUE, RAW_TASK_NAME, SLOW_TOOL_S
from coordinator.client import OrgaClient
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.events import (
    JournalEntry,
    PreHydrationComplete,
    ReasoningComplete,
    Started,
    ToolsDispatched,
)
from shared.settings import OrgaSettings, celery_config
from tests.integration.harness import Process

REPO = Path(__file__).resolve().parent.parent
ITERATION_TARGET_RATIO = 3.0
THROUGHPUT_TARGET_SHARE = 0.40
PREHYDRATION_REFERENCES = 10
PREHYDRATION_TARGET_RATIO = 1.5
"""Pre-hydration should take about one resolution, not the sum: below 1.5 x one."""
EDGE_ITERATIONS = 20
"""The first and the last this many iterations are also reported apart (the conversation, and
with it every payload, grows along the task)."""
POLL_WINDOW = 500
LATENCY_ROUNDS = 2
"""The latency tasks (one per mode) and the raw round trips run in this many rounds."""
DEAD_LETTER_MAXLEN = 100_000
"""What coordinator/service.py and workers/runtime.py trim orga:dead_letter to."""
KEPT_BOUND = {
    "orga:task:*": "deleted ORGA_RETENTION_S after the task ends",
    "orga:journal:*": "deleted with the task",
    "orga:tasks:index (zset)": "entry deleted with the task",
    "orga:lease:*": "expire after the lease TTL",
    "orga:tasks:deadlines (zset)": "active tasks only",
    "celery-task-meta-* (raw results)": "the benchmark's raw task only (expire after a day)",
}
TERMINAL = frozenset({"completed", "failed", "aborted"})
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
"""Fixed usage in every scripted reply, so the provider does not estimate tokens."""


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    raw_round_trips: int = 500
    raw_tasks: int = 5000
    raw_senders: int = 4
    latency_iterations: int = 100
    tasks: int = 200
    iterations_per_task: int = 10
    scale_tasks: int = 10_000
    worker_concurrency: int = 2

    @classmethod
    def quick(cls) -> Sizes:
        """A run of well under a minute, for a smoke test."""
        return cls(
            raw_round_trips=200,
            raw_tasks=1000,
            latency_iterations=60,
            tasks=50,
            scale_tasks=1000,
        )


# -- processes --------------------------------------------------------------------------------


class Child(Process):
    """A benchmark process: the integration harness's ``Process`` plus memory and CPU readings."""

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def status_kb(self, field_name: str) -> int:
        """A ``/proc/<pid>/status`` memory field (``VmHWM``, ``VmRSS``) in kB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1])
        raise RuntimeError(f"{field_name} not in /proc/{self.pid}/status")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of this process and its live children (pool processes)."""
        return sum(_cpu_of(pid) for pid in [self.pid, *self.children()])


_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_of(pid: int) -> float:
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class Stack:
    """A private Redis, one worker and one coordinator."""

    root: Path
    concurrency: int
    script_files: bool = True
    redis_server: EmbeddedRedis = field(default_factory=EmbeddedRedis)
    children: list[Child] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.redis_server.url

    @property
    def scripts(self) -> Path | None:
        """Where the tasks' scripted replies are written (read by the worker processes);
        None: the replies travel inside the tasks (``--replies-in-task``)."""
        return self.root / "scripts" if self.script_files else None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            ORGA_REDIS_URL=self.url,
            ORGA_WORKSPACE_ROOT=str(self.root / "workspaces"),
            ORGA_WORKER_CONCURRENCY=str(self.concurrency),
        )
        return env

    def start(self) -> Stack:
        self.redis_server.start()
        queues = f"{keys.reasoning_queue},{keys.tools_queue},{RAW_QUEUE}"
        worker = [
            sys.executable, "-m", "celery", "-A", "bench.noop_worker", "worker", "-Q", queues,
            "-c", str(self.concurrency), "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"bench-{os.getpid()}@%h",
        ]  # fmt: skip
        coordinator = [sys.executable, "-m", "orga.cli", "coordinator"]
        self.worker = self._spawn("worker", worker)
        self.coordinator = self._spawn("coordinator", coordinator)
        return self

    def _spawn(self, name: str, command: list[str]) -> Child:
        child = Child(name, command, self.env(), self.root / f"{name}.log").start()
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.redis_server.close()

    def describe(self) -> str:
        pids = {"redis": self.redis_server.pid, **{c.name: c.pid for c in self.children}}
        return f"{pids}, logs in {self.root}"

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited:\n{child.tail()}")


# -- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


@dataclass(frozen=True)
class Spread:
    """p50 and p99 of a sample, in milliseconds."""

    p50_ms: float
    p99_ms: float
    count: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread:
        ms = [s * 1000 for s in seconds]
        return cls(statistics.median(ms), percentile(ms, 99), len(ms))

    def text(self) -> str:
        return f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms (n={self.count})"


# -- 1. raw substrate -------------------------------------------------------------------------


def raw_client(url: str) -> Celery:
    """A Celery client configured like the coordinator's, plus a result backend on the same
    Redis."""
    app = Celery("bench-client")
    app.conf.update(celery_config(OrgaSettings(redis_url=url), url))
    app.conf.result_backend = url
    return app


def raw_round_trips(app: Celery, count: int) -> list[float]:
    """Sequential send, run, result back of the no-op task."""
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        app.send_task(RAW_TASK_NAME, queue=RAW_QUEUE).get(timeout=30)
        timings.append(time.perf_counter() - started)
    return timings


def raw_throughput(app: Celery, url: str, count: int, senders: int) -> float:
    """No-op tasks per second: ``count`` tasks sent by ``senders`` threads at once, from the
    first send to the last result stored (the result's own ``date_done``)."""
    ids = [uuid.uuid4().hex for _ in range(count)]
    chunks = [ids[i::senders] for i in range(senders)]

    def send(chunk: list[str]) -> None:
        for task_id in chunk:
            app.send_task(RAW_TASK_NAME, queue=RAW_QUEUE, task_id=task_id, ignore_result=False)

    started = time.time()
    threads = [threading.Thread(target=send, args=(c,)) for c in chunks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with redis.Redis.from_url(url) as client:
        done = _wait_for_results(client, ids)
    return count / (max(done) - started)


def _wait_for_results(client: redis.Redis, ids: list[str], timeout_s: float = 300) -> list[float]:
    deadline = time.monotonic() + timeout_s
    found: dict[str, float] = {}
    while len(found) < len(ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(found)} of {len(ids)} raw results after {timeout_s}s")
        missing = [i for i in ids if i not in found]
        values = client.mget([f"celery-task-meta-{i}" for i in missing])
        for task_id, raw in zip(missing, values, strict=True):
            if raw is not None:
                stamp = datetime.fromisoformat(json.loads(raw)["date_done"])
                found[task_id] = stamp.replace(tzinfo=stamp.tzinfo or UTC).timestamp()
        time.sleep(0.1)
    return list(found.values())


# -- tasks ------------------------------------------------------------------------------------


def iteration_task(
    iterations: int, dispatch: str = "queue", scripts: Path | None = None
) -> dict[str, Any]:
    """A one-step task of ``iterations`` iterations: each calls ``noop`` once, the last answers.

    ``dispatch`` is the task's ``tool_dispatch``: ``queue`` runs each tool call as its own
    Celery task (two Celery tasks per iteration), ``inline`` in the reasoning task (one). With
    ``scripts``, the model's replies are a JSON file there (``provider.script``, as ``make run``
    does), which each worker process parses once; without, they travel inside the task, and so
    inside every reasoning request (about 100 bytes per reply).
    """
    replies: list[Any] = [
        {"tool_calls": [{"name": "noop", "arguments": {"n": n}}], "usage": USAGE}
        for n in range(iterations - 1)
    ]
    replies.append({"text": "done", "usage": USAGE})
    provider: dict[str, Any] = {"kind": "scripted", "replies": replies}
    if scripts is not None:
        path = scripts / f"noop-{iterations}.json"
        if not path.exists():
            scripts.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"replies": replies}))
        provider = {"kind": "scripted", "script": str(path)}
    return {
        "goal": "benchmark",
        "tool_dispatch": dispatch,
        "provider": provider,
        "steps": [{"id": "bench", "instruction": "call noop until told otherwise"}],
        "stagnation": {"enabled": False},
        "limits": {"max_iterations": iterations},
    }


def wait_all(client: OrgaClient, ids: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Poll until every task is terminal; their statuses.

    Polling is cheap on purpose (the benchmark shares the CPUs with what it measures): every
    0.2 s, one pipelined ``HGET status`` for at most ``POLL_WINDOW`` of the oldest unfinished
    tasks (they finish roughly in submission order).
    """
    deadline = time.monotonic() + timeout_s
    statuses: dict[str, str] = {}
    pending = list(ids)
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} of {len(ids)} tasks not finished in {timeout_s}s")
        window = pending[:POLL_WINDOW]
        pipe = client.redis.pipeline(transaction=False)
        for task_id in window:
            pipe.hget(keys.task_key(task_id, 0), "status")
        for task_id, status in zip(window, pipe.execute(), strict=True):
            if status in TERMINAL:
                statuses[task_id] = str(status)
        pending = [i for i in pending if i not in statuses]
        time.sleep(0.2)
    return statuses


def finished_at(client: OrgaClient, ids: Sequence[str]) -> float:
    """When the last of these tasks reached its terminal state (the coordinator's clock)."""
    return max(client.record(task_id).updated_at for task_id in ids)


# -- 2. iteration latency ---------------------------------------------------------------------


@dataclass
class IterationSamples:
    """Per-iteration durations in seconds, from the journals of one or more tasks."""

    iteration: list[float] = field(default_factory=list)
    tool_leg: list[float] = field(default_factory=list)
    reason_leg: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)

    def extend(self, other: IterationSamples) -> None:
        for name in ("iteration", "tool_leg", "reason_leg", "first", "last"):
            getattr(self, name).extend(getattr(other, name))


@dataclass(frozen=True)
class IterationLatency:
    """Per-iteration timings: p50 and p99 of each kind of sample."""

    iteration: Spread
    tool_leg: Spread
    reason_leg: Spread
    first: Spread
    last: Spread

    @classmethod
    def of(cls, samples: IterationSamples) -> IterationLatency:
        return cls(
            Spread.of(samples.iteration),
            Spread.of(samples.tool_leg),
            Spread.of(samples.reason_leg),
            Spread.of(samples.first),
            Spread.of(samples.last),
        )


def iteration_latency(
    client: OrgaClient, iterations: int, dispatch: str, scripts: Path | None = None
) -> IterationSamples:
    """One task, ``iterations`` sequential iterations with one no-op tool call each."""
    task_id = client.submit(iteration_task(iterations, dispatch, scripts))
    status = wait_all(client, [task_id], timeout_s=600)[task_id]
    if status != "completed":
        raise RuntimeError(f"latency task ended {status}")
    return latency_from_journal(client.journal(task_id))


def latency_from_journal(entries: Sequence[JournalEntry]) -> IterationSamples:
    """Iteration, tool leg and reason leg durations of the iterations that called a tool."""
    reasoned = {e.iteration: e.timestamp.timestamp() for e in entries if _is(e, ReasoningComplete)}
    observed = {
        e.iteration: (e.timestamp.timestamp(), e.event.duration.total_seconds())  # type: ignore[union-attr]
        for e in entries
        if _is(e, ToolsDispatched) and e.event.tool_count == 1  # type: ignore[union-attr]
    }
    tool_iterations = sorted(i for i in observed if i + 1 in reasoned)
    whole = [reasoned[i + 1] - reasoned[i] for i in tool_iterations]
    edge = max(1, min(EDGE_ITERATIONS, len(whole) // 2))
    return IterationSamples(
        iteration=whole,
        tool_leg=[observed[i][1] for i in tool_iterations],
        reason_leg=[reasoned[i + 1] - observed[i][0] for i in tool_iterations],
        first=whole[:edge],
        last=whole[-edge:],
    )


def _is(entry: JournalEntry, kind: type[Any]) -> bool:
    return isinstance(entry.event, kind)


# -- 3. throughput ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """Iterations and Celery tasks per second over a batch of concurrent tasks."""

    tasks: int
    iterations: int
    celery_tasks: int
    seconds: float

    @property
    def iterations_per_s(self) -> float:
        return self.iterations / self.seconds

    @property
    def celery_tasks_per_s(self) -> float:
        return self.celery_tasks / self.seconds


def orga_throughput(
    client: OrgaClient, tasks: int, iterations: int, dispatch: str, scripts: Path | None = None
) -> Throughput:
    """``tasks`` tasks of ``iterations`` iterations submitted at once; submit to last done."""
    spec = iteration_task(iterations, dispatch, scripts)
    started = time.time()
    ids = [client.submit(spec) for _ in range(tasks)]
    statuses = wait_all(client, ids, timeout_s=900)
    failed = [i for i, s in statuses.items() if s != "completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} throughput tasks did not complete: {failed[:3]}")
    seconds = finished_at(client, ids) - started
    done = sum(client.record(i).iteration for i in ids)
    tool_tasks = done - tasks if dispatch == "queue" else 0
    return Throughput(tasks, done, done + tool_tasks, seconds)


# -- pre-hydration through the workers ------------------------------------------------------


@dataclass(frozen=True)
class PreHydration:
    """Wall time of a task's pre-hydration: Started to PreHydrationComplete in its journal."""

    references: int
    resolved: int
    seconds: float


def prehydration(client: OrgaClient, references: int) -> PreHydration:
    """A task whose goal names ``references`` URLs, each resolved by the ``slow`` tool."""
    urls = " ".join(f"https://docs.example.test/page/{i}" for i in range(references))
    task_id = client.submit(
        {
            "goal": f"Summarise these pages: {urls}",
            "pre_hydration": {"resolution_tools": {"url": "slow"}, "max_context_tokens": 100_000},
            "provider": {"kind": "scripted", "replies": [{"text": "done", "usage": USAGE}]},
            "steps": [{"id": "read", "instruction": "summarise"}],
        }
    )
    status = wait_all(client, [task_id], timeout_s=120)[task_id]
    if status != "completed":
        raise RuntimeError(f"pre-hydration task ended {status}")
    entries = client.journal(task_id)
    started = next(e for e in entries if isinstance(e.event, Started))
    done = next(e for e in entries if isinstance(e.event, PreHydrationComplete))
    seconds = (done.timestamp - started.timestamp).total_seconds()
    return PreHydration(references, done.event.references_resolved, seconds)  # type: ignore[union-attr]


# -- 4. scale ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Thousands of small tasks at once: completion, memory and what stays in Redis."""

    tasks: int
    completed: int
    seconds: float
    coordinator_peak_kb: int
    coordinator_rss_before_kb: int
    redis_bytes_per_task: float
    stream_lengths: dict[str, tuple[int, int]]
    kept_keys: dict[str, int]


def scale(stack: Stack, client: OrgaClient, count: int) -> Scale:
    """``count`` one-iteration tasks submitted at once."""
    rss_before = stack.coordinator.status_kb("VmRSS")
    used_before = int(client.redis.info("memory")["used_memory"])
    spec = iteration_task(1, scripts=stack.scripts)
    started = time.time()
    ids = [client.submit(spec) for _ in range(count)]
    statuses = wait_all(client, ids, timeout_s=1200)
    seconds = finished_at(client, ids) - started
    completed = sum(1 for s in statuses.values() if s == "completed")
    used_after = int(client.redis.info("memory")["used_memory"])
    return Scale(
        tasks=count,
        completed=completed,
        seconds=seconds,
        coordinator_peak_kb=stack.coordinator.status_kb("VmHWM"),
        coordinator_rss_before_kb=rss_before,
        redis_bytes_per_task=(used_after - used_before) / count,
        stream_lengths=stream_lengths(client, ids[-1]),
        kept_keys=kept_keys(client),
    )


def stream_lengths(client: OrgaClient, task_id: str) -> dict[str, tuple[int, int]]:
    """Entries in each shared stream and in one task's journal, with the length each is trimmed
    to (``MAXLEN ~``, production defaults)."""
    settings = OrgaSettings()
    caps = {
        keys.intake_stream(0): keys.intake_maxlen,
        keys.observations_stream(0): keys.observations_maxlen,
        keys.events_stream(0): settings.events_maxlen,
        keys.dead_letter_stream(0): DEAD_LETTER_MAXLEN,
        keys.journal_stream(task_id, 0): settings.journal_maxlen,
    }
    return {name: (int(client.redis.xlen(name)), cap) for name, cap in caps.items()}


def kept_keys(client: OrgaClient) -> dict[str, int]:
    """How many keys of each per-task family exist (finished tasks included)."""
    families = {
        "orga:task:*": keys.task_key("*", 0),
        "orga:journal:*": keys.journal_stream("*", 0),
        "orga:lease:*": keys.lease_key("*", 0),
    }
    counts = {
        label: sum(1 for _ in client.redis.scan_iter(match=pattern, count=5000))
        for label, pattern in families.items()
    }
    counts["orga:tasks:index (zset)"] = int(client.redis.zcard(keys.task_index_key(0)))
    counts["orga:tasks:deadlines (zset)"] = int(client.redis.zcard(keys.deadlines_key(0)))
    counts["celery-task-meta-* (raw results)"] = sum(
        1 for _ in client.redis.scan_iter(match="celery-task-meta-*", count=5000)
    )
    return counts


# -- running ----------------------------------------------------------------------------------


def wait_ready(stack: Stack, app: Celery, client: OrgaClient) -> None:
    """The worker answers a raw task and the coordinator completes a one-iteration task."""
    deadline = time.monotonic() + 60
    while True:
        stack.check_alive()
        try:
            app.send_task(RAW_TASK_NAME, queue=RAW_QUEUE).get(timeout=2)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
    task_id = client.submit(iteration_task(2, scripts=stack.scripts))
    client.wait(task_id, timeout_s=60)


@contextmanager
def running_stack(concurrency: int, script_files: bool = True) -> Iterator[Stack]:
    """The stack, stopped and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="orga-bench-") as root:
        stack = Stack(Path(root), concurrency, script_files)
        try:
            yield stack.start()
        finally:
            stack.stop()


@dataclass(frozen=True)
class Cpu:
    """CPU seconds used by each process of the stack (a difference of two readings)."""

    coordinator: float
    worker: float
    redis: float
    client: float

    @classmethod
    def now(cls, stack: Stack) -> Cpu:
        pid = stack.redis_server.pid
        return cls(
            coordinator=stack.coordinator.cpu_s(),
            worker=stack.worker.cpu_s(),
            redis=_cpu_of(pid) if pid is not None else 0.0,
            client=time.process_time(),
        )

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(
            self.coordinator - other.coordinator,
            self.worker - other.worker,
            self.redis - other.redis,
            self.client - other.client,
        )

    def __add__(self, other: Cpu) -> Cpu:
        return Cpu(
            self.coordinator + other.coordinator,
            self.worker + other.worker,
            self.redis + other.redis,
            self.client + other.client,
        )

    def per(self, units: int) -> list[str]:
        """Milliseconds per unit of work: coordinator, worker, Redis, benchmark client."""
        values = (self.coordinator, self.worker, self.redis, self.client)
        return [f"{1000 * v / units:.2f}" for v in values]


@dataclass
class Results:
    """What ``measure`` found, by dispatch mode; CPU use and work done by phase."""

    raw_rtt: Spread | None = None
    raw_tps: dict[str, float] = field(default_factory=dict)
    latency: dict[str, IterationLatency] = field(default_factory=dict)
    throughput: dict[str, Throughput] = field(default_factory=dict)
    prehydration: PreHydration | None = None
    scale: Scale | None = None
    cpu: dict[str, tuple[Cpu, int, str]] = field(default_factory=dict)


@contextmanager
def phase(stack: Stack, results: Results, key: str, work: tuple[int, str]) -> Iterator[None]:
    """Print the phase, time it, and record the CPU each process used for its ``work``."""
    count, unit = work
    print(f"-- {key}: {count} {unit}s ...", flush=True)
    started, before = time.monotonic(), Cpu.now(stack)
    yield
    used = Cpu.now(stack) - before
    if key in results.cpu:
        earlier, earlier_count, _unit = results.cpu[key]
        used, count = used + earlier, count + earlier_count
    results.cpu[key] = (used, count, unit)
    stack.check_alive()
    print(f"   done in {time.monotonic() - started:.1f} s", flush=True)


@dataclass(frozen=True)
class Run:
    """What every measurement needs: the stack, the two clients, the sizes, the results."""

    stack: Stack
    app: Celery
    client: OrgaClient
    sizes: Sizes
    results: Results


def measure(
    sizes: Sizes, modes: Sequence[str], skip_scale: bool, script_files: bool = True
) -> Results:
    """Every measurement, in order, against one stack."""
    results = Results()
    with running_stack(sizes.worker_concurrency, script_files) as stack:
        run = Run(stack, raw_client(stack.url), OrgaClient(stack.url), sizes, results)
        try:
            print(f"pids: {stack.describe()}", flush=True)
            wait_ready(stack, run.app, run.client)
            measure_latency(run, modes)
            for mode in modes:
                measure_throughput(run, mode)
            with phase(stack, results, "pre-hydration", (PREHYDRATION_REFERENCES, "reference")):
                results.prehydration = prehydration(run.client, PREHYDRATION_REFERENCES)
            if not skip_scale:
                with phase(stack, results, "scale", (sizes.scale_tasks, "task")):
                    results.scale = scale(stack, run.client, sizes.scale_tasks)
        finally:
            run.client.close()
            run.app.close()
    return results


def measure_latency(run: Run, modes: Sequence[str]) -> None:
    """Raw round trips and the latency task of each mode, interleaved in ``LATENCY_ROUNDS``
    rounds so that a change of load on the machine hits both sides alike."""
    sizes, results = run.sizes, run.results
    raw_round_trips(run.app, 50)
    trips: list[float] = []
    samples = {mode: IterationSamples() for mode in modes}
    per_round = max(1, sizes.raw_round_trips // LATENCY_ROUNDS)
    for _ in range(LATENCY_ROUNDS):
        with phase(run.stack, results, "raw round trip", (per_round, "task")):
            trips += raw_round_trips(run.app, per_round)
        for mode in modes:
            work = (sizes.latency_iterations, "iteration")
            with phase(run.stack, results, f"latency ({mode})", work):
                samples[mode].extend(
                    iteration_latency(run.client, work[0], mode, run.stack.scripts)
                )
    results.raw_rtt = Spread.of(trips)
    print(f"   raw round trip {results.raw_rtt.text()}")
    for mode in modes:
        results.latency[mode] = latency = IterationLatency.of(samples[mode])
        print(f"   {mode}: iteration {latency.iteration.text()}")


def measure_throughput(run: Run, mode: str) -> None:
    """Raw no-op throughput, then the mode's throughput batch right after it."""
    sizes, results = run.sizes, run.results
    with phase(run.stack, results, "raw throughput", (sizes.raw_tasks, "task")):
        results.raw_tps[mode] = raw_throughput(
            run.app, run.stack.url, sizes.raw_tasks, sizes.raw_senders
        )
    print(f"   {results.raw_tps[mode]:.0f} tasks/s")
    work = sizes.tasks * sizes.iterations_per_task
    with phase(run.stack, results, f"throughput ({mode})", (work, "iteration")):
        results.throughput[mode] = tp = orga_throughput(
            run.client, sizes.tasks, sizes.iterations_per_task, mode, run.stack.scripts
        )
    print(f"   {tp.iterations_per_s:.0f} iterations/s")


# -- report -----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


Row = tuple[str, str, str, str]


def report(results: Results, sizes: Sizes) -> str:
    """The tables, as Markdown."""
    rows = raw_rows(results)
    for mode in results.latency:
        rows += latency_rows(results, mode) + throughput_rows(results, sizes, mode)
    if results.prehydration is not None:
        rows.append(prehydration_row(results.prehydration, sizes))
    if results.scale is not None:
        rows += scale_rows(results.scale)
    header = "| measurement | value | compared with (same run) | target |\n|---|---|---|---|"
    body = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    tables = [f"{header}\n{body}", cpu_table(results)]
    if results.scale is not None:
        tables.append(retention_table(results.scale))
    return "\n\n".join(tables)


def raw_rows(results: Results) -> list[Row]:
    assert results.raw_rtt is not None
    return [
        ("raw no-op round trip (send, run, result back)", results.raw_rtt.text(), "baseline", ""),
        (
            "raw no-op throughput, measured just before each batch below",
            " / ".join(f"{tps:.0f}" for tps in results.raw_tps.values()) + " tasks/s",
            "baseline (" + " / ".join(results.raw_tps) + ")",
            "",
        ),
    ]


def latency_rows(results: Results, mode: str) -> list[Row]:
    assert results.raw_rtt is not None
    base = results.raw_rtt.p50_ms
    latency = results.latency[mode]
    ratio = latency.iteration.p50_ms / base
    trips = "2 Celery round trips" if mode == "queue" else "1 Celery round trip"
    tool_leg = "reasoned applied -> tool observation applied"
    if mode == "inline":
        tool_leg += " (0: the reasoning task ran it)"
    return [
        (
            f"[{mode}] iteration with one tool call ({trips})",
            latency.iteration.text(),
            f"{ratio:.2f} x raw p50 (p99: {latency.iteration.p99_ms / base:.2f} x raw p50)",
            f"{verdict(ratio <= ITERATION_TARGET_RATIO)} (<= {ITERATION_TARGET_RATIO:.0f} x)",
        ),
        (
            f"[{mode}]   tool leg: {tool_leg}",
            latency.tool_leg.text(),
            f"{latency.tool_leg.p50_ms / base:.2f} x raw p50",
            "",
        ),
        (
            f"[{mode}]   reason leg: observation applied -> reasoned applied",
            latency.reason_leg.text(),
            f"{latency.reason_leg.p50_ms / base:.2f} x raw p50",
            "",
        ),
        (
            f"[{mode}]   first / last {EDGE_ITERATIONS} iterations of each task",
            f"p50 {latency.first.p50_ms:.2f} / {latency.last.p50_ms:.2f} ms",
            f"{latency.first.p50_ms / base:.2f} x / {latency.last.p50_ms / base:.2f} x raw p50",
            "",
        ),
    ]


def throughput_rows(results: Results, sizes: Sizes, mode: str) -> list[Row]:
    tp = results.throughput[mode]
    raw_tps = results.raw_tps[mode]
    share = tp.iterations_per_s / raw_tps
    target = f"{verdict(share >= THROUGHPUT_TARGET_SHARE)} (>= {THROUGHPUT_TARGET_SHARE:.0%})"
    raw_cpu = results.cpu["raw throughput"][0]
    orga_cpu = results.cpu[f"throughput ({mode})"][0]
    raw_count = results.cpu["raw throughput"][1]
    raw_ms = 1000 * (raw_cpu.worker + raw_cpu.redis + raw_cpu.client) / raw_count
    orga_ms = 1000 * (orga_cpu.coordinator + orga_cpu.worker + orga_cpu.redis) / tp.iterations
    return [
        (
            f"[{mode}] throughput, {tp.tasks} tasks x {sizes.iterations_per_task} iterations",
            f"{tp.iterations_per_s:.0f} iterations/s ({tp.iterations} in {tp.seconds:.1f} s)",
            f"{share:.0%} of raw {raw_tps:.0f} tasks/s",
            target,
        ),
        (
            f"[{mode}]   CPU per iteration (coordinator + worker + redis)",
            f"{orga_ms:.2f} ms",
            f"raw task {raw_ms:.2f} ms (worker + redis + sender): CPU-bound share "
            f"{raw_ms / orga_ms:.0%}",
            "",
        ),
        (
            f"[{mode}]   Celery tasks run by that batch",
            f"{tp.celery_tasks_per_s:.0f} tasks/s ({tp.celery_tasks} tasks)",
            f"{tp.celery_tasks_per_s / raw_tps:.0%} of raw tasks/s",
            "",
        ),
    ]


def cpu_table(results: Results) -> str:
    """CPU milliseconds per unit of work, by process, in each phase."""
    lines = [
        "| CPU ms per unit of work (phase) | coordinator | worker (all processes) | redis "
        "| bench client |",
        "|---|---|---|---|---|",
    ]
    for key, (cpu, count, unit) in results.cpu.items():
        lines.append(f"| per {unit} ({key}) | " + " | ".join(cpu.per(count)) + " |")
    return "\n".join(lines)


def prehydration_row(p: PreHydration, sizes: Sizes) -> Row:
    one = SLOW_TOOL_S * 1000
    ok = p.seconds < PREHYDRATION_TARGET_RATIO * SLOW_TOOL_S and p.resolved == p.references
    return (
        f"pre-hydration in the runtime: {p.references} references x {one:.0f} ms "
        f"({p.resolved} resolved)",
        f"{p.seconds * 1000:.0f} ms",
        f"one resolution {one:.0f} ms; all in sequence {p.references * one:.0f} ms; "
        f"{sizes.worker_concurrency} worker processes",
        f"{verdict(ok)} (< {PREHYDRATION_TARGET_RATIO * one:.0f} ms)",
    )


def scale_rows(s: Scale) -> list[Row]:
    rate = s.completed / s.seconds
    return [
        (
            f"scale: {s.tasks} one-iteration tasks queued at once",
            f"{s.completed} completed in {s.seconds:.1f} s ({rate:.0f} tasks/s)",
            f"{s.tasks} submitted",
            verdict(s.completed == s.tasks),
        ),
        (
            "  coordinator peak RSS (VmHWM, whole run)",
            f"{s.coordinator_peak_kb / 1024:.0f} MiB",
            f"{s.coordinator_rss_before_kb / 1024:.0f} MiB RSS before the batch",
            "",
        ),
        (
            "  Redis memory per completed task (used_memory delta / tasks)",
            f"{s.redis_bytes_per_task / 1024:.1f} KiB",
            "kept until deleted: see retention",
            "",
        ),
    ]


def retention_table(s: Scale) -> str:
    lines = [
        "| stream / key family after the scale run | entries | bound |",
        "|---|---|---|",
    ]
    lines += [
        f"| XLEN {name} | {length} | trimmed at about {cap} |"
        for name, (length, cap) in s.stream_lengths.items()
    ]
    lines += [
        f"| {name} | {count} | {KEPT_BOUND.get(name, '')} |" for name, count in s.kept_keys.items()
    ]
    return "\n".join(lines)


def parse_sizes(args: argparse.Namespace) -> Sizes:
    sizes = Sizes.quick() if args.quick else Sizes()
    overrides = {
        "worker_concurrency": args.concurrency,
        "scale_tasks": args.scale_tasks,
        "tasks": args.tasks,
        "latency_iterations": args.latency_iterations,
    }
    chosen = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(sizes, **chosen)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    parser.add_argument("--no-scale", action="store_true", help="skip the scale measurement")
    parser.add_argument(
        "--modes", default="queue,inline", help="tool_dispatch modes to measure (queue,inline)"
    )
    parser.add_argument("--concurrency", type=int, help="worker processes (default 2)")
    parser.add_argument("--tasks", type=int, help="tasks in the throughput batch")
    parser.add_argument("--latency-iterations", type=int, help="iterations of the latency task")
    parser.add_argument("--scale-tasks", type=int, help="tasks in the scale run")
    parser.add_argument(
        "--replies-in-task",
        action="store_true",
        help="put the scripted replies inside each task (and so in every reasoning request) "
        "instead of a script file",
    )
    args = parser.parse_args(argv)
    sizes = parse_sizes(args)
    modes = [m for m in args.modes.split(",") if m]
    started = time.monotonic()
    results = measure(sizes, modes, args.no_scale, not args.replies_in_task)
    where = "inside each task" if args.replies_in_task else "in a script file"
    print(f"\nworker concurrency {sizes.worker_concurrency}, {os.cpu_count()} CPUs, "
          f"scripted replies {where}\n")  # fmt: skip
    print(report(results, sizes))
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
