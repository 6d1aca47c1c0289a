"""Fault injection under load: worker, coordinator and Redis crashes while tasks run.

Run: ``.venv/bin/python bench/chaos.py`` (``make chaos``); ``--tasks 20`` for a short run.

It starts a private Redis with AOF on (:class:`~orga.embedded_redis.EmbeddedRedis`), two
Celery workers (one on ``orga.reasoning``, one on ``orga.tools``, ``-c 2`` each) and one
``orga coordinator``, all real processes, and submits ``--tasks`` tasks at once. Each task's
scripted model asks for ``--iterations`` ``run_command`` calls (``sleep 0.05; echo step-N``), one
per iteration, then answers ``finished-<index>``. While they run:

- every ``--kill-every`` seconds a random Celery pool process (a child of a worker main process)
  is killed with SIGKILL;
- once, at ``--coordinator-at`` of the expected progress, the coordinator is frozen (SIGSTOP)
  for ``--coordinator-freeze`` seconds so observations pile up, resumed until it has read a batch
  of them, killed with SIGKILL holding that batch, and a new ``orga coordinator`` is
  started, as a supervisor would;
- once, at ``--redis-at``, Redis is stopped (SIGKILL by default, ``--redis-signal term`` for a
  clean shutdown), left down ``--redis-down`` seconds and started again on the same port with
  the same AOF directory; ``--redis-loss S`` makes it a host crash instead, where the AOF also
  loses the writes of the last S seconds (what ``appendfsync everysec`` can lose).

A process that exits on its own (not killed by the script) is restarted, as systemd or
Kubernetes would, and reported as an UNEXPECTED EXIT.

Pass criteria, checked at the end (exit code 1 when one fails): no task lost (every submitted id
has a record); every task completed with its model's answer; every journal contiguous from
sequence 0; no iteration applied twice (``ReasoningComplete``, ``ToolsDispatched`` and
``ObservationsCollected`` unique per step and iteration); every tool output exactly once in the
conversation; exactly one terminal event per task.

Recovery is measured from the journals (each entry carries the time the coordinator applied it),
from Celery's task events (which dispatch a killed pool process was running; the workers run with
``--task-events`` for this), from the coordinator's ``redispatched`` events and from the
observations the killed coordinator left pending. For each kind of fault the table gives the
median / max over the faults of: the time until the next observation was applied anywhere; until
throughput (observations applied per second, 1 s windows) was back to 80% of the 5 s before the
fault; the throughput lost, in seconds of pre-fault throughput over the 10 s after it; and when
the work the fault hit was applied (killed dispatches, pending observations, dispatches lost and
re-sent at the observation deadline), next to the bound the settings give.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import Celery
from redis.exceptions import RedisError, ResponseError

from coordinator.client import OrgaClient
from coordinator.state import TERMINAL_STATUSES, TaskRecord
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.conversation import MessageRole
from shared.errors import WireFormatError
from shared.events import JournalEntry
from shared.protocol import ReasonedMessage, ToolObservedMessage, decode_entry
from tests.integration.harness import Process

__all__ = [
    "ChaosPlan",
    "ChaosReport",
    "Dispatch",
    "Fault",
    "main",
    "run_chaos",
]

FaultKind = Literal["worker", "coordinator", "redis"]
FAULT_KINDS: tuple[FaultKind, ...] = ("worker", "coordinator", "redis")
APPLIED_EVENTS = ("ReasoningComplete", "ObservationsCollected")
"""Journal events that mark an observation applied (a reasoning answer, a tool batch)."""
EFFECTS_FILE = "effects.log"
SIDE_EFFECT = f"echo step-{{i}} >> {EFFECTS_FILE}; echo step-{{i}}"
"""What each chaos command does besides answering: one line appended to the task's workspace,
so a command that ran twice leaves its line twice (``duplicate_side_effects``)."""

ONCE_PER_ITERATION = ("ReasoningComplete", "ToolsDispatched", "ObservationsCollected")
RECOVERED_SHARE = 0.8
PRE_FAULT_WINDOW_S = 5.0
LOSS_WINDOW_S = 10.0


_STILL_PENDING = """
local n = 0
for _, stream in ipairs(KEYS) do
  local rows = redis.pcall('XPENDING', stream, ARGV[1], '-', '+', 10000)
  if type(rows) == 'table' and not rows.err then  -- else no group yet: nothing read there
    for _, row in ipairs(rows) do
      if #redis.call('XRANGE', stream, row[1], row[1]) > 0 then n = n + 1 end
    end
  end
end
return n
"""
"""How many of the coordinators' pending observations (KEYS: the streams; ARGV[1]: the group)
are still on their stream, i.e. read and not applied yet."""


@dataclass(frozen=True)
class ChaosPlan:
    """The load, the faults and the coordinator timings of one chaos run.

    Fault times are shares of the expected progress (journal entries written), so the faults
    land mid-run on a fast or a slow machine. The timings are short so that recovery is fast,
    with one rule: the observation deadline must exceed the longest wait of a dispatch in its
    queue (about 10 s at 200 tasks on two tool processes here), else work that is only queued
    is re-dispatched. The coordinator recovers lost dispatches: the Redis broker has no
    visibility timeout (no ack emulation, docs/reliability.md §3.7).
    """

    tasks: int = 200
    iterations: int = 8
    command: str = f"sleep 0.05; {SIDE_EFFECT}"
    concurrency: int = 2
    coordinators: int = 1
    """Coordinators running at once (several share the tasks through their leases)."""
    kill_every_s: float = 3.0
    kill_from: float = 0.1
    kill_until: float = 0.9
    coordinator_at: float = 0.3
    coordinator_freeze_s: float = 1.0
    redis_at: float = 0.6
    redis_down_s: float = 1.0
    redis_signal: Literal["kill", "term"] = "kill"
    redis_loss_s: float = 0.0
    quiet_after_s: float = 6.0
    duration_s: float = 300.0
    seed: int = 1
    observation_deadline_s: float = 20.0
    tick_interval_s: float = 0.2
    lease_ttl_s: float = 3.0
    partition_lease_ttl_s: float = 3.0
    """A coordinator restarted after SIGKILL (another name) serves the partitions once the dead
    one's partition leases expire."""
    claim_idle_ms: int = 1500
    max_redeliveries: int = 3
    partitions: int = 1
    """``ORGA_PARTITIONS`` of every process and of the client: the checks read every
    partition's streams (``tests/integration`` passes the suite's count)."""

    def environment(self, redis_url: str, workspaces: Path) -> dict[str, str]:
        """The environment of every process started: this Redis and these timings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            {
                "ORGA_REDIS_URL": redis_url,
                "ORGA_WORKSPACE_ROOT": str(workspaces),
                "ORGA_OBSERVATION_DEADLINE_S": str(self.observation_deadline_s),
                # A killed worker's calls are found by their stopped heartbeats: scaled to D.
                "ORGA_HEARTBEAT_TIMEOUT_S": str(self.observation_deadline_s / 2),
                "ORGA_HEARTBEAT_INTERVAL_S": str(self.observation_deadline_s / 8),
                "ORGA_TICK_INTERVAL_S": str(self.tick_interval_s),
                "ORGA_LEASE_TTL_S": str(self.lease_ttl_s),
                "ORGA_PARTITION_LEASE_TTL_S": str(self.partition_lease_ttl_s),
                "ORGA_CLAIM_IDLE_MS": str(self.claim_idle_ms),
                "ORGA_MAX_REDELIVERIES": str(self.max_redeliveries),
                "ORGA_WORKER_CONCURRENCY": str(self.concurrency),
                "ORGA_PARTITIONS": str(self.partitions),
            }
        )
        return env

    def task(self, index: int) -> dict[str, Any]:
        """Task ``index``: ``iterations`` tool calls, then the answer ``finished-<index>``."""
        replies: list[Any] = [
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": self.command.format(i=i)}}
                ]
            }
            for i in range(self.iterations)
        ]
        return {
            "goal": f"chaos task {index}",
            "provider": {"kind": "scripted", "replies": [*replies, f"finished-{index}"]},
            "steps": [{"id": "work", "instruction": "run the commands"}],
            "limits": {"max_iterations": self.iterations + 5},
            "stagnation": {"enabled": False},
        }

    @property
    def journal_entries_per_task(self) -> int:
        """Started, four entries per iteration (the answer's included), Terminated."""
        return 2 + 4 * (self.iterations + 1)


# -- what a fault hit -------------------------------------------------------------------------


@dataclass
class Dispatch:
    """One unit of in-flight work a fault hit, and when its observation was applied."""

    task_id: str
    step_id: str
    iteration: int
    kind: Literal["reason", "tool"]
    via: Literal["requeue", "reclaim", "deadline"]
    applied_after_s: float | None = None
    resent: bool = False
    hit_again_after_s: float | None = None
    """Seconds after this fault when a later one hit the same work again: it was running (or
    sent again) by then, and the later fault's own recovery counts from there."""

    @property
    def recovered_after_s(self) -> float | None:
        """Seconds until the work was applied, or running again when a later fault hit it."""
        times = [t for t in (self.applied_after_s, self.hit_again_after_s) if t is not None]
        return min(times, default=None)

    @classmethod
    def from_token(cls, token: str, kind: str, via: Literal["deadline"]) -> Dispatch:
        """From a fence token ``task/step/iteration/attempt`` and an awaited kind."""
        task_id, step_id, iteration, _attempt = token.split("/")[:4]
        work: Literal["reason", "tool"] = "reason" if kind in ("reason", "plan") else "tool"
        return cls(task_id, step_id, int(iteration), work, via)

    @property
    def key(self) -> tuple[str, str, int, str]:
        """Identifies the iteration and phase, whatever the attempt."""
        return (self.task_id, self.step_id, self.iteration, self.kind)

    def applied_at(self, journal: Sequence[JournalEntry]) -> float | None:
        """When the coordinator applied this dispatch's observation (None: never)."""
        event, iteration = (
            ("ReasoningComplete", self.iteration + 1)
            if self.kind == "reason"
            else ("ObservationsCollected", self.iteration)
        )
        for entry in journal:
            if (entry.event.type, entry.step_id, entry.iteration) == (
                event,
                self.step_id,
                iteration,
            ):
                return entry.timestamp.timestamp()
        return None


@dataclass
class Fault:
    """One injected fault: when, what, when the replacement was up, and what it cost."""

    kind: FaultKind
    at: float
    detail: str
    back_at: float | None = None
    killed_at: float | None = None
    worker: str | None = None
    hit: list[Dispatch] = field(default_factory=list)
    first_apply_s: float | None = None
    throughput_back_s: float | None = None
    throughput_lost_s: float | None = None


@dataclass(frozen=True)
class Requeue:
    """Celery put a dispatch back in its queue because the pool process running it died."""

    at: float
    hostname: str
    dispatch: Dispatch


class CeleryEvents:
    """Celery task events: what each task carried (``task-received``), and which were requeued
    after their pool process died (``task-rejected`` with ``requeue``), by which worker.
    Reconnects after a Redis restart."""

    def __init__(self, redis_url: str) -> None:
        self._app = Celery("orga-chaos", broker=redis_url)
        self.summaries: dict[str, tuple[str, str]] = {}
        self.requeues: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, name="celery-events", daemon=True)

    def start(self) -> CeleryEvents:
        """Listen in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (within about a second)."""
        self._stop.set()
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)

    def _run(self) -> None:
        handlers = {"task-received": self._received, "task-rejected": self._rejected}
        while not self._stop.is_set():
            try:
                with self._app.connection_for_read() as connection:
                    self._receiver = self._app.events.Receiver(connection, handlers=handlers)
                    self._receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:
                time.sleep(0.2)  # Redis restarts under us: reconnect

    def _received(self, event: dict[str, Any]) -> None:
        self.summaries[str(event["uuid"])] = (str(event.get("name")), str(event.get("args")))

    def _rejected(self, event: dict[str, Any]) -> None:
        if event.get("requeue"):
            made = float(event.get("timestamp") or time.time())
            self.requeues.append((made, str(event.get("hostname")), str(event["uuid"])))

    def requeued(self) -> list[Requeue]:
        """Every requeue whose dispatch is known, oldest first."""
        found = [
            Requeue(at, hostname, _requeued_dispatch(*self.summaries[uuid]))
            for at, hostname, uuid in self.requeues
            if uuid in self.summaries
        ]
        return sorted(found, key=lambda r: r.at)


def _requeued_dispatch(name: str, summary: str) -> Dispatch:
    """From the ``argsrepr`` the coordinator gives each Celery task (``task=... step=...``)."""
    fields = dict(re.findall(r"(\w+)=([^\s)]+)", summary))
    kind: Literal["reason", "tool"] = "reason" if name == keys.reason_task_name else "tool"
    return Dispatch(fields["task"], fields["step"], int(fields["iteration"]), kind, "requeue")


# -- the processes ----------------------------------------------------------------------------


@dataclass
class ChaosCluster:
    """The processes under test, the faults injected into them, and a supervisor."""

    plan: ChaosPlan
    server: EmbeddedRedis
    root: Path
    say: Callable[[str], None]
    workers: list[Process] = field(default_factory=list)
    coordinators: list[Process] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.plan.seed)
        self.env = self.plan.environment(self.server.url, self.root / "workspaces")
        self.redis = redis.Redis.from_url(self.server.url, socket_timeout=2)
        self._still_pending = self.redis.register_script(_STILL_PENDING)
        self._numbers = itertools.count(1)

    def start(self) -> None:
        """Both workers, then the coordinator."""
        self.workers += [self._worker(q) for q in (keys.reasoning_queue, keys.tools_queue)]
        self.coordinators += [self._coordinator() for _ in range(self.plan.coordinators)]

    def stop(self) -> None:
        """Stop every process still running."""
        for process in [*self.coordinators, *self.workers]:
            process.stop()
        self.redis.close()

    def _worker(self, queue: str) -> Process:
        role = queue.rsplit(".", 1)[-1]
        name = f"worker-{role}-{next(self._numbers)}"
        command = [
            sys.executable, "-m", "celery", "-A", "orga", "worker", "-Q", queue,
            "-c", str(self.plan.concurrency), "--loglevel", "INFO", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "-n", f"{name}-{os.getpid()}@%h",
            "--task-events",  # which dispatch a killed process ran, and its requeue
        ]  # fmt: skip
        process = Process(name, command, self.env, self.root / f"{name}.log").start()
        process.wait_for_log("ready.", timeout_s=60)
        return process

    def _coordinator(self) -> Process:
        command = [sys.executable, "-m", "orga.cli", "coordinator"]
        name = f"coordinator-{next(self._numbers)}"
        process = Process(name, command, self.env, self.root / f"{name}.log").start()
        process.wait_for_log("coordinator ", timeout_s=60)
        return process

    def supervise(self) -> None:
        """Restart a worker or coordinator that exited on its own, and say why it exited."""
        for process in [*self.workers, *self.coordinators]:
            if process.popen is None or process.popen.poll() is None:
                continue
            self.exits.append(f"{process.name} exited on its own ({_exit_reason(process)})")
            self.say(f"  {_clock(time.time())} exit:  {self.exits[-1]}; restarting it")
            if process in self.workers:
                self.workers.remove(process)
                self.workers.append(self._worker(process.command[process.command.index("-Q") + 1]))
            else:
                self.coordinators.remove(process)
                self.coordinators.append(self._coordinator())

    def kill_pool_process(self) -> Fault | None:
        """SIGKILL one random pool process; None when no worker has one right now."""
        candidates = [(w, pid) for w in self.workers for pid in w.children() if _alive(pid)]
        if not candidates:
            return None
        worker, pid = self.rng.choice(candidates)
        fault = Fault("worker", time.time(), f"{worker.name} pool process {pid}")
        fault.worker = worker.name
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return self._record(fault)

    def kill_coordinator(self) -> Fault:
        """Freeze the coordinator (SIGSTOP) for ``coordinator_freeze_s`` so observations pile
        up, let it run again until it has read a batch, SIGKILL it, and start a new one.
        The fault starts with the freeze: no observation is applied from then on.

        It dies holding observations it has read but not applied: they stay pending under its
        consumer name until a coordinator claims them (``XAUTOCLAIM``).
        """
        old = self.coordinators[-1]
        freeze = self.plan.coordinator_freeze_s
        fault = Fault("coordinator", time.time(), f"{old.name} pid {old.pid}")
        if freeze > 0:
            os.kill(old.pid, signal.SIGSTOP)
            time.sleep(freeze)
            os.kill(old.pid, signal.SIGCONT)
            self._stop_holding_a_read_batch(old.pid)
            fault.detail += f" frozen {freeze:g}s, then"
        fault.detail += " SIGKILL"
        fault.killed_at = time.time()
        old.kill()
        pending = self._pending_observations()
        fault.hit = [d for d in (_pending_dispatch(f) for f in pending.values()) if d]
        fault.detail += f" ({len(pending)} observations read, not applied)"
        self.coordinators.remove(old)
        self.coordinators.append(self._coordinator())
        fault.back_at = time.time()
        return self._record(fault)

    def _stop_holding_a_read_batch(self, pid: int, timeout_s: float = 5.0) -> None:
        """Let the coordinator run until it holds observations it has read and not applied,
        and stop it there (SIGSTOP): it applies a batch in a few milliseconds, so a kill that
        merely follows a poll can come too late."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._pending_count():
                os.kill(pid, signal.SIGSTOP)
                if self._pending_count():
                    return
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.001)

    def _observations_streams(self) -> list[str]:
        """Every partition's observations stream."""
        return keys.partition_streams(self.plan.partitions, keys.observations_stream)

    def _pending_count(self) -> int:
        """Observations read by a coordinator and not applied yet, over every partition, in
        one round trip (the coordinator applies a batch in milliseconds: a poll of one
        ``XPENDING`` per partition would mostly look after it): the pending entries still on
        their stream (an applied one is deleted, its delivery pending until the next claim)."""
        streams = self._observations_streams()
        return int(self._still_pending(keys=streams, args=[keys.coordinator_group]))

    def _pending_observations(self) -> dict[str, dict[Any, Any]]:
        """The observations read by a coordinator and not acknowledged yet, by entry id (the
        stream's name and the id: ids of two partitions' streams can be equal)."""
        found: dict[str, dict[Any, Any]] = {}
        for stream in self._observations_streams():
            try:
                rows = self.redis.xpending_range(
                    stream, keys.coordinator_group, min="-", max="+", count=10_000
                )
            except ResponseError:  # no group yet
                continue
            for row in rows:
                entry_id = row["message_id"]
                entries: Any = self.redis.xrange(stream, entry_id, entry_id)
                for _id, fields in entries or []:
                    found[f"{stream} {_text(entry_id)}"] = dict(fields or {})
        return found

    def restart_redis(self) -> Fault:
        """Stop Redis (SIGKILL or SIGTERM), wait, start it on the same port and AOF directory.

        With ``redis_loss_s``, a host crash: the AOF is put back as it was that long before the
        kill, so the writes of those last seconds, acknowledged to every client, are lost (what
        ``appendfsync everysec`` can lose when the machine dies, not only the process).
        """
        kill = self.plan.redis_signal == "kill"
        snapshot = self._snapshot_aof() if self.plan.redis_loss_s > 0 else None
        detail = f"redis-server pid {self.server.pid} {'SIGKILL' if kill else 'SIGTERM'}"
        if snapshot is not None:
            time.sleep(self.plan.redis_loss_s)
            detail += f", its last {self.plan.redis_loss_s:g}s of writes lost"
        before = self._stream_lengths()
        fault = Fault("redis", time.time(), detail)
        self.server.stop(kill=kill)
        fault.killed_at = time.time()  # a clean shutdown still serves for a moment
        if snapshot is not None:
            self._restore_aof(snapshot)
        time.sleep(self.plan.redis_down_s)
        self.server.start()
        fault.back_at = time.time()
        after = self._stream_lengths()
        fault.detail += "; entries " + ", ".join(
            f"{name} {before[name]} -> {after[name]}" for name in before
        )
        return self._record(fault)

    def _stream_lengths(self) -> dict[str, int]:
        """Entries in the observations and events streams, every partition's summed (what a
        lost write takes away)."""
        streams = {"observations": keys.observations_stream, "events": keys.events_stream}
        count = self.plan.partitions
        try:
            return {
                name: sum(int(self.redis.xlen(s)) for s in keys.partition_streams(count, of))
                for name, of in streams.items()
            }
        except RedisError:
            return dict.fromkeys(streams, -1)

    def _snapshot_aof(self) -> Path:
        """A copy of Redis's directory now: an append-only file copied while it grows is a
        prefix of it, as the disk holds after a crash (a torn last command is dropped)."""
        assert self.server.directory is not None
        snapshot = self.root / "redis-snapshot"
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(self.server.directory, snapshot)
        return snapshot

    def _restore_aof(self, snapshot: Path) -> None:
        assert self.server.directory is not None
        shutil.rmtree(self.server.directory)
        shutil.copytree(snapshot, self.server.directory)

    def _record(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        back = f", back after {fault.back_at - fault.at:.1f}s" if fault.back_at else ""
        self.say(f"  {_clock(fault.at)} fault: {fault.kind:<11} {fault.detail}{back}")
        return fault


def _pending_dispatch(fields: dict[Any, Any]) -> Dispatch | None:
    try:
        message = decode_entry(fields)
    except WireFormatError:
        return None
    fence = message.fence
    if isinstance(message, ReasonedMessage):
        return Dispatch(fence.task_id, fence.step_id, fence.iteration, "reason", "reclaim")
    if isinstance(message, ToolObservedMessage):
        return Dispatch(fence.task_id, fence.step_id, fence.iteration, "tool", "reclaim")
    return None


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f"{at % 1:.3f}"[1:]


def _exit_reason(process: Process) -> str:
    """The exit code and the process's last critical (or last) log line."""
    assert process.popen is not None
    lines = [line.strip() for line in process.tail(5000).splitlines() if line.strip()]
    critical = [line for line in lines if "CRITICAL" in line or "Unrecoverable" in line]
    detail = (critical or lines or ["no output"])[-1][:240]
    return f"exit code {process.popen.returncode}: {detail}"


def _alive(pid: int) -> bool:
    """False when the process is gone or a zombie (killed, not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- driving the run --------------------------------------------------------------------------


class Progress:
    """How far the tasks are, read from Redis (tolerates Redis being down)."""

    def __init__(
        self, redis_url: str, task_ids: Sequence[str], expected_entries: int, partitions: int = 1
    ) -> None:
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=2, decode_responses=True)
        self.task_ids = list(task_ids)
        self.partitions = {t: keys.partition_of(t, partitions) for t in self.task_ids}
        self.expected = expected_entries * len(task_ids)
        self.share = 0.0
        self.terminal = 0

    def poll(self) -> None:
        """Update ``share`` (journal entries written / expected) and ``terminal``."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in self.task_ids:
            # the last journal entry: its id 0-{last sequence + 1} counts the records written
            pipe.xrevrange(keys.journal_stream(task_id, self.partitions[task_id]), count=1)
            pipe.hget(keys.task_key(task_id, self.partitions[task_id]), "status")
        try:
            replies = pipe.execute()
        except RedisError:
            return
        written = (int(rows[0][0].partition("-")[2]) for rows in replies[0::2] if rows)
        self.share = sum(written) / self.expected
        done = {s.value for s in TERMINAL_STATUSES}
        self.terminal = sum(1 for s in replies[1::2] if s in done)

    @property
    def finished(self) -> bool:
        """Every task is completed, failed or aborted."""
        return self.terminal == len(self.task_ids)

    def close(self) -> None:
        """Close the connection."""
        self.redis.close()


@dataclass
class Schedule:
    """Which fault is due, given the progress and the time."""

    plan: ChaosPlan
    coordinator_done: bool = False
    redis_done: bool = False
    last_kill: float = 0.0
    quiet_until: float = 0.0

    def due(self, share: float, now: float) -> FaultKind | None:
        """The fault to inject now, if any."""
        plan = self.plan
        if not self.coordinator_done and share >= plan.coordinator_at:
            self.coordinator_done = True
            return "coordinator"
        if not self.redis_done and share >= plan.redis_at:
            self.redis_done = True
            return "redis"
        next_kill = max(self.last_kill + plan.kill_every_s, self.quiet_until)
        if plan.kill_from <= share <= plan.kill_until and now >= next_kill:
            self.last_kill = now
            return "worker"
        return None


def _inject(cluster: ChaosCluster, schedule: Schedule, kind: FaultKind) -> None:
    if kind == "worker":
        cluster.kill_pool_process()
        return
    fault = cluster.kill_coordinator() if kind == "coordinator" else cluster.restart_redis()
    schedule.quiet_until = (fault.back_at or fault.at) + cluster.plan.quiet_after_s


def _drive(cluster: ChaosCluster, progress: Progress, started: float) -> None:
    """Inject faults on schedule until every task is terminal or the time is up."""
    schedule = Schedule(cluster.plan)
    last_report = 0.0
    while time.time() - started < cluster.plan.duration_s:
        progress.poll()
        if progress.finished:
            return
        cluster.supervise()
        kind = schedule.due(progress.share, time.time())
        if kind is not None:
            _inject(cluster, schedule, kind)
        if time.time() - last_report >= 10:
            last_report = time.time()
            cluster.say(
                f"  t={time.time() - started:5.1f}s progress {progress.share:4.0%}, "
                f"{progress.terminal}/{len(progress.task_ids)} tasks done"
            )
        time.sleep(0.2)


# -- pass criteria ----------------------------------------------------------------------------


@dataclass
class TaskOutcome:
    """What a task left in Redis."""

    index: int
    task_id: str
    record: TaskRecord | None
    journal: list[JournalEntry]
    terminal_events: int
    accepted_events: int = 1

    @property
    def duplicate_starts(self) -> int:
        """Starts beyond the first: ``accepted`` events beyond one, ``Started`` journal entries
        beyond one per step."""
        steps = [e.step_id for e in self.journal if e.event.type == "Started"]
        return max(self.accepted_events - 1, 0) + len(steps) - len(set(steps))


def _all_events(client: OrgaClient) -> list[dict[str, str]]:
    """Every lifecycle event of every partition (one cursor position per partition, as
    ``follow_events`` gives it: no partition's event is skipped whatever the others' ids)."""
    found: list[dict[str, str]] = []
    batch, cursor = client.follow_events(count=5000)
    while batch:
        found += [fields for _id, fields in batch]
        batch, cursor = client.follow_events(cursor, count=5000)
    return found


def _collect(
    client: OrgaClient, task_ids: Sequence[str], events: Sequence[dict[str, str]]
) -> list[TaskOutcome]:
    terminal_names = {s.value for s in TERMINAL_STATUSES}
    counts: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for event in events:
        task_id = event.get("task_id", "")
        if event.get("event") in terminal_names:
            counts[task_id] = counts.get(task_id, 0) + 1
        elif event.get("event") == "accepted":
            accepted[task_id] = accepted.get(task_id, 0) + 1
    outcomes = []
    for index, task_id in enumerate(task_ids):
        try:
            record: TaskRecord | None = client.record(task_id)
        except Exception:  # a lost task is what this looks for
            record = None
        journal = client.journal(task_id) if record is not None else []
        outcomes.append(
            TaskOutcome(
                index, task_id, record, journal, counts.get(task_id, 0), accepted.get(task_id, 0)
            )
        )
    return outcomes


def task_violations(outcome: TaskOutcome, plan: ChaosPlan) -> list[str]:
    """Every pass criterion this task breaks, as readable lines (empty: it passed)."""
    task_id, record = outcome.task_id, outcome.record
    if record is None:
        return [f"{task_id}: lost (no record)"]
    problems = []
    if record.status.value != "completed":
        problems.append(f"{task_id}: ended {record.status.value}: {record.error}")
    elif record.output != f"finished-{outcome.index}":
        notes = "; ".join(f"{s.spec.id} {s.status.value}: {s.note}" for s in record.steps)
        problems.append(f"{task_id}: completed without the model's answer ({notes})")
    if outcome.terminal_events != 1:
        problems.append(f"{task_id}: {outcome.terminal_events} terminal events (want 1)")
    if outcome.accepted_events != 1:
        problems.append(f"{task_id}: {outcome.accepted_events} accepted events (want 1)")
    problems += _journal_violations(task_id, outcome.journal)
    problems += _conversation_violations(task_id, record, plan)
    return problems


def _journal_violations(task_id: str, journal: list[JournalEntry]) -> list[str]:
    sequences = [e.sequence for e in journal]
    problems = []
    if sequences != list(range(len(sequences))):
        problems.append(f"{task_id}: journal gap or disorder: {sequences}")
    seen: set[tuple[str | None, int, str]] = set()
    for entry in journal:
        if entry.event.type == "Started":
            if (entry.step_id, 0, "Started") in seen:
                problems.append(f"{task_id}: step {entry.step_id} started twice")
            seen.add((entry.step_id, 0, "Started"))
        elif entry.event.type in ONCE_PER_ITERATION:
            key = (entry.step_id, entry.iteration, entry.event.type)
            if key in seen:
                problems.append(f"{task_id}: iteration applied twice: {key}")
            seen.add(key)
    return problems


def _conversation_violations(task_id: str, record: TaskRecord, plan: ChaosPlan) -> list[str]:
    outputs = [
        m.content.split() for m in record.conversation.messages if m.role is MessageRole.TOOL
    ]
    problems = []
    for i in range(plan.iterations):
        found = sum(1 for words in outputs if f"step-{i}" in words)
        if found != 1:
            problems.append(f"{task_id}: tool output step-{i} is {found} times in the conversation")
    return problems


# -- recovery ---------------------------------------------------------------------------------


@dataclass
class Timeline:
    """When observations were applied, from the journals."""

    applied: list[float]

    @classmethod
    def of(cls, outcomes: Sequence[TaskOutcome]) -> Timeline:
        """One point per ReasoningComplete and ObservationsCollected."""
        return cls(
            sorted(
                e.timestamp.timestamp()
                for o in outcomes
                for e in o.journal
                if e.event.type in APPLIED_EVENTS
            )
        )

    def count(self, start: float, end: float) -> int:
        """Observations applied in ``[start, end)``."""
        return bisect_left(self.applied, end) - bisect_left(self.applied, start)

    def first_after(self, at: float) -> float | None:
        """Seconds from ``at`` to the next observation applied anywhere."""
        index = bisect_right(self.applied, at)
        return self.applied[index] - at if index < len(self.applied) else None

    def rate_before(self, at: float) -> float:
        """Observations applied per second in the 5 s before ``at``."""
        return self.count(at - PRE_FAULT_WINDOW_S, at) / PRE_FAULT_WINDOW_S

    def throughput_back(self, at: float) -> float | None:
        """Seconds from ``at`` to the first 1 s window with 80% of the rate before ``at``."""
        before = self.rate_before(at)
        if before == 0 or not self.applied:
            return None
        t = at
        while t < self.applied[-1]:
            if self.count(t, t + 1.0) >= RECOVERED_SHARE * before:
                return t - at
            t += 0.1
        return None

    def throughput_lost(self, at: float) -> float | None:
        """Seconds of the pre-fault throughput missing in the 10 s after ``at``."""
        before = self.rate_before(at)
        if before == 0:
            return None
        missing = before * LOSS_WINDOW_S - self.count(at, at + LOSS_WINDOW_S)
        return max(missing / before, 0.0)


def _redispatched(events: Sequence[dict[str, str]]) -> list[tuple[float, Dispatch]]:
    """Every dispatch a coordinator sent again after its observation deadline."""
    return [
        (float(e.get("at", 0)), Dispatch.from_token(e["fence"], e.get("kind", ""), "deadline"))
        for e in events
        if e.get("event") == "redispatched" and e.get("fence")
    ]


def _requeue_cause(faults: Sequence[Fault], requeue: Requeue) -> Fault | None:
    """The last fault before a requeue that could have caused it: a kill of a pool process of
    the worker that requeued, or a Redis restart (tasks cancelled on the lost connection)."""
    causes = [
        f
        for f in faults
        if f.at <= requeue.at and (f.kind == "redis" or requeue.hostname.startswith(f"{f.worker}-"))
    ]
    return causes[-1] if causes else None


def _blame(faults: Sequence[Fault], lost: Dispatch, fired_at: float, deadline_s: float) -> None:
    """Charge a re-dispatch to the fault that lost its dispatch: the one that already hit that
    iteration (a requeued dispatch can still miss its deadline behind a long queue), else a
    coordinator or Redis fault between the dispatch and its deadline, else the first pool kill
    in that window."""
    earlier = [f for f in faults if f.at <= fired_at]
    for fault in earlier:
        for dispatch in fault.hit:
            if dispatch.key == lost.key:
                dispatch.resent = True
                return
    between = [f for f in earlier if f.at >= fired_at - deadline_s - 0.5]
    severe = [f for f in between if f.kind != "worker"]
    if between:
        (severe or between)[0].hit.append(lost)


def _measure(
    plan: ChaosPlan,
    faults: Sequence[Fault],
    outcomes: Sequence[TaskOutcome],
    celery_events: CeleryEvents,
    events: Sequence[dict[str, str]],
) -> None:
    timeline = Timeline.of(outcomes)
    for fault in faults:
        _observe(fault, timeline)
    for requeue in celery_events.requeued():
        cause = _requeue_cause(faults, requeue)
        if cause is not None:
            cause.hit.append(requeue.dispatch)
    for fired_at, dispatch in _redispatched(events):
        _blame(faults, dispatch, fired_at, plan.observation_deadline_s)
    journals = {o.task_id: o.journal for o in outcomes}
    for fault in faults:
        for dispatch in fault.hit:
            applied = dispatch.applied_at(journals.get(dispatch.task_id, []))
            dispatch.applied_after_s = None if applied is None else applied - fault.at
            again = [f.at for f in faults if f.at > fault.at and dispatch.key in _keys(f.hit)]
            dispatch.hit_again_after_s = min(again) - fault.at if again else None


def _keys(hit: Sequence[Dispatch]) -> set[tuple[str, str, int, str]]:
    return {d.key for d in hit}


def _control(faults: Sequence[Fault], outcomes: Sequence[TaskOutcome], gap_s: float) -> list[Fault]:
    """The same measures at instants half-way between pool kills, with no fault within 1 s and
    no coordinator or Redis fault in the 30 s before: what the load's own noise looks like."""
    timeline = Timeline.of(outcomes)
    instants = [
        at
        for at in (f.at + gap_s / 2 for f in faults if f.kind == "worker")
        if not any(
            abs(f.at - at) < 1 or (f.kind != "worker" and 0 < at - f.at < 30) for f in faults
        )
    ]
    controls = [Fault("worker", at, "no fault (control instant)") for at in instants]
    for control in controls:
        _observe(control, timeline)
    return controls


def _observe(fault: Fault, timeline: Timeline) -> None:
    """The recovery measures of one fault; the first apply counts from the fault's start, but
    only applies made after the faulty process was killed (a frozen one may apply a few more)."""
    killed_at = fault.killed_at or fault.at
    first = timeline.first_after(killed_at)
    fault.first_apply_s = None if first is None else first + killed_at - fault.at
    fault.throughput_back_s = timeline.throughput_back(fault.at)
    fault.throughput_lost_s = timeline.throughput_lost(fault.at)


def _dispatch_latencies(outcomes: Sequence[TaskOutcome]) -> dict[str, float]:
    """Median time from dispatch to the observation applied, for tool calls and reasoning."""
    tool, reason = [], []
    for outcome in outcomes:
        times = {(e.event.type, e.iteration): e.timestamp.timestamp() for e in outcome.journal}
        for (event, iteration), at in times.items():
            if event == "ObservationsCollected" and ("ReasoningComplete", iteration) in times:
                tool.append(at - times[("ReasoningComplete", iteration)])
            if event == "ReasoningComplete" and ("ObservationsCollected", iteration - 1) in times:
                reason.append(at - times[("ObservationsCollected", iteration - 1)])
    return {
        "tool": statistics.median(tool) if tool else 0.0,
        "reason": statistics.median(reason) if reason else 0.0,
    }


def _side_effects(workspaces: Path, task_ids: Sequence[str], iterations: int) -> tuple[int, int]:
    """Lines appended more than once to the tasks' effects files (commands that ran twice),
    and the commands whose line is missing."""
    duplicates = missing = 0
    expected = {f"step-{i}" for i in range(iterations)}
    for task_id in task_ids:
        effects = workspaces / task_id / EFFECTS_FILE
        lines = effects.read_text().splitlines() if effects.exists() else []
        duplicates += len(lines) - len(set(lines))
        missing += len(expected - set(lines))
    return duplicates, missing


def _duplicates(client: OrgaClient, outcomes: Sequence[TaskOutcome]) -> int:
    """Observations that answered work already answered: entries on the observations stream
    beyond the first for the same task, step, iteration, call and kind (the fences turn them
    away). A reasoning that carried its tool call is one entry for both."""
    del outcomes  # the stream itself says it
    seen: set[tuple[str, str, int, str | None, str]] = set()
    duplicates = 0
    streams = keys.partition_streams(client.partition_count, keys.observations_stream)
    every = [fields for stream in streams for _entry_id, fields in client.redis.xrange(stream)]
    for fields in every:
        try:
            message = decode_entry(fields)
        except WireFormatError:
            continue
        fence = message.fence
        key = (fence.task_id, fence.step_id, fence.iteration, fence.call_id, message.kind)
        duplicates += key in seen
        seen.add(key)
    return duplicates


# -- the report -------------------------------------------------------------------------------


@dataclass
class ChaosReport:
    """The outcome of one run: violations (empty means pass), faults and their costs."""

    plan: ChaosPlan
    task_ids: list[str]
    violations: list[str]
    faults: list[Fault]
    statuses: dict[str, int]
    started: float
    elapsed_s: float
    iterations_applied: int
    dead_letters: int
    latencies: dict[str, float]
    duplicates: int
    duplicate_starts: int
    duplicate_side_effects: int
    missing_side_effects: int
    controls: list[Fault] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)
    lost_reasons: dict[str, int] = field(default_factory=dict)
    """Why the coordinator judged dispatches lost (``dispatch_lost`` events), numbers elided."""
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    """What the dead letters say (their ``error``), numbers and ids elided."""

    @property
    def passed(self) -> bool:
        """Every pass criterion held."""
        return not self.violations

    def of_kind(self, kind: FaultKind) -> list[Fault]:
        """The faults of one kind."""
        return [f for f in self.faults if f.kind == kind]

    def table(self) -> str:
        """The recovery table, in Markdown: median / max over the faults of each kind."""
        lines = [
            "| fault | count | next observation applied | throughput back to 80% "
            "| throughput lost | work it hit: applied after | bound from the settings |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [self._row(kind) for kind in FAULT_KINDS if self.of_kind(kind)]
        if self.controls:
            lines.append(
                f"| none (control instants) | {len(self.controls)} "
                + self._measures(self.controls)
                + " | - | the load's own noise |"
            )
        return "\n".join(lines)

    def _measures(self, faults: Sequence[Fault]) -> str:
        return (
            f"| {_spread([f.first_apply_s for f in faults])} "
            f"| {_spread([f.throughput_back_s for f in faults])} "
            f"| {_spread([f.throughput_lost_s for f in faults])}"
        )

    def _row(self, kind: FaultKind) -> str:
        faults = self.of_kind(kind)
        return (
            f"| {_KIND_NAMES[kind]} | {len(faults)} {self._measures(faults)} "
            f"| {_hit_text([d for f in faults for d in f.hit])} | {self._bound(kind)} |"
        )

    def _bound(self, kind: FaultKind) -> str:
        plan = self.plan
        lost = f"D {plan.observation_deadline_s:g}s + tick {plan.tick_interval_s:g}s"
        if kind == "worker":
            return f"requeue: queue wait; a dispatch not requeued: {lost}"
        if kind == "coordinator":
            return (
                f"restart, then the dead one's partition leases (TTL "
                f"{plan.partition_lease_ttl_s:g}s) and claim idle {plan.claim_idle_ms / 1000:g}s "
                f"+ tick; its deadline work: "
                f"lease TTL {plan.lease_ttl_s:g}s, then {lost}"
            )
        return (
            f"down {plan.redis_down_s:g}s + reconnect (Celery retries every 2s); work lost: {lost}"
        )

    def fault_lines(self) -> list[str]:
        """One line per fault, with what it hit."""
        return [self._fault_line(f) for f in self.faults]

    def _fault_line(self, fault: Fault) -> str:
        hit = ", ".join(
            f"{d.kind} {d.task_id[:8]}/{d.iteration} {d.via}"
            + ("+deadline" if d.resent else "")
            + f" applied after {_fmt(d.applied_after_s)}"
            + (f" (hit again after {_fmt(d.hit_again_after_s)})" if d.hit_again_after_s else "")
            for d in fault.hit
        )
        return (
            f"  t={fault.at - self.started:6.1f}s {fault.kind:<11} {fault.detail}: next apply "
            f"{_fmt(fault.first_apply_s)}, throughput back {_fmt(fault.throughput_back_s)}, "
            f"lost {_fmt(fault.throughput_lost_s)}" + (f"; hit {hit}" if hit else "")
        )

    def summary(self) -> str:
        """The run, each fault, and the verdict on the pass criteria."""
        rate = self.iterations_applied / self.elapsed_s if self.elapsed_s else 0.0
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        plan = self.plan
        lines = [
            f"{len(self.task_ids)} tasks x {plan.iterations + 1} iterations in "
            f"{self.elapsed_s:.1f}s ({rate:.1f} iterations/s): {statuses}; "
            f"dead letters: {self.dead_letters}",
            f"median per iteration, queueing included: reasoning dispatched -> reasoned applied "
            f"{self.latencies['reason']:.2f}s (with the tool call, when it travelled with the "
            f"reasoning), then -> tool results applied {self.latencies['tool']:.2f}s; "
            f"{self.duplicates} observations arrived for an iteration already applied (ignored)",
            f"duplicate starts: {self.duplicate_starts} (accepted events beyond one per task, "
            "Started journal entries beyond one per step)",
            f"duplicate side effects: {self.duplicate_side_effects} command lines appended "
            f"more than once to a task's {EFFECTS_FILE} (run_command is not idempotent: a "
            "call redelivered or re-dispatched after it ran runs again; file_write applies "
            f"once per call); {self.missing_side_effects} missing",
            f"settings: observation deadline D {plan.observation_deadline_s:g}s, "
            f"lease TTL {plan.lease_ttl_s:g}s, claim "
            f"idle {plan.claim_idle_ms}ms, tick {plan.tick_interval_s:g}s; Redis "
            f"{plan.redis_signal}, down {plan.redis_down_s:g}s, "
            f"last {plan.redis_loss_s:g}s of writes lost",
            _reasons_line("dispatches judged lost", self.lost_reasons),
            _reasons_line("dead letters", self.dead_letter_reasons),
            *self.fault_lines(),
            *(f"UNEXPECTED EXIT {line}" for line in self.exits),
            *(f"VIOLATION {v}" for v in self.violations[:50]),
        ]
        if len(self.violations) > 50:
            lines.append(f"... and {len(self.violations) - 50} more violations")
        lines.append("PASS" if self.passed else f"FAIL: {len(self.violations)} violations")
        return "\n".join(lines)


def _reasons_line(what: str, reasons: dict[str, int]) -> str:
    """``what: n "reason", ...``, most frequent first (``none`` when empty)."""
    if not reasons:
        return f"{what}: none"
    ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
    return f"{what}: " + "; ".join(f'{n} "{reason}"' for reason, n in ranked)


_NUMBERS = re.compile(r"[0-9a-f]{32}(/[^\s]*)?|\d+(\.\d+)?")


def _elided(text: str) -> str:
    """``text`` with task ids, fences and numbers replaced by ``N``, so that the same reason
    given for different dispatches counts once."""
    return _NUMBERS.sub("N", text)[:200]


def _counted(texts: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for text in texts:
        key = _elided(text)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _hit_text(hit: Sequence[Dispatch]) -> str:
    """``median / max (n requeued, n reclaimed, n re-sent at the deadline)``."""
    if not hit:
        return "nothing in flight"
    counts = {
        "requeued": sum(1 for d in hit if d.via == "requeue"),
        "reclaimed": sum(1 for d in hit if d.via == "reclaim"),
        "re-sent at the deadline": sum(1 for d in hit if d.via == "deadline" or d.resent),
    }
    parts = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    return f"{_spread([d.applied_after_s for d in hit])} ({parts})"


_KIND_NAMES = {
    "worker": "pool process SIGKILL",
    "coordinator": "coordinator SIGKILL + restart",
    "redis": "Redis restart (AOF)",
}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _spread(values: Sequence[float | None]) -> str:
    """``median / max`` of the known values; ``never`` counts the missing ones."""
    known = [v for v in values if v is not None]
    missing = len(values) - len(known)
    if not known:
        return "never" if missing else "-"
    if len(known) == 1:
        text = _fmt(known[0])
    else:
        text = f"{statistics.median(known):.2f}s / {max(known):.2f}s"
    return f"{text}, {missing} never" if missing else text


# -- running ----------------------------------------------------------------------------------


def run_chaos(
    plan: ChaosPlan,
    server: EmbeddedRedis,
    root: Path,
    say: Callable[[str], None] = print,
) -> ChaosReport:
    """Run the plan against a started Redis (AOF on); the processes' logs go under ``root``."""
    cluster = ChaosCluster(plan, server, root, say)
    celery_events = CeleryEvents(server.url).start()
    client = OrgaClient(server.url, partitions=plan.partitions)
    try:
        cluster.start()
        started = time.time()
        task_ids = [client.submit(plan.task(i)) for i in range(plan.tasks)]
        say(f"  submitted {len(task_ids)} tasks")
        progress = Progress(server.url, task_ids, plan.journal_entries_per_task, plan.partitions)
        _drive(cluster, progress, started)
        progress.close()
        elapsed = time.time() - started
    finally:
        cluster.stop()
        celery_events.stop()
    try:
        report = _report(plan, client, cluster, celery_events, task_ids)
    finally:
        client.close()
    report.started, report.elapsed_s = started, elapsed
    return report


def _report(
    plan: ChaosPlan,
    client: OrgaClient,
    cluster: ChaosCluster,
    celery_events: CeleryEvents,
    task_ids: list[str],
) -> ChaosReport:
    events = _all_events(client)
    outcomes = _collect(client, task_ids, events)
    duplicated, missing = _side_effects(cluster.root / "workspaces", task_ids, plan.iterations)
    _measure(plan, cluster.faults, outcomes, celery_events, events)
    statuses: dict[str, int] = {}
    for outcome in outcomes:
        status = outcome.record.status.value if outcome.record else "lost"
        statuses[status] = statuses.get(status, 0) + 1
    return ChaosReport(
        plan=plan,
        task_ids=task_ids,
        violations=[v for o in outcomes for v in task_violations(o, plan)],
        faults=cluster.faults,
        statuses=statuses,
        started=0.0,
        elapsed_s=0.0,
        iterations_applied=sum(
            1 for o in outcomes for e in o.journal if e.event.type == "ReasoningComplete"
        ),
        dead_letters=sum(
            int(client.redis.xlen(stream))
            for stream in keys.partition_streams(client.partition_count, keys.dead_letter_stream)
        ),
        latencies=_dispatch_latencies(outcomes),
        duplicates=_duplicates(client, outcomes),
        duplicate_starts=sum(o.duplicate_starts for o in outcomes),
        duplicate_side_effects=duplicated,
        missing_side_effects=missing,
        controls=_control(cluster.faults, outcomes, plan.kill_every_s),
        exits=cluster.exits,
        lost_reasons=_counted(
            [e.get("reason", "") for e in events if e.get("event") == "dispatch_lost"]
        ),
        dead_letter_reasons=_counted(
            [
                text.get("error") or text.get("kind") or "?"
                for text in (
                    {_text(k): _text(v) for k, v in fields.items()}
                    for stream in keys.partition_streams(
                        client.partition_count, keys.dead_letter_stream
                    )
                    for _id, fields in client.redis.xrange(stream)
                )
            ]
        ),
    )


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = ChaosPlan()
    parser = argparse.ArgumentParser(description="Fault injection under load (see the module).")
    add = parser.add_argument
    add("--tasks", type=int, default=defaults.tasks, help="tasks submitted at once")
    add("--iterations", type=int, default=defaults.iterations, help="tool calls per task")
    add("--duration", type=float, default=defaults.duration_s,
        help="seconds the run may take; tasks still running then fail it")  # fmt: skip
    add("--coordinators", type=int, default=defaults.coordinators,
        help="coordinators running at once (the last one started is the one killed)")  # fmt: skip
    add("--kill-every", type=float, default=defaults.kill_every_s,
        help="seconds between pool-process kills")  # fmt: skip
    add("--coordinator-at", type=float, default=defaults.coordinator_at,
        help="share of the expected progress at which the coordinator is killed")  # fmt: skip
    add("--coordinator-freeze", type=float, default=defaults.coordinator_freeze_s,
        help="seconds the coordinator is frozen (SIGSTOP) before its SIGKILL, so it dies "
        "holding observations it has read; 0 kills it at once")  # fmt: skip
    add("--redis-at", type=float, default=defaults.redis_at,
        help="share of the expected progress at which Redis is restarted")  # fmt: skip
    add("--redis-down", type=float, default=defaults.redis_down_s,
        help="seconds Redis stays down")  # fmt: skip
    add("--redis-signal", choices=("kill", "term"), default=defaults.redis_signal)
    add("--redis-loss", type=float, default=defaults.redis_loss_s,
        help="simulate a host crash: the AOF loses the writes of this many seconds before the "
        "kill (appendfsync everysec loses up to about 1s when the machine dies)")  # fmt: skip
    add("--deadline", type=float, default=defaults.observation_deadline_s,
        help="ORGA_OBSERVATION_DEADLINE_S of the coordinator")  # fmt: skip
    add("--seed", type=int, default=defaults.seed)
    add("--partitions", type=int, default=defaults.partitions,
        help="ORGA_PARTITIONS of every process (the checks read every partition)")  # fmt: skip
    add("--keep", action="store_true", help="keep the logs and the AOF directory")
    return parser.parse_args(argv)


def _plan(args: argparse.Namespace) -> ChaosPlan:
    return ChaosPlan(
        tasks=args.tasks,
        iterations=args.iterations,
        coordinators=args.coordinators,
        duration_s=args.duration,
        kill_every_s=args.kill_every,
        coordinator_at=args.coordinator_at,
        coordinator_freeze_s=args.coordinator_freeze,
        redis_at=args.redis_at,
        redis_down_s=args.redis_down,
        redis_signal=args.redis_signal,
        redis_loss_s=args.redis_loss,
        observation_deadline_s=args.deadline,
        seed=args.seed,
        partitions=args.partitions,
    )


def run_in_scratch(
    prefix: str, run: Callable[[Path], bool], *, keep: bool = False, kept: str = "logs"
) -> int:
    """Run a chaos benchmark in a new folder (``prefix`` names it): ``run`` gets the folder and
    says whether every criterion held. The folder is deleted when it passed (unless ``keep``),
    kept and named otherwise; the exit code is 0 when it passed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    passed = run(root)
    if passed and not keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"{kept} kept in {root}")
    return 0 if passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos benchmark; 0 when every pass criterion held."""
    args = _arguments(argv)
    plan = _plan(args)

    def run(root: Path) -> bool:
        (root / "redis").mkdir()
        print(
            f"chaos: {plan.tasks} tasks x {plan.iterations + 1} iterations on "
            f"{plan.partitions} partition(s); logs in {root}"
        )
        server = EmbeddedRedis(appendonly=True, directory=root / "redis").start()
        try:
            report = run_chaos(plan, server, root)
        finally:
            server.stop()
        print(f"\n{report.table()}\n\n{report.summary()}")
        return report.passed

    return run_in_scratch("orga-chaos-", run, keep=args.keep, kept="logs and AOF")


if __name__ == "__main__":
    sys.exit(main())
