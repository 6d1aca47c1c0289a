"""The runtime against a slow model, side by side with the peers a competent user would run:
calls in flight, share of the latency limit, CPU and Redis commands per model call, memory, and
duplicate model calls (issues 10 and 27).

Run: ``.venv/bin/python bench/slow_model_bench.py`` (``--quick`` for a smoke run,
``--fairness`` for the 2,000-task fairness run, ``--events`` for task events on and off side
by side, ``--streaming`` for token streaming off and on side by side, ``--help`` for the
sizes and ``--peers``). Method and results:
``docs/performance.md``, *Slow model*.

Everything is real and on this machine (127.0.0.1 only):

- a fake OpenAI-compatible model server (``bench/fake_model_server.py``, its own process, one
  asyncio loop) that answers after ``latency ± 20 %`` (one draw per run index and turn, the
  same for every system): a ``file_read`` tool call for turns
  ``1 .. N-1`` and a final answer at turn ``N``, counting calls in flight (peak and
  time-weighted mean) and duplicate calls (a second request for the same task and turn);
- the runtime with its **default commands and no tuning**: a private Redis, ``orga
  coordinator`` and ``orga worker`` (whatever ``orga worker`` starts with no option: its
  process tree is measured whole), configured only with ``ORGA_REDIS_URL``,
  ``ORGA_PROVIDER=openai``, ``ORGA_BASE_URL``, ``ORGA_API_KEY``, ``ORGA_MODEL`` and
  ``ORGA_WORKSPACE_ROOT``. Each task names a marker in its goal and reads one line of
  ``note.txt`` in a shared workspace per turn;
- the peers (:data:`PEERS`), each in processes of their own: plain asyncio loops and a
  LangGraph two-node graph with its in-memory checkpointer, each with ``aiohttp`` and with
  ``httpx`` in pools of 20 (``bench/slow_model_peers.py``), and arq, the distributed peer: one
  arq job per iteration, as many arq worker processes as the runtime's reasoning processes,
  with arq's default poll (0.5 s) and a fast one (0.05 s), and ``arq-fast-2``, the fast poll on
  two workers whatever that default (``bench/slow_model_arq.py``). The
  footnote set-ups (:data:`FOOTNOTE_PEERS`: one httpx client of 200 connections, the peer
  before issue 27; plain asyncio on the runtime's own HTTP client) are printed apart.

Fairness of the comparison: every system gets one warm-up run alone before its batch, runs on
uvloop's event loop, and has its CPU counted over the timed batch only, summed over all of its
processes (the runtime: coordinator, every worker process and its Redis; arq: its workers and
its Redis); the order of the systems is reversed every other batch. For each latency (1 s and
3 s by default; the first ``--repeats`` times), ``--tasks`` runs of ``--iterations`` model
calls submitted at once, and for each system: iterations per second (distinct model calls
answered over the wall time from the first submission to the last run finished), as a share of
the latency limit (``tasks / latency``); peak and mean calls in flight; peak RSS and PSS of
every process of the system (sampled every 0.5 s); CPU per model call; Redis commands per call
(``INFO commandstats`` over the batch, commands run by Lua scripts included, the benchmark's
own status polls left out); duplicate calls; and for orga-queue how long a reasoning request
waits between its dispatch (the coordinator's journal) and its arrival at the model
(schedule-to-start). Then the runtime, arq and plain asyncio against a model that answers at
once (iterations per second). Every batch is bounded in time: a batch still running at its
bound is reported as it stands, with how many tasks finished.

The fairness run submits ``--fairness-tasks`` tasks of ``--fairness-iterations`` calls at
once (1 s latency) and reports the spread of the tasks' first model calls, and the peak RSS of
the coordinator and the workers and Redis ``used_memory``.

Headline figures are printed as ``RESULT name value`` lines; the script exits 0 either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil

from bench.fake_model_server import task_marker
from bench.runtime_bench import POLL_WINDOW, TERMINAL, Child, Stack, finished_at, percentile
from coordinator.client import OrgaClient
from shared import keys
from shared.events import JournalEntry, Started, ToolsDispatched

API_KEY = "bench-key"
MODEL = "fake-model"
NOTE_LINES = 50
"""``note.txt`` has this many lines; turn ``t`` reads line ``t``."""
SAMPLE_EVERY_S = 0.5
POLL_EVERY_S = 0.2
READY_TIMEOUT_S = 180.0
MB = 1024 * 1024
PEERS = (
    "asyncio-aiohttp",
    "asyncio-httpx20",
    "langgraph-aiohttp",
    "langgraph-httpx20",
    "arq-default",
    "arq-fast",
    "arq-fast-2",
)
"""The peers, as a competent user would set each up (``bench/slow_model_peers.py``,
``bench/slow_model_arq.py``). arq runs as many worker processes as the runtime's reasoning
processes by default (the issue's rule); ``arq-fast-2`` runs two whatever the runtime's
default, so that a change of that default cannot take a process from the peer."""
FOOTNOTE_PEERS = ("asyncio-httpx200", "asyncio-orgapool")
"""Set-ups printed as footnotes only: one httpx client of 200 connections (the handicapped
peer of the benchmark before issue 27), and plain asyncio on the runtime's own HTTP client."""
ZERO_LATENCY_SYSTEMS = ("orga", "arq-fast", "arq-fast-2", "arq-default", "asyncio-aiohttp")
ARQ_POLLS = {"arq-default": 0.5, "arq-fast": 0.05, "arq-fast-2": 0.05}
"""arq's default ``poll_delay`` and a fast one."""
ARQ_WORKERS = {"arq-fast-2": 2}
"""arq set-ups whose worker count is fixed (the others: the runtime's reasoning processes)."""
FAIRNESS_BOUND_S = 300.0
"""How long the fairness batch may run (``--timeout`` overrides it)."""


@dataclass(frozen=True)
class Plan:
    """What to run."""

    tasks: int = 200
    iterations: int = 5
    latencies: tuple[float, ...] = (1.0, 3.0)
    jitter: float = 0.2
    peers: tuple[str, ...] = PEERS
    footnote_peers: tuple[str, ...] = FOOTNOTE_PEERS
    repeats: int = 2
    """Repeats at the first latency (once at the others), the order reversed every other one."""
    zero_latency: bool = True
    """Also run orga-queue, arq and plain asyncio against a model that answers at once."""
    timeout_s: float | None = None
    fairness_tasks: int = 2000
    fairness_iterations: int = 2
    fairness_latency: float = 1.0
    reasoning_processes: int | None = None
    """``ORGA_REASONING_PROCESSES`` for the runtime (None: its default; the arq peers follow
    the default, not this: ``--reasoning-processes`` compares the runtime's own set-ups)."""

    def bound_s(self, latency: float, iterations: int) -> float:
        """How long one batch may run: ``--timeout``, else ten times its ideal time (one
        latency per iteration), at least a minute."""
        if self.timeout_s is not None:
            return self.timeout_s
        return max(60.0, 10.0 * iterations * latency)


# -- processes --------------------------------------------------------------------------------


def orga_command(*args: str) -> list[str]:
    """The ``orga`` script of this environment (``python -m orga.cli`` without it)."""
    script = Path(sys.executable).parent / "orga"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "orga.cli", *args]


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pids: Sequence[int]) -> tuple[float, float, int]:
    """Memory of these processes and all their descendants, in MiB: the sum of their RSS
    (a page shared by forked processes counted in each), the sum of their PSS (each shared
    page split between the processes that share it: what the tree costs the machine), and how
    many processes that is."""
    seen: dict[int, tuple[int, int]] = {}
    for pid in pids:
        for process in tree(pid):
            try:
                full = process.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen[process.pid] = (full.rss, getattr(full, "pss", full.rss))
    rss = sum(r for r, _ in seen.values()) / MB
    return rss, sum(p for _, p in seen.values()) / MB, len(seen)


def tree_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) of these processes and their live descendants."""
    return sum(cpu_by_process({"all": list(pids)}).values())


def process_role(group: str, process: psutil.Process) -> str:
    """What a process of a measured group is: the group, and for a Celery worker its queue
    and whether it is the worker's main process or one of its pool's children."""
    queue = _worker_queue(process)
    if queue is None:
        return group
    try:
        parent = process.parent()
        child = parent is not None and _worker_queue(parent) is not None
    except psutil.Error:
        child = False
    return f"worker {queue}{' (pool process)' if child else ''}"


def _worker_queue(process: psutil.Process) -> str | None:
    """The queue of a Celery worker's process (``all queues`` without ``-Q``), None for
    another process. A worker is ``celery -A ... worker``, ``python -m orga.worker_main``, or
    a worker that ``orga worker``'s supervisor forked (its command line the supervisor's, its
    name ``orga-reasoning`` or ``orga-tools``: :func:`orga.supervisor.fork_workers`)."""
    try:
        argv = process.cmdline()
        name = process.name()
    except psutil.Error:
        return None
    if "celery" in " ".join(argv) or "orga.worker_main" in argv:
        return argv[argv.index("-Q") + 1] if "-Q" in argv[:-1] else "all queues"
    if "orga.supervisor" in argv and name.startswith("orga-"):
        queue = name.removeprefix("orga-")
        return "all queues" if queue == "worker" else f"orga.{queue}"
    return None


def cpu_by_process(groups: dict[str, list[int]]) -> dict[tuple[str, int], float]:
    """CPU seconds (user + system) of every live process of these groups' trees, by (role,
    pid): the role as :func:`process_role` names it."""
    seen: dict[tuple[str, int], float] = {}
    for group, pids in groups.items():
        for pid in pids:
            for process in tree(pid):
                try:
                    times = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                seen[(process_role(group, process), process.pid)] = times.user + times.system
    return seen


def cpu_spent(
    before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]
) -> dict[str, float]:
    """CPU seconds each role spent between two readings (a process born in between counts
    whole; one that died in between is lost, as ``/proc`` forgets it)."""
    spent: dict[str, float] = {}
    for key, cpu in after.items():
        role = key[0]
        spent[role] = spent.get(role, 0.0) + cpu - before.get(key, 0.0)
    return spent


@dataclass
class ModelServer:
    """The fake model server in its own process, and an HTTP client for its counts."""

    child: Child
    url: str
    http: httpx.Client

    @classmethod
    def start(
        cls, root: Path, latency: float, jitter: float, iterations: int, extra: Sequence[str] = ()
    ) -> ModelServer:
        command = [
            sys.executable, "-m", "bench.fake_model_server", "--latency", str(latency),
            "--jitter", str(jitter), "--iterations", str(iterations), "--api-key", API_KEY,
            *extra,
        ]  # fmt: skip
        child = Child("model-server", command, dict(os.environ), root / "model-server.log")
        child.start()
        child.wait_for_log("fake model server on ")
        line = next(s for s in child.log.read_text().splitlines() if "server on " in s)
        url = line.split("server on ", 1)[1].strip()
        return cls(child, url, httpx.Client(base_url=url.removesuffix("/v1"), timeout=60))

    def stats(self, records: bool = False) -> dict[str, Any]:
        """``GET /stats``."""
        response = self.http.get("/stats", params={"records": "1"} if records else None)
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    def reset(self) -> None:
        """``POST /reset``: zero the counts."""
        self.http.post("/reset").raise_for_status()

    def stop(self) -> None:
        self.http.close()
        self.child.stop()


@dataclass
class OrgaStack(Stack):
    """A private Redis, ``orga coordinator`` and ``orga worker`` with their defaults, pointed at
    the fake model server. (``concurrency`` of the base class is unused: no ``-c`` is given.)"""

    model_url: str = ""
    task_events: bool | None = None
    """``ORGA_TASK_EVENTS`` for the workers (None: not set, the default)."""
    stream_tokens: bool | None = None
    """``ORGA_STREAM_TOKENS`` for the workers (None: not set, the default)."""
    reasoning_processes: int | None = None
    """``ORGA_REASONING_PROCESSES`` for ``orga worker`` (None: not set, the default)."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            ORGA_REDIS_URL=self.url,
            ORGA_WORKSPACE_ROOT=str(self.root / "workspaces"),
            ORGA_PROVIDER="openai",
            ORGA_BASE_URL=self.model_url,
            ORGA_API_KEY=API_KEY,
            ORGA_MODEL=MODEL,
        )
        if self.task_events is not None:
            env["ORGA_TASK_EVENTS"] = "true" if self.task_events else "false"
        if self.stream_tokens is not None:
            env["ORGA_STREAM_TOKENS"] = "true" if self.stream_tokens else "false"
        if self.reasoning_processes is not None:
            env["ORGA_REASONING_PROCESSES"] = str(self.reasoning_processes)
        return env

    def start(self) -> OrgaStack:
        self.redis_server.start()
        self.coordinator = self._spawn("coordinator", orga_command("coordinator"))
        self.worker = self._spawn("worker", orga_command("worker"))
        return self

    def stop(self) -> None:
        """Stop each process as the base class does, then whatever of their trees is left."""
        descendants = [p for c in self.children if c.alive() for p in tree(c.pid)[1:]]
        super().stop()
        for process in descendants:
            if process.is_running():
                process.terminate()
        _, alive = psutil.wait_procs(descendants, timeout=10)
        for process in alive:
            process.kill()

    def pids(self) -> dict[str, list[int]]:
        """The roots of each measured group."""
        redis_pid = self.redis_server.pid
        return {
            "workers": [self.worker.pid],
            "coordinator": [self.coordinator.pid],
            "redis": [redis_pid] if redis_pid is not None else [],
        }


@contextmanager
def model_server(
    root: Path, plan: Plan, latency: float, iterations: int, extra: Sequence[str] = ()
) -> Iterator[ModelServer]:
    """The fake model server (``extra``: more of its options), stopped afterwards."""
    server = ModelServer.start(root, latency, plan.jitter, iterations, extra)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def orga_stack(
    root: Path,
    server: ModelServer,
    task_events: bool | None = None,
    stream_tokens: bool | None = None,
    reasoning_processes: int | None = None,
) -> Iterator[OrgaStack]:
    """The runtime's processes, stopped afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    stack = OrgaStack(root, concurrency=0, model_url=server.url, task_events=task_events)
    stack.stream_tokens = stream_tokens
    stack.reasoning_processes = reasoning_processes
    try:
        yield stack.start()
    finally:
        stack.stop()


def make_workspace(root: Path) -> Path:
    """The shared workspace every task reads its note from."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    lines = (f"line {n}: nothing to see here" for n in range(1, NOTE_LINES + 1))
    (workspace / "note.txt").write_text("\n".join(lines) + "\n")
    return workspace


# -- sampling ---------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Peak RSS of groups of process trees (and Redis ``used_memory``), sampled now and then."""

    groups: dict[str, list[int]]
    redis_client: Any = None
    peak_mb: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    peak_sum_mb: float = 0.0
    peak_pss_sum_mb: float = 0.0
    peak_redis_used_mb: float = 0.0
    _last: float = 0.0

    def sample(self, force: bool = False) -> None:
        """Read the memory of every group, at most every ``SAMPLE_EVERY_S``."""
        now = time.monotonic()
        if not force and now - self._last < SAMPLE_EVERY_S:
            return
        self._last = now
        total = total_pss = 0.0
        for name, pids in self.groups.items():
            rss, pss, count = tree_rss(pids)
            self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), rss)
            self.processes[name] = max(self.processes.get(name, 0), count)
            total += rss
            total_pss += pss
        self.peak_sum_mb = max(self.peak_sum_mb, total)
        self.peak_pss_sum_mb = max(self.peak_pss_sum_mb, total_pss)
        if self.redis_client is not None:
            used = int(self.redis_client.info("memory")["used_memory"]) / MB
            self.peak_redis_used_mb = max(self.peak_redis_used_mb, used)


# -- the workload -----------------------------------------------------------------------------


def task_spec(marker: str, workspace: Path) -> dict[str, Any]:
    """One run: read ``note.txt`` a line per turn until the model answers (the fake model
    decides: ``iterations`` calls). Nothing else is set: the runtime's defaults apply."""
    return {
        "goal": f"Slow-model benchmark {task_marker(marker)}: read note.txt one line per turn, "
        "then answer.",
        "steps": [{"id": "read", "instruction": "Read note.txt, one line per turn, then answer."}],
        "tools": ["file_read"],
        "workspace": str(workspace),
    }


def wait_terminal(
    client: OrgaClient,
    ids: Sequence[str],
    deadline: float,
    tick: Callable[[], None],
    sent: list[int] | None = None,
) -> dict[str, str]:
    """Poll until every task is terminal or ``deadline`` (monotonic) passes; the terminal
    statuses seen. Cheap on purpose, like ``runtime_bench.wait_all``. The Redis commands the
    polls send are added to ``sent[0]`` (they are the benchmark's, not the runtime's)."""
    statuses: dict[str, str] = {}
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        window = pending[:POLL_WINDOW]
        if sent is not None:
            sent[0] += len(window)
        pipe = client.redis.pipeline(transaction=False)
        for task_id in window:
            pipe.hget(keys.task_key(task_id, 0), "status")
        for task_id, status in zip(window, pipe.execute(), strict=True):
            if status in TERMINAL:
                statuses[task_id] = str(status)
        pending = [i for i in pending if i not in statuses]
        tick()
        time.sleep(POLL_EVERY_S)
    return statuses


@dataclass(frozen=True)
class Batch:
    """One batch of tasks submitted to the runtime at once, and how it ended."""

    ids: list[str]
    markers: list[str]
    started: float
    submitted: float
    end: float
    statuses: dict[str, str]
    redis_commands: int = 0
    """Commands the runtime's Redis ran from the first submission to the last task's end
    (``INFO commandstats``, each command a Lua script runs counted too), the benchmark's own
    status polls and ``INFO`` calls left out."""

    @property
    def finished(self) -> bool:
        return len(self.statuses) == len(self.ids)

    @property
    def completed(self) -> int:
        return sum(1 for s in self.statuses.values() if s == "completed")


def submit_batch(
    client: OrgaClient, markers: list[str], workspace: Path, bound_s: float, sampler: Sampler
) -> Batch:
    """Submit one task per marker at once; wait for them all, at most ``bound_s``."""
    specs = [task_spec(marker, workspace) for marker in markers]
    sent = [0]
    commands_before = redis_commands(client.redis)
    started = time.time()
    deadline = time.monotonic() + bound_s
    ids = [client.submit(spec) for spec in specs]
    submitted = time.time()
    statuses = wait_terminal(client, ids, deadline, sampler.sample, sent)
    commands = redis_commands(client.redis) - commands_before - sent[0]
    sampler.sample(force=True)
    end = finished_at(client, ids) if len(statuses) == len(ids) else started + bound_s
    return Batch(ids, markers, started, submitted, end, statuses, commands)


def redis_commands(redis: Any) -> int:
    """Commands this Redis has run (``INFO commandstats``), its ``INFO`` calls left out."""
    stats: dict[str, Any] = redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if not k.startswith("cmdstat_info"))


def wait_ready(stack: OrgaStack, client: OrgaClient, workspace: Path, run: str) -> float:
    """One task through the whole stack, submitted as it starts; the seconds from its
    submission to its end."""
    started = time.time()
    task_id = client.submit(task_spec(f"{run}-warmup", workspace))
    deadline = time.monotonic() + READY_TIMEOUT_S
    statuses: dict[str, str] = {}
    while not statuses and time.monotonic() < deadline:
        stack.check_alive()
        statuses = wait_terminal(client, [task_id], time.monotonic() + 1.0, lambda: None)
    status = statuses.get(task_id, "not finished")
    if status != "completed":
        raise RuntimeError(
            f"the warm-up task ended {status!r}; worker log:\n{stack.worker.tail()}\n"
            f"coordinator log:\n{stack.coordinator.tail()}"
        )
    return finished_at(client, [task_id]) - started


# -- measurements -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Waits:
    """Schedule-to-start of reasoning requests; ``unstarted`` of them never reached the model
    before the batch ended and count with the time they had waited by then (a lower bound).

    The submission burst split in two, for each run whose first request reached the model:
    ``first_dispatch``, the batch's start to the run's ``Started`` journal time (when the
    coordinator prepared its create: its pace through the burst), and ``first_wait``, that time
    to the request's first arrival at the model (its chunk's create script, the relay, the
    broker and the reasoning worker). The arrival is the model server's first of the request,
    answered or not, as for schedule-to-start; :class:`Gaps` counts answered calls only."""

    seconds: tuple[float, ...] = ()
    unstarted: int = 0
    first_dispatch: tuple[float, ...] = ()
    first_wait: tuple[float, ...] = ()


@dataclass(frozen=True)
class Gaps:
    """Where a run's time goes besides its model calls (the model server's records): from the
    batch's submission to each run's first model call, and from each reply to the same run's
    next model call (the runtime's whole turn-around: publish, apply, dispatch, queue)."""

    first_call: tuple[float, ...] = ()
    between_calls: tuple[float, ...] = ()


def gaps(records: list[dict[str, Any]], markers: Sequence[str], submitted_at: float) -> Gaps:
    """The :class:`Gaps` of the runs named by ``markers``, from the first answer of each
    (task, turn)."""
    wanted = set(markers)
    turns: dict[str, dict[int, tuple[float, float]]] = {}
    for record in records:
        if record["task"] in wanted and record["end"] > 0:
            calls = turns.setdefault(record["task"], {})
            calls.setdefault(record["turn"], (record["start"], record["end"]))
    first, between = [], []
    for calls in turns.values():
        if 1 in calls:
            first.append(calls[1][0] - submitted_at)
        between += [calls[t + 1][0] - calls[t][1] for t in calls if t + 1 in calls]
    return Gaps(tuple(first), tuple(between))


@dataclass(frozen=True)
class Measurement:
    """One system at one latency."""

    system: str
    key: str
    latency_s: float
    runs: int
    iterations: int
    completed: int
    seconds: float
    calls: int
    total_calls: int
    duplicates: int
    peak_inflight: int
    mean_inflight: float
    peak_rss_mb: float
    cpu_s: float
    notes: tuple[str, ...] = ()
    peak_pss_mb: float = 0.0
    """The processes' PSS: shared pages split between the processes that share them."""
    waits: Waits = field(default_factory=Waits)
    """Schedule-to-start of the reasoning requests (orga-queue only)."""
    cpu_by_role: dict[str, float] = field(default_factory=dict)
    """CPU seconds by process role (orga-queue only)."""
    gaps: Gaps = field(default_factory=Gaps)
    """The runs' time outside their model calls (orga-queue only)."""
    redis_commands: int = 0
    """Commands the system's Redis ran over the timed batch (orga-queue and arq)."""
    repeat: int = 0

    @property
    def redis_commands_per_call(self) -> float:
        return self.redis_commands / self.calls if self.calls else 0.0

    @property
    def iterations_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def limit_per_s(self) -> float:
        """Every run with one call in flight all the time: ``runs / latency``."""
        return self.runs / self.latency_s if self.latency_s > 0 else float("inf")

    @property
    def share(self) -> float:
        return self.iterations_per_s / self.limit_per_s if self.latency_s > 0 else 0.0

    @property
    def mb_per_inflight(self) -> float:
        """Memory per run in flight: PSS (the machine's cost of the process trees, a page
        shared by forked workers counted once), RSS where PSS cannot be read."""
        memory = self.peak_pss_mb or self.peak_rss_mb
        return memory / self.peak_inflight if self.peak_inflight else float("inf")

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000 * self.cpu_s / self.calls if self.calls else 0.0

    def cpu_ms_per_call_by_role(self) -> dict[str, float]:
        """CPU ms per model call of each process role, largest first."""
        if not self.calls:
            return {}
        ranked = sorted(self.cpu_by_role.items(), key=lambda item: -item[1])
        return {role: 1000 * cpu / self.calls for role, cpu in ranked}


def answered_calls(records: list[dict[str, Any]], until: float) -> int:
    """Distinct (task, turn) calls answered by ``until`` (wall clock)."""
    return len({(r["task"], r["turn"]) for r in records if 0 < r["end"] <= until + 0.5})


def first_starts(records: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """When each (task, turn) first reached the model."""
    starts: dict[tuple[str, int], float] = {}
    for record in records:
        key = (record["task"], record["turn"])
        starts[key] = min(starts.get(key, record["start"]), record["start"])
    return starts


def dispatch_times(entries: Sequence[JournalEntry]) -> list[float]:
    """When the coordinator dispatched each reasoning request of a one-step task: at Started,
    then each time it applied an iteration's tool results (ToolsDispatched)."""
    times = [e.timestamp.timestamp() for e in entries if isinstance(e.event, Started)][:1]
    times += [e.timestamp.timestamp() for e in entries if isinstance(e.event, ToolsDispatched)]
    return times


def schedule_to_start(client: OrgaClient, batch: Batch, records: list[dict[str, Any]]) -> Waits:
    """For every reasoning request the coordinator dispatched: its arrival at the model minus
    its dispatch (the coordinator's journal)."""
    starts = first_starts(records)
    waits: list[float] = []
    unstarted = 0
    first_dispatch: list[float] = []
    first_wait: list[float] = []
    for task_id, marker in zip(batch.ids, batch.markers, strict=True):
        dispatched = dispatch_times(client.journal(task_id))
        if task_id in batch.statuses:
            dispatched = dispatched[:-1]  # after the final answer nothing is dispatched
        for turn, at in enumerate(dispatched, start=1):
            start = starts.get((marker, turn))
            waits.append((batch.end if start is None else start) - at)
            unstarted += start is None
            if turn == 1 and start is not None:
                first_dispatch.append(at - batch.started)
                first_wait.append(start - at)
    return Waits(tuple(waits), unstarted, tuple(first_dispatch), tuple(first_wait))


@dataclass(frozen=True)
class Setting:
    """What every measurement at one latency shares."""

    root: Path
    server: ModelServer
    plan: Plan
    latency: float
    workspace: Path

    @property
    def bound_s(self) -> float:
        return self.plan.bound_s(self.latency, self.plan.iterations)


def measure_orga(
    setting: Setting, task_events: bool | None = None, stream_tokens: bool | None = None
) -> Measurement:
    """The workload on the runtime started with its defaults (``ORGA_TASK_EVENTS`` set to
    ``task_events`` and ``ORGA_STREAM_TOKENS`` to ``stream_tokens`` unless None)."""
    plan, server, latency, workspace = (
        setting.plan,
        setting.server,
        setting.latency,
        setting.workspace,
    )
    run = uuid.uuid4().hex[:8]
    label = "" if task_events is None else f"-events-{'on' if task_events else 'off'}"
    label += "" if stream_tokens is None else f"-stream-{'on' if stream_tokens else 'off'}"
    root = setting.root / f"orga-{latency:g}s{label}"
    with orga_stack(root, server, task_events, stream_tokens, plan.reasoning_processes) as stack:
        client = OrgaClient(stack.url)
        try:
            print(f"-- orga-queue at {latency:g} s: starting ({stack.describe()})", flush=True)
            alone_s = wait_ready(stack, client, workspace, run)
            server.reset()
            groups = stack.pids()
            sampler = Sampler(groups)
            cpu_before = cpu_by_process(groups)
            markers = [f"{run}-{n}" for n in range(plan.tasks)]
            print(f"   ready; {plan.tasks} tasks x {plan.iterations} iterations", flush=True)
            batch = submit_batch(client, markers, workspace, setting.bound_s, sampler)
            cpu = cpu_spent(cpu_before, cpu_by_process(groups))
            stats = server.stats(records=True)
            observed = Observed(
                stats, sampler.peak_sum_mb, sum(cpu.values()), sum(sampler.processes.values()),
                sampler.peak_pss_sum_mb, cpu_by_role=cpu,
            )  # fmt: skip
            waits = schedule_to_start(client, batch, stats["records"])
        finally:
            client.close()
    measured = orga_measurement(setting, batch, observed, waits, alone_s)
    return replace(measured, gaps=gaps(stats["records"], markers, batch.started))


@dataclass(frozen=True)
class Observed:
    """What the model server and the sampler saw of one system's batch."""

    stats: dict[str, Any]
    peak_rss_mb: float
    cpu_s: float
    processes: int = 1
    peak_pss_mb: float = 0.0
    cpu_by_role: dict[str, float] = field(default_factory=dict)
    """CPU seconds by process role (orga-queue: coordinator, redis, each worker)."""


def orga_measurement(
    setting: Setting, batch: Batch, observed: Observed, waits: Waits, alone_s: float
) -> Measurement:
    plan, stats = setting.plan, observed.stats
    notes = [
        f"ready {alone_s:.1f} s after start (a first task of {plan.iterations} iterations, "
        "submitted as the processes start, completed)",
        f"submitting took {batch.submitted - batch.started:.2f} s",
        f"coordinator, worker trees and Redis: {observed.processes} processes at most (RSS "
        "summed; PSS splits each shared page between the processes sharing it)",
    ]
    if not batch.finished:
        notes.append(
            f"NOT FINISHED: {len(batch.statuses)} of {len(batch.ids)} tasks ended within the "
            f"{batch.end - batch.started:.0f} s bound"
        )
    if batch.completed != len(batch.statuses):
        others = sorted({s for s in batch.statuses.values() if s != "completed"})
        notes.append(f"{len(batch.statuses) - batch.completed} tasks ended {others}")
    return Measurement(
        system="orga-queue, default `orga worker`",
        key="slow_model",
        latency_s=setting.latency,
        runs=plan.tasks,
        iterations=plan.iterations,
        completed=batch.completed,
        seconds=batch.end - batch.started,
        calls=answered_calls(stats["records"], batch.end),
        total_calls=int(stats["calls"]),
        duplicates=int(stats["duplicates"]),
        peak_inflight=int(stats["peak_inflight"]),
        mean_inflight=float(stats["mean_inflight"]),
        peak_rss_mb=observed.peak_rss_mb,
        peak_pss_mb=observed.peak_pss_mb,
        cpu_s=observed.cpu_s,
        notes=tuple(notes),
        waits=waits,
        cpu_by_role=observed.cpu_by_role,
        redis_commands=batch.redis_commands,
    )


PEER_SYSTEMS = {
    "asyncio-aiohttp": "plain asyncio, aiohttp (one session)",
    "asyncio-httpx20": "plain asyncio, httpx in pools of 20",
    "langgraph-aiohttp": "LangGraph (InMemorySaver), aiohttp",
    "langgraph-httpx20": "LangGraph (InMemorySaver), httpx in pools of 20",
    "asyncio-httpx200": "footnote: plain asyncio, ONE httpx client of 200 (handicapped)",
    "asyncio-orgapool": "footnote: plain asyncio, the runtime's HTTP path (JsonPoster, aiohttp)",
    "arq-default": "arq, a job per iteration, default poll (0.5 s)",
    "arq-fast": "arq, a job per iteration, poll 0.05 s",
    "arq-fast-2": "arq, a job per iteration, poll 0.05 s, 2 worker processes",
}


def result_key(system: str) -> str:
    """``asyncio-aiohttp`` -> ``asyncio_aiohttp``; ``arq-fast`` -> ``arq_fast_poll``;
    ``arq-fast-2`` -> ``arq_fast_poll_2_workers``."""
    if system in ARQ_WORKERS:
        poll = system.removeprefix("arq-").rsplit("-", 1)[0]
        return f"arq_{poll}_poll_{ARQ_WORKERS[system]}_workers"
    if system.startswith("arq-"):
        return f"arq_{system.removeprefix('arq-')}_poll"
    return system.replace("-", "_")


def measure_peer(setting: Setting, peer: str) -> Measurement | str:
    """One peer in a process of its own; its measurement, or why it could not run."""
    if peer in ARQ_POLLS:
        return measure_arq(setting, peer)
    plan, server, latency, bound_s = setting.plan, setting.server, setting.latency, setting.bound_s
    name = f"peer-{peer}-{latency:g}s-{uuid.uuid4().hex[:4]}"
    go_file = setting.root / f"{name}.go"
    command = [
        sys.executable, "-m", "bench.slow_model_peers", peer, "--base-url", server.url,
        "--api-key", API_KEY, "--model", MODEL, "--tasks", str(plan.tasks),
        "--iterations", str(plan.iterations), "--workspace", str(setting.workspace),
        "--run-id", f"{peer}{uuid.uuid4().hex[:6]}", "--timeout", str(bound_s),
        "--go-file", str(go_file),
    ]  # fmt: skip
    log = setting.root / f"{name}.log"
    print(f"-- {peer} at {latency:g} s", flush=True)
    child = Child(f"peer-{peer}", command, dict(os.environ), log)
    child.start()
    sampler = Sampler({"peer": [child.pid]})
    # An unavailable peer prints why and exits instead: read below.
    with contextlib.suppress(AssertionError):
        child.wait_for_log("warmed up", READY_TIMEOUT_S)
    server.reset()
    go_file.touch()
    deadline = time.monotonic() + bound_s + 120
    while child.alive() and time.monotonic() < deadline:
        sampler.sample()
        time.sleep(POLL_EVERY_S)
    child.stop()
    outcome = _peer_outcome(log)
    if outcome is None:
        return f"{peer} printed no result:\n{child.tail()}"
    if "unavailable" in outcome:
        return f"{peer}: {outcome['unavailable']}"
    stats = server.stats(records=True)
    observed = Observed(
        stats, sampler.peak_sum_mb, float(outcome["cpu_s"]), peak_pss_mb=sampler.peak_pss_sum_mb,
    )  # fmt: skip
    return peer_measurement(setting, peer, outcome, observed)


def arq_workers(peer: str) -> int:
    """How many arq worker processes ``peer`` runs: :data:`ARQ_WORKERS`' count, else as many
    as the runtime's default reasoning processes."""
    from shared.settings import OrgaSettings

    default = int(OrgaSettings.model_fields["reasoning_processes"].default)
    return ARQ_WORKERS.get(peer, default)


def measure_arq(setting: Setting, peer: str) -> Measurement | str:
    """arq: a private Redis, as many arq workers as the runtime starts reasoning processes
    (``ORGA_REASONING_PROCESSES``' default; :data:`ARQ_WORKERS` fixes it for a set-up),
    each holding ``ORGA_REASONING_CONCURRENCY``'s default jobs at once; one warm-up run, then
    the batch. CPU and memory of the workers and their Redis over the batch, Redis commands
    from ``INFO commandstats``."""
    import redis as redis_py

    from bench.slow_model_arq import arq_missing
    from orga.embedded_redis import EmbeddedRedis
    from shared.settings import OrgaSettings

    missing = arq_missing()
    if missing is not None:
        return f"{peer}: {missing}"
    plan, server, latency, bound_s = setting.plan, setting.server, setting.latency, setting.bound_s
    processes = arq_workers(peer)
    max_jobs = int(OrgaSettings.model_fields["reasoning_concurrency"].default)
    root = setting.root / f"{peer}-{latency:g}s-{uuid.uuid4().hex[:4]}"
    root.mkdir(parents=True)
    print(f"-- {peer} at {latency:g} s ({processes} arq workers)", flush=True)
    redis_server = EmbeddedRedis().start()
    workers: list[Child] = []
    client = redis_py.Redis.from_url(redis_server.url)
    try:
        for n in range(processes):
            command = [
                sys.executable, "-m", "bench.slow_model_arq", "worker",
                "--redis-url", redis_server.url, "--base-url", server.url,
                "--api-key", API_KEY, "--model", MODEL, "--workspace", str(setting.workspace),
                "--max-jobs", str(max_jobs), "--poll-delay", str(ARQ_POLLS[peer]),
            ]  # fmt: skip
            workers.append(Child(f"arq-{n}", command, dict(os.environ), root / f"w{n}.log"))
            workers[-1].start()
        for worker in workers:
            worker.wait_for_log("arq worker ready")

        def submit(tasks: int, run_id: str) -> dict[str, Any] | None:
            command = [
                sys.executable, "-m", "bench.slow_model_arq", "submit", "--redis-url",
                redis_server.url, "--tasks", str(tasks), "--run-id", run_id,
                "--timeout", str(bound_s),
            ]  # fmt: skip
            log = root / f"submit-{run_id}.log"
            child = Child("arq-submit", command, dict(os.environ), log).start()
            deadline = time.monotonic() + bound_s + 60
            while child.alive() and time.monotonic() < deadline:
                sampler.sample()
                time.sleep(POLL_EVERY_S)
            child.stop()
            return _peer_outcome(log)

        groups = {"workers": [w.pid for w in workers], "redis": [redis_server.pid or 0]}
        sampler = Sampler(groups)
        warm = submit(1, f"{peer}{uuid.uuid4().hex[:6]}-warmup")
        if warm is None or warm.get("completed") != 1:
            return f"{peer}: the warm-up run did not finish: {warm}"
        server.reset()
        commands_before = redis_commands(client)
        cpu_before = cpu_by_process(groups)
        outcome = submit(plan.tasks, f"{peer}{uuid.uuid4().hex[:6]}")
        cpu = cpu_spent(cpu_before, cpu_by_process(groups))
        commands = redis_commands(client) - commands_before
        if outcome is None:
            return f"{peer} printed no result:\n{workers[0].tail()}"
        stats = server.stats(records=True)
    finally:
        client.close()
        for worker in workers:
            worker.stop()
        redis_server.close()
    observed = Observed(
        stats, sampler.peak_sum_mb, sum(cpu.values()), sum(sampler.processes.values()),
        sampler.peak_pss_sum_mb, cpu_by_role=cpu,
    )  # fmt: skip
    measured = peer_measurement(setting, peer, outcome, observed)
    return replace(measured, redis_commands=commands)


def measure_latency(
    root: Path, plan: Plan, latency: float, systems: Sequence[str], repeat: int = 0
) -> list[Measurement | str]:
    """Each system in turn (``orga`` the runtime, else a peer) against one model server."""
    workspace = make_workspace(root)
    results: list[Measurement | str] = []
    with model_server(root, plan, latency, plan.iterations) as server:
        setting = Setting(root, server, plan, latency, workspace)
        for system in systems:
            outcome = measure_orga(setting) if system == "orga" else measure_peer(setting, system)
            results.append(outcome if isinstance(outcome, str) else replace(outcome, repeat=repeat))
    return results


def measure_events(root: Path, plan: Plan) -> list[str]:
    """The runtime with task events on (``ORGA_TASK_EVENTS=true``, the default, which Flower's
    task list needs) and off, side by side at the first latency: CPU per model call of every
    process of the runtime (no Flower runs: this is what sending the events costs)."""
    latency = plan.latencies[0]
    workspace = make_workspace(root)
    lines: list[str] = []
    with model_server(root, plan, latency, plan.iterations) as server:
        setting = Setting(root, server, plan, latency, workspace)
        for on in (True, False):
            measured = measure_orga(setting, task_events=on)
            name = f"flower_events_cpu_ms_per_call_{'on' if on else 'off'}"
            print(f"   events {'on' if on else 'off'}: {measured.calls} calls, "
                  f"{measured.completed} of {measured.runs} tasks", flush=True)  # fmt: skip
            lines.append(f"RESULT {name} {measured.cpu_ms_per_call:.2f}")
    return lines


STREAMED_WORDS = 100
"""Words of text in each reply of the streaming run: about 100 pieces to stream per call."""
STREAM_CHUNK_DELAY_S = 0.01
"""The pause between two streamed frames in the streaming run (100 frames a second)."""


def measure_streaming(root: Path, plan: Plan) -> list[str]:
    """The runtime with token streaming off (``ORGA_STREAM_TOKENS=false``) and on (the
    default), side by side at the first latency, against replies of ``STREAMED_WORDS`` words
    (streamed a frame every ``STREAM_CHUNK_DELAY_S``; whole after the latency when not): CPU
    per model call of every process of the runtime, Redis included."""
    latency = plan.latencies[0]
    workspace = make_workspace(root)
    extra = ["--text-words", str(STREAMED_WORDS), "--chunk-delay", str(STREAM_CHUNK_DELAY_S)]
    lines: list[str] = []
    with model_server(root, plan, latency, plan.iterations, extra) as server:
        setting = Setting(root, server, plan, latency, workspace)
        for on in (False, True):
            measured = measure_orga(setting, stream_tokens=on)
            roles = ", ".join(
                f"{role} {ms:.2f}" for role, ms in measured.cpu_ms_per_call_by_role().items()
            )
            print(f"   streaming {'on' if on else 'off'}: {measured.calls} calls, "
                  f"{measured.completed} of {measured.runs} tasks; ms per call: {roles}",
                  flush=True)  # fmt: skip
            name = "slow_model_cpu_ms_per_call_streaming" + ("" if on else "_off")
            lines.append(f"RESULT {name} {measured.cpu_ms_per_call:.2f}")
    return lines


def _peer_outcome(log: Path) -> dict[str, Any] | None:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            outcome: dict[str, Any] = json.loads(line)
            return outcome
    return None


def peer_measurement(
    setting: Setting, peer: str, outcome: dict[str, Any], observed: Observed
) -> Measurement:
    plan, stats = setting.plan, observed.stats
    notes = [f"{outcome['failed']} runs failed: {outcome['errors']}"] if outcome["failed"] else []
    if outcome["unfinished"]:
        notes.append(f"NOT FINISHED: {outcome['unfinished']} runs still going at the bound")
    return Measurement(
        system=PEER_SYSTEMS[peer],
        key=result_key(peer),
        latency_s=setting.latency,
        runs=plan.tasks,
        iterations=plan.iterations,
        completed=int(outcome["completed"]),
        seconds=float(outcome["finished"]) - float(outcome["started"]),
        calls=answered_calls(stats["records"], float(outcome["finished"])),
        total_calls=int(stats["calls"]),
        duplicates=int(stats["duplicates"]),
        peak_inflight=int(stats["peak_inflight"]),
        mean_inflight=float(stats["mean_inflight"]),
        peak_rss_mb=observed.peak_rss_mb,
        peak_pss_mb=observed.peak_pss_mb,
        cpu_s=observed.cpu_s,
        notes=tuple(notes),
    )


# -- fairness ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fairness:
    """Thousands of tasks at once: how long until the last one's first model call, memory."""

    tasks: int
    iterations: int
    started_tasks: int
    completed: int
    finished: bool
    seconds: float
    submit_s: float
    spread_s: float
    last_task_wait_s: float
    peak_inflight: int
    duplicates: int
    peak_mb: dict[str, float]
    peak_redis_used_mb: float

    @property
    def peak_rss_mb(self) -> float:
        """Coordinator and workers (every process of their trees), each at its own peak."""
        return self.peak_mb.get("coordinator", 0.0) + self.peak_mb.get("workers", 0.0)


def measure_fairness(root: Path, plan: Plan) -> Fairness:
    """``fairness_tasks`` tasks submitted at once against a 1 s model."""
    latency, iterations = plan.fairness_latency, plan.fairness_iterations
    workspace = make_workspace(root)
    run = uuid.uuid4().hex[:8]
    with (
        model_server(root, plan, latency, iterations) as server,
        orga_stack(root / "orga-fairness", server) as stack,
    ):
        client = OrgaClient(stack.url)
        try:
            print(f"-- fairness: starting ({stack.describe()})", flush=True)
            wait_ready(stack, client, workspace, run)
            server.reset()
            groups = stack.pids()
            del groups["redis"]
            sampler = Sampler(groups, redis_client=client.redis)
            markers = [f"{run}-{n}" for n in range(plan.fairness_tasks)]
            print(f"   ready; {len(markers)} tasks x {iterations} iterations", flush=True)
            bound = plan.timeout_s or FAIRNESS_BOUND_S
            batch = submit_batch(client, markers, workspace, bound, sampler)
            stats = server.stats(records=True)
        finally:
            client.close()
    return fairness_of(plan, batch, stats, sampler)


def fairness_of(plan: Plan, batch: Batch, stats: dict[str, Any], sampler: Sampler) -> Fairness:
    firsts = {
        marker: start for (marker, turn), start in first_starts(stats["records"]).items()
        if turn == 1
    }  # fmt: skip
    started = [firsts[m] for m in batch.markers if m in firsts]
    earliest = min(started) if started else batch.end
    all_started = len(started) == len(batch.markers)
    latest = max(started) if all_started else batch.end
    last_marker = batch.markers[-1]
    return Fairness(
        tasks=len(batch.ids),
        iterations=plan.fairness_iterations,
        started_tasks=len(started),
        completed=batch.completed,
        finished=batch.finished,
        seconds=batch.end - batch.started,
        submit_s=batch.submitted - batch.started,
        spread_s=latest - earliest,
        last_task_wait_s=firsts.get(last_marker, batch.end) - batch.started,
        peak_inflight=int(stats["peak_inflight"]),
        duplicates=int(stats["duplicates"]),
        peak_mb=dict(sampler.peak_mb),
        peak_redis_used_mb=sampler.peak_redis_used_mb,
    )


# -- report -----------------------------------------------------------------------------------


def spread_text(values: Sequence[float]) -> str:
    if not values:
        return "none measured"
    return (
        f"mean {statistics.fmean(values):.2f} s, p50 {statistics.median(values):.2f} s, "
        f"p95 {percentile(values, 95):.2f} s, "
        f"max {max(values):.2f} s (n={len(values)})"
    )


def table(measurements: Sequence[Measurement]) -> str:
    """The comparison, as Markdown."""
    lines = [
        "| system | latency | repeat | iterations/s | share of the latency limit | calls in "
        "flight, peak / mean | peak RSS (sum) | peak PSS | MB per in-flight run (PSS) | CPU ms "
        "per call | Redis commands per call | duplicate calls | completed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in measurements:
        share = f"{m.share:.0%} of {m.limit_per_s:.0f}/s" if m.latency_s > 0 else "-"
        commands = f"{m.redis_commands_per_call:.1f}" if m.redis_commands else "-"
        lines.append(
            f"| {m.system} | {m.latency_s:g} s | {m.repeat + 1} | {m.iterations_per_s:.1f} "
            f"({m.calls} in {m.seconds:.1f} s) | {share} | {m.peak_inflight} "
            f"/ {m.mean_inflight:.0f} | {m.peak_rss_mb:.0f} MB | {m.peak_pss_mb:.0f} MB | "
            f"{m.mb_per_inflight:.2f} | "
            f"{m.cpu_ms_per_call:.1f} | {commands} | {m.duplicates} | {m.completed} of {m.runs} |"
        )
    return "\n".join(lines)


def notes(measurements: Sequence[Measurement]) -> list[str]:
    lines = []
    for m in measurements:
        for note in m.notes:
            lines.append(f"- {m.system}, {m.latency_s:g} s: {note}")
        if m.cpu_by_role:
            split = ", ".join(
                f"{role} {ms:.2f}" for role, ms in m.cpu_ms_per_call_by_role().items()
            )
            lines.append(
                f"- {m.system}, {m.latency_s:g} s: CPU ms per model call by process: {split}"
            )
        if m.waits.seconds:
            unstarted = (
                f"; {m.waits.unstarted} never started (counted with their wait so far)"
                if m.waits.unstarted
                else ""
            )
            lines.append(
                f"- {m.system}, {m.latency_s:g} s: schedule-to-start of a reasoning request "
                f"(coordinator dispatch -> model call): {spread_text(m.waits.seconds)}"
                f"{unstarted}"
            )
        if m.gaps.first_call:
            lines.append(
                f"- {m.system}, {m.latency_s:g} s: submission -> a run's first model call: "
                f"{spread_text(m.gaps.first_call)}; a reply -> the run's next model call: "
                f"{spread_text(m.gaps.between_calls)}"
            )
        if m.waits.first_dispatch:
            lines.append(
                f"- {m.system}, {m.latency_s:g} s: the burst, submission -> a run's Started "
                f"(its create prepared): {spread_text(m.waits.first_dispatch)}; Started -> its "
                f"first model call: {spread_text(m.waits.first_wait)}"
            )
    return lines


def result_lines(measurements: Sequence[Measurement], unavailable: dict[str, str]) -> list[str]:
    """The ``RESULT`` lines: the share of the latency limit per system and latency (the mean
    over the repeats, each repeat beside it), then the runtime's headline figures, then the
    zero-latency iterations per second."""
    lines = []
    grouped: dict[tuple[str, float], list[Measurement]] = {}
    for m in measurements:
        grouped.setdefault((m.key, m.latency_s), []).append(m)
    for (key, latency), group in grouped.items():
        if latency <= 0:
            continue
        shares = [m.share for m in group]
        unfinished = [m for m in group if m.completed < m.runs]
        tail = " (repeats " + " / ".join(f"{v:.3f}" for v in shares) + ")" if len(group) > 1 else ""
        if unfinished:
            tail += f" (not finished: {unfinished[0].completed} of {unfinished[0].runs} completed)"
        lines.append(f"RESULT {key}_{latency:g}s_limit_share {statistics.fmean(shares):.3f}{tail}")
    for peer, why in unavailable.items():
        lines.append(f"RESULT {result_key(peer)}_1s_limit_share unavailable: {why}")
    orga = [m for m in measurements if m.key == "slow_model" and m.latency_s > 0]
    if orga:
        first_latency = orga[0].latency_s
        first = [m for m in orga if m.latency_s == first_latency]

        def spread(values: Sequence[float]) -> str:
            if len(values) < 2:
                return ""
            return " (repeats " + " / ".join(f"{v:.2f}" for v in values) + ")"

        cpu = [m.cpu_ms_per_call for m in first]
        commands = [m.redis_commands_per_call for m in first]
        lines.append(f"RESULT slow_model_peak_inflight {max(m.peak_inflight for m in orga)}")
        lines.append(f"RESULT slow_model_mb_per_inflight {first[0].mb_per_inflight:.2f}")
        lines.append(
            f"RESULT slow_model_peak_pss_mb {max(m.peak_pss_mb for m in first):.0f} "
            "(coordinator, workers and Redis)"
        )
        lines.append(f"RESULT slow_model_cpu_ms_per_call {statistics.fmean(cpu):.2f}{spread(cpu)}")
        lines.append(
            f"RESULT redis_commands_per_call {statistics.fmean(commands):.1f}{spread(commands)}"
        )
        for m in orga:
            if m.latency_s != first_latency:
                lines.append(
                    f"RESULT slow_model_{m.latency_s:g}s_cpu_ms_per_call {m.cpu_ms_per_call:.2f}"
                )
        lines.append(f"RESULT slow_model_duplicate_calls {sum(m.duplicates for m in orga)}")
        lines.append(f"RESULT slow_model_completed {sum(m.completed for m in orga)}")
        for m in orga:
            if m.waits.seconds:
                wait = statistics.median(m.waits.seconds)
                lower = " (lower bound)" if m.waits.unstarted else ""
                again = f" (repeat {m.repeat + 1})" if m.repeat else ""
                lines.append(
                    f"RESULT slow_model_{m.latency_s:g}s_schedule_to_start_p50_s {wait:.2f}"
                    f"{lower}{again}"
                )
    for peer in measurements:
        if peer.key != "slow_model" and peer.latency_s == (orga[0].latency_s if orga else 1.0):
            lines.append(
                f"RESULT {peer.key}_cpu_ms_per_call {peer.cpu_ms_per_call:.2f} (repeat "
                f"{peer.repeat + 1})"
            )
    for m in measurements:
        if m.latency_s <= 0:
            name = (
                "zero_latency_iter_per_s"
                if m.key == "slow_model"
                else (f"{m.key}_zero_latency_iter_per_s")
            )
            lines.append(
                f"RESULT {name} {m.iterations_per_s:.0f} ({m.cpu_ms_per_call:.2f} ms CPU per "
                "iteration)"
            )
    return lines


def fairness_report(f: Fairness) -> str:
    bound = "" if f.started_tasks == f.tasks else " (lower bound: not every task started)"
    rows = [
        ("tasks x iterations submitted at once (1 s model)", f"{f.tasks} x {f.iterations}"),
        ("submitting took", f"{f.submit_s:.1f} s"),
        ("tasks whose first model call came", f"{f.started_tasks} of {f.tasks}"),
        ("first task's first call -> last task's first call", f"{f.spread_s:.1f} s{bound}"),
        ("first submission -> the last-submitted task's first call", f"{f.last_task_wait_s:.1f} s"),
        ("completed", f"{f.completed} of {f.tasks} in {f.seconds:.1f} s"),
        ("model calls in flight, peak", str(f.peak_inflight)),
        ("duplicate model calls", str(f.duplicates)),
        ("peak RSS, coordinator", f"{f.peak_mb.get('coordinator', 0.0):.0f} MB"),
        ("peak RSS, workers (all processes)", f"{f.peak_mb.get('workers', 0.0):.0f} MB"),
        ("peak Redis used_memory", f"{f.peak_redis_used_mb:.0f} MB"),
    ]
    body = "\n".join(f"| {a} | {b} |" for a, b in rows)
    lower = f" (lower bound: {f.started_tasks} of {f.tasks} tasks started)" if bound else ""
    results = [
        f"RESULT fairness_first_iteration_spread_s {f.spread_s:.1f}{lower}",
        f"RESULT fairness_peak_rss_mb {f.peak_rss_mb:.0f}",
        f"RESULT fairness_redis_used_memory_mb {f.peak_redis_used_mb:.0f}",
        f"RESULT fairness_completed {f.completed}",
        f"RESULT fairness_duplicate_calls {f.duplicates}",
    ]
    return "| fairness | value |\n|---|---|\n" + body + "\n\n" + "\n".join(results)


# -- command line -----------------------------------------------------------------------------


def parse_plan(args: argparse.Namespace) -> Plan:
    plan = Plan(tasks=50, latencies=(1.0,), fairness_tasks=300, repeats=1) if args.quick else Plan()
    chosen: dict[str, Any] = {
        "tasks": args.tasks,
        "iterations": args.iterations,
        "timeout_s": args.timeout,
        "fairness_tasks": args.fairness_tasks,
        "fairness_iterations": args.fairness_iterations,
        "jitter": args.jitter,
        "reasoning_processes": args.reasoning_processes,
    }
    if args.latency:
        chosen["latencies"] = tuple(float(v) for v in args.latency.split(",") if v)
    if args.no_peers:
        chosen["peers"] = ()
        chosen["footnote_peers"] = ()
    elif args.peers:
        chosen["peers"] = tuple(p for p in args.peers.split(",") if p)
    if args.repeats is not None:
        chosen["repeats"] = args.repeats
    if args.no_zero_latency:
        chosen["zero_latency"] = False
    if args.no_footnotes:
        chosen["footnote_peers"] = ()
    return replace(plan, **{k: v for k, v in chosen.items() if v is not None})


def run_comparison(root: Path, plan: Plan) -> None:
    """Every system at every latency (the first ``plan.repeats`` times, the order reversed
    every other batch), the footnote set-ups, then the zero-latency run."""
    measured: list[Measurement] = []
    footnotes: list[Measurement] = []
    unavailable: dict[str, str] = {}

    def keep(outcomes: list[Measurement | str], into: list[Measurement]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, str):
                peer = outcome.split(":", 1)[0].split()[0]
                unavailable[peer] = outcome.splitlines()[0]
                print(f"   {outcome}", flush=True)
            else:
                into.append(outcome)

    systems = ("orga", *plan.peers)
    batch = 0
    for index, latency in enumerate(plan.latencies):
        for repeat in range(plan.repeats if index == 0 else 1):
            order = systems if batch % 2 == 0 else tuple(reversed(systems))
            batch += 1
            print(f"== {latency:g} s, repeat {repeat + 1}: {', '.join(order)}", flush=True)
            folder = root / f"{latency:g}s-{repeat}"
            keep(measure_latency(folder, plan, latency, order, repeat), measured)
    if plan.footnote_peers and plan.latencies:
        latency = plan.latencies[0]
        print(f"== footnotes at {latency:g} s", flush=True)
        folder = root / "footnotes"
        keep(measure_latency(folder, plan, latency, plan.footnote_peers), footnotes)
    if plan.zero_latency:
        zero = [s for s in ZERO_LATENCY_SYSTEMS if s == "orga" or s in plan.peers]
        print(f"== zero latency: {', '.join(zero)}", flush=True)
        keep(measure_latency(root / "0s", plan, 0.0, zero), measured)
    print(f"\n{plan.tasks} runs x {plan.iterations} model calls, latency ±{plan.jitter:.0%}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end\n")  # fmt: skip
    print(table(measured))
    if footnotes:
        print("\nFootnotes (not peers: set-ups for comparison only)\n")
        print(table(footnotes))
    print("\n".join(["", *notes(measured), *notes(footnotes), ""]))
    print("\n".join(result_lines(measured, unavailable)))
    for m in footnotes:
        print(f"footnote {m.key}_{m.latency_s:g}s_limit_share {m.share:.3f}, "
              f"{m.cpu_ms_per_call:.2f} ms CPU per call")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 tasks, 1 s only (smoke run)")
    parser.add_argument("--fairness", action="store_true", help="run the fairness test only")
    parser.add_argument("--latency", help="model latencies in seconds, e.g. 1,3")
    parser.add_argument("--tasks", type=int, help="runs submitted at once (200)")
    parser.add_argument("--iterations", type=int, help="model calls per run (5)")
    parser.add_argument("--timeout", type=float, help="bound of each batch in seconds")
    parser.add_argument(
        "--jitter", type=float, help="the model's latency drawn in latency × (1 ± this) (0.2)"
    )
    parser.add_argument("--no-peers", action="store_true", help="orga-queue alone")
    parser.add_argument("--peers", help=f"peers, comma-separated ({','.join(PEERS)})")
    parser.add_argument("--repeats", type=int, help="repeats at the first latency (2)")
    parser.add_argument("--no-zero-latency", action="store_true", help="skip the 0 s run")
    parser.add_argument("--no-footnotes", action="store_true", help="skip the footnote set-ups")
    parser.add_argument("--fairness-tasks", type=int, help="tasks of the fairness run (2000)")
    parser.add_argument("--fairness-iterations", type=int, help="calls per fairness task (2)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    parser.add_argument(
        "--reasoning-processes",
        type=int,
        help="ORGA_REASONING_PROCESSES for the runtime (its default when not given)",
    )
    parser.add_argument(
        "--events", action="store_true", help="task events on and off only (CPU per call)"
    )
    parser.add_argument(
        "--streaming", action="store_true", help="token streaming off and on only (CPU per call)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    plan = parse_plan(args)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="orga-slow-model-"))
    try:
        if args.fairness:
            print("\n" + fairness_report(measure_fairness(root, plan)))
        elif args.events:
            print("\n".join(["", *measure_events(root, plan)]))
        elif args.streaming:
            print("\n".join(["", *measure_streaming(root, plan)]))
        else:
            run_comparison(root, plan)
    finally:
        if args.keep:
            print(f"logs in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
