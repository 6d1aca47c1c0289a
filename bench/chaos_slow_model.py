"""Chaos with a slow model: reasoning workers SIGKILLed while their model calls are in flight.

Run: ``.venv/bin/python bench/chaos_slow_model.py`` (``make chaos`` runs it after
``bench/chaos.py``); ``--tasks 10 --kills 1`` for a short run.

Everything is real and on this machine: a private Redis, the fake OpenAI-compatible model
server (``bench/fake_model_server.py``, its own process) answering each call after 1 to 3 s
(``--latency 2 --jitter 0.5``), one ``orga worker --role reasoning`` (its pool runs every task
on one event loop, holding every model call of the process), one ``orga worker --role
tools`` and one ``orga coordinator``. ``--tasks`` tasks are submitted at once; each names a
marker in its goal (``SMB-TASK-<run>-<index>``) and reads one line of a note per turn until
the model answers at turn ``--iterations``.

Every ``--kill-every`` seconds (``--kills`` times), once the model server has calls in flight,
the reasoning worker is killed with SIGKILL, and a new one is started ``--restart-after``
seconds later, as a supervisor would. A worker that exits on its own is restarted too and
reported as an UNEXPECTED EXIT.

The fake server records every request (marker, turn, arrival, reply). A marker and a turn
identify one iteration of one task (the task has one step; the reasoning dispatch of iteration
``i`` carries ``i`` tool results, so it is turn ``i + 1``): that is the fence whose model calls
are counted. Checked at the end (exit code 1 when one fails):

- **each lost call is re-sent once, after its heartbeat stops**: a call the killed worker had
  in flight (arrived before the process was gone, answered after the kill) is followed by
  exactly one call for the same fence; the coordinator's ``dispatch_lost`` event ("its worker
  stopped heartbeating") for that fence comes after the kill and at least a heartbeat timeout
  after the last beat the lost dispatch left in ``orga:heartbeats``. How long before the kill
  that beat was (a worker whose loop is starved beats late) is reported, not judged;
- **no duplicate model call**: every call after the first for a fence is explained by a kill
  that hit the call before it (in flight, or answered less than ``GRACE_S`` before the kill, when
  the answer may not have been published yet); any other is a duplicate;
- **no iteration applied twice**: every journal contiguous from sequence 0, with
  ``ReasoningComplete``, ``ToolsDispatched`` and ``ObservationsCollected`` once per step and
  iteration (``bench/chaos.py``'s check);
- **no task lost**: every task completed with the model's answer and one terminal event.

Headline figures are printed as ``RESULT name value`` lines.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos import TaskOutcome, _all_events, _collect, _journal_violations, run_in_scratch
from bench.slow_model_bench import (
    API_KEY,
    MODEL,
    ModelServer,
    make_workspace,
    orga_command,
    task_spec,
)
from coordinator.client import OrgaClient
from coordinator.state import TERMINAL_STATUSES
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.integration.harness import Process

__all__ = [
    "Call",
    "Kill",
    "SlowChaosPlan",
    "SlowChaosReport",
    "main",
    "run_slow_chaos",
]

Beats = dict[tuple[int, int], list[float]]
"""Times (heartbeats, losses) by fence: (task index, turn)."""
GRACE_S = 1.0
"""A call answered this long before a kill may still be unpublished when the worker dies."""
SLACK_S = 0.25
"""Clock slack on the heartbeat's age when the coordinator declares a call lost."""
ENDED = frozenset({*(s.value for s in TERMINAL_STATUSES), "awaiting_review"})
"""Statuses after which a task makes no progress on its own."""


@dataclass(frozen=True)
class SlowChaosPlan:
    """The load, the kills and the liveness timings of one run.

    The heartbeat timings are shorter than production's (5 s and 30 s) so that a lost call is
    re-sent within seconds, with one rule: the timeout must exceed the longest stretch a live
    worker goes without a beat. A reasoning worker just started, on 2 cores under load, wrote
    none for 3.4 to 8.5 s around its first calls (docs/reliability.md §6.3), so 2.5 s and even
    10 s declared live calls lost (``--heartbeat-timeout 2.5`` shows it); 20 s leaves twice
    that. The observation deadline exceeds the longest model call (``latency × (1 + jitter)``),
    and the coordinator's heartbeats decide what is re-sent (the Redis broker has no
    visibility timeout: no ack emulation, docs/reliability.md §3.7).
    """

    tasks: int = 100
    iterations: int = 8
    latency_s: float = 2.0
    jitter: float = 0.5
    kills: int = 4
    kill_every_s: float = 8.0
    first_kill_s: float = 5.0
    restart_after_s: float = 1.0
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 20.0
    observation_deadline_s: float = 6.0
    tick_interval_s: float = 0.2
    duration_s: float = 400.0
    partitions: int = 1
    """``ORGA_PARTITIONS`` of every process and of the client (the checks read every
    partition's streams; ``tests/integration`` passes the suite's count)."""

    def environment(self, redis_url: str, model_url: str, root: Path) -> dict[str, str]:
        """The environment of every process started: this Redis, this model, these timings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            ORGA_REDIS_URL=redis_url,
            ORGA_WORKSPACE_ROOT=str(root / "workspaces"),
            ORGA_PROVIDER="openai",
            ORGA_BASE_URL=model_url,
            ORGA_API_KEY=API_KEY,
            ORGA_MODEL=MODEL,
            ORGA_HEARTBEAT_INTERVAL_S=str(self.heartbeat_interval_s),
            ORGA_HEARTBEAT_TIMEOUT_S=str(self.heartbeat_timeout_s),
            ORGA_OBSERVATION_DEADLINE_S=str(self.observation_deadline_s),
            ORGA_TICK_INTERVAL_S=str(self.tick_interval_s),
            ORGA_PARTITIONS=str(self.partitions),
        )
        return env

    def task(self, marker: str, workspace: Path) -> dict[str, Any]:
        """The slow-model benchmark's task (one line of the note per turn), with the
        stagnation detector off as in ``bench/chaos.py``: the answers it reads are alike,
        and a task escalated to review would stop the run."""
        spec = task_spec(marker, workspace)
        spec["stagnation"] = {"enabled": False}
        spec["limits"] = {"max_iterations": self.iterations + 5}
        return spec

    @property
    def stale_after_s(self) -> float:
        """How old a call's last heartbeat must be before the coordinator may re-send it."""
        return self.heartbeat_timeout_s - SLACK_S


# -- the processes ----------------------------------------------------------------------------


@dataclass
class Kill:
    """One SIGKILL of the reasoning worker: when it was sent, when the process was gone (a
    request already written may reach the model in between), when its replacement was ready."""

    at: float
    pid: int
    dead_at: float = 0.0
    back_at: float | None = None


@dataclass
class SlowCluster:
    """The workers and the coordinator, the kills injected, and a supervisor."""

    plan: SlowChaosPlan
    env: dict[str, str]
    root: Path
    say: Callable[[str], None]
    reasoning: Process | None = None
    others: list[Process] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)
    _started: int = 0
    _roles: dict[str, tuple[str, tuple[str, ...], str]] = field(default_factory=dict)

    def start(self) -> None:
        """The tool worker, the reasoning worker, then the coordinator."""
        self.others.append(self._spawn("tools", ("worker", "--role", "tools")))
        self.reasoning = self._reasoning()
        self.others.append(self._spawn("coordinator", ("coordinator",), ready="coordinator "))

    def stop(self) -> None:
        """Stop every process still running."""
        for process in self._processes():
            process.stop()

    def _processes(self) -> list[Process]:
        return [*self.others, *([self.reasoning] if self.reasoning else [])]

    def _reasoning(self) -> Process:
        name = f"reasoning-{self._started + 1}-{os.getpid()}@%h"
        return self._spawn("reasoning", ("worker", "--role", "reasoning", "-n", name))

    def _spawn(self, label: str, args: tuple[str, ...], ready: str = "ready.") -> Process:
        """Start ``orga ARGS`` and wait until it logs ``ready``."""
        self._started += 1
        name = f"{label}-{self._started}"
        command = orga_command(*args)
        if args[0] == "worker":
            command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        process = Process(name, command, self.env, self.root / f"{name}.log").start()
        self._roles[process.name] = (label, args, ready)
        process.wait_for_log(ready, timeout_s=90)
        return process

    def kill_reasoning(self) -> Kill:
        """SIGKILL the reasoning worker (every call it holds dies with it), then start a new
        one after ``restart_after_s``."""
        assert self.reasoning is not None
        old = self.reasoning
        kill = Kill(time.time(), old.pid)
        os.kill(old.pid, signal.SIGKILL)
        assert old.popen is not None
        old.popen.wait(10)
        kill.dead_at = time.time()
        self.kills.append(kill)
        self.say(f"  {_clock(kill.at)} kill:  {old.name} pid {old.pid} SIGKILL")
        time.sleep(self.plan.restart_after_s)
        self.reasoning = self._reasoning()
        kill.back_at = time.time()
        self.say(f"  {_clock(kill.back_at)} back:  {self.reasoning.name} ready")
        return kill

    def supervise(self) -> None:
        """Restart a process that exited on its own, and say so."""
        for process in self._processes():
            if process.popen is None or process.popen.poll() is None:
                continue
            self.exits.append(f"{process.name} exited on its own: {process.tail(3)}")
            self.say(f"  exit:  {self.exits[-1]}; restarting it")
            if process is self.reasoning:
                self.reasoning = self._reasoning()
            else:
                self.others.remove(process)
                label, args, ready = self._roles[process.name]
                self.others.append(self._spawn(label, args, ready))


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f"{at % 1:.3f}"[1:]


@dataclass
class KillSchedule:
    """When the next kill is due: every ``kill_every_s`` from ``first_kill_s``, ``kills``
    times, and only while the model has calls in flight."""

    plan: SlowChaosPlan
    started: float
    server: ModelServer
    cluster: SlowCluster

    def tick(self) -> None:
        """Called between polls: supervise, and kill when due."""
        self.cluster.supervise()
        done = len(self.cluster.kills)
        if done >= self.plan.kills:
            return
        due = self.started + self.plan.first_kill_s + done * self.plan.kill_every_s
        if done:
            due = max(due, (self.cluster.kills[-1].back_at or 0.0) + self.plan.kill_every_s / 2)
        if time.time() >= due and self.server.stats()["inflight"] > 0:
            self.cluster.kill_reasoning()


def wait_ended(
    client: OrgaClient,
    task_ids: Sequence[str],
    until: float,
    tick: Callable[[], None],
    say: Callable[[str], None],
) -> None:
    """Poll until every task has ended (or waits for a review) or ``until`` (wall clock)
    passes, calling ``tick`` between polls and saying how far it got every 10 s."""
    started, last_report = time.time(), time.time()
    while time.time() < until:
        pipe = client.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(keys.task_key(task_id, client.partition(task_id)), "status")
        ended = sum(1 for status in pipe.execute() if status in ENDED)
        if ended == len(task_ids):
            return
        tick()
        if time.time() - last_report >= 10:
            last_report = time.time()
            say(f"  t={last_report - started:5.1f}s {ended}/{len(task_ids)} tasks ended")
        time.sleep(0.2)


# -- what the model server saw ----------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request the model server received: its fence (task index, turn) and its times."""

    task: int
    turn: int
    start: float
    end: float

    def hit_by(self, kill: Kill, grace_s: float = 0.0) -> bool:
        """Whether this call was in flight when ``kill`` happened (or answered less than
        ``grace_s`` before it)."""
        return self.start < kill.dead_at and kill.at <= self.end + grace_s


def calls_by_fence(
    records: Sequence[dict[str, Any]], run: str
) -> dict[tuple[int, int], list[Call]]:
    """The server's records of this run, by (task index, turn), oldest first."""
    fences: dict[tuple[int, int], list[Call]] = defaultdict(list)
    prefix = f"{run}-"
    for record in records:
        marker = record.get("task") or ""
        if not marker.startswith(prefix):
            continue
        call = Call(int(marker[len(prefix) :]), int(record["turn"]), record["start"], record["end"])
        fences[(call.task, call.turn)].append(call)
    for calls in fences.values():
        calls.sort(key=lambda c: c.start)
    return dict(fences)


@dataclass
class Resend:
    """A lost call sent to the model again: its fence, the kill that lost it, the last
    heartbeat of the lost dispatch, when the coordinator declared it lost (its
    ``dispatch_lost`` event) and when the new call reached the model."""

    fence: tuple[int, int]
    killed_at: float
    dead_at: float
    arrived_at: float
    declared_at: float | None = None
    last_beat: float | None = None


@dataclass
class CallAudit:
    """Model calls per fence, checked against the kills."""

    lost: int = 0
    """Calls a kill lost: in flight at it, or answered less than ``GRACE_S`` before it and
    never published (their re-send shows it)."""
    duplicates: int = 0
    resends: list[Resend] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def resent(self) -> int:
        """Calls made again because a kill lost the one before."""
        return len(self.resends)

    def check(self, fence: tuple[int, int], calls: Sequence[Call], kills: Sequence[Kill]) -> None:
        """One fence: each lost call re-sent once after its heartbeat stopped, no other
        call made twice."""
        for before, after in itertools.pairwise(calls):
            self._successor(fence, before, after, kills)
        for index, call in enumerate(calls):
            # Lost: in flight at a kill, or answered just before it and sent again (the worker
            # died before publishing the answer), as _successor counts its re-send.
            resent = index + 1 < len(calls)
            if any(call.hit_by(k) or (resent and call.hit_by(k, GRACE_S)) for k in kills):
                self.lost += 1
        last = calls[-1]
        if any(last.hit_by(k) for k in kills):
            self.violations.append(f"task {fence[0]} turn {fence[1]}: lost call never re-sent")

    def _successor(
        self, fence: tuple[int, int], before: Call, after: Call, kills: Sequence[Kill]
    ) -> None:
        cause = next(
            (k for k in kills if before.hit_by(k, GRACE_S) and after.start > k.dead_at), None
        )
        if cause is None:
            self.duplicates += 1
            self.violations.append(
                f"task {fence[0]} turn {fence[1]}: model called twice without a kill between "
                f"(calls at {_clock(before.start)} and {_clock(after.start)})"
            )
            return
        self.resends.append(Resend(fence, cause.at, cause.dead_at, after.start))

    def declare(self, losses: Beats, beats: Beats, plan: SlowChaosPlan) -> None:
        """Pair each re-send with the last heartbeat of the dispatch the kill lost and with the
        coordinator's first heartbeat loss of its fence after the kill. A re-send without
        either, or declared before that beat was a heartbeat timeout old, is a violation."""
        for resend in self.resends:
            where = f"task {resend.fence[0]} turn {resend.fence[1]}"
            after = [at for at in losses.get(resend.fence, []) if at > resend.killed_at]
            before = [at for at in beats.get(resend.fence, []) if at <= resend.dead_at]
            if not after or not before:
                what = "a heartbeat loss" if not after else "a heartbeat of the lost dispatch"
                self.violations.append(f"{where}: re-sent without {what}")
                continue
            resend.declared_at, resend.last_beat = min(after), max(before)
            age = resend.declared_at - resend.last_beat
            if age < plan.stale_after_s:
                self.violations.append(
                    f"{where}: declared lost {age:.2f}s after its last heartbeat, before it was "
                    f"stale (timeout {plan.heartbeat_timeout_s:g}s)"
                )


def audit_calls(fences: dict[tuple[int, int], list[Call]], kills: Sequence[Kill]) -> CallAudit:
    """Check every fence's model calls against the kills."""
    audit = CallAudit()
    for fence, calls in sorted(fences.items()):
        audit.check(fence, calls, kills)
    return audit


def heartbeat_losses(events: Sequence[dict[str, str]], task_ids: Sequence[str]) -> Beats:
    """When the coordinator declared each fence (task index, turn) lost because its worker
    stopped heartbeating (``dispatch_lost`` events of reasoning dispatches)."""
    index = {task_id: i for i, task_id in enumerate(task_ids)}
    found: Beats = defaultdict(list)
    for event in events:
        if event.get("event") != "dispatch_lost" or "heartbeating" not in event.get("reason", ""):
            continue
        task_id, _step, iteration = event.get("fence", "").split("/")[:3]
        if task_id in index:
            found[(index[task_id], int(iteration) + 1)].append(float(event.get("at", 0)))
    return dict(found)


def last_beats(redis: Any, task_ids: Sequence[str]) -> Beats:
    """The last heartbeat of every reasoning dispatch that was never answered (a positive
    score left in ``orga:heartbeats``), by fence (task index, turn)."""
    index = {task_id: i for i, task_id in enumerate(task_ids)}
    found: Beats = defaultdict(list)
    for member, score in redis.zscan_iter(keys.heartbeats_key):
        text = member.decode() if isinstance(member, bytes) else str(member)
        parts = text.split("|")
        if len(parts) != 4:  # an answer mark (keys.answered_via_member), never positive
            continue
        task_id, _nonce, iteration, call = parts
        if call == "-" and score > 0 and task_id in index:
            found[(index[task_id], int(iteration) + 1)].append(float(score))
    return dict(found)


# -- what the tasks left ----------------------------------------------------------------------


def task_violations(outcome: TaskOutcome, iterations: int) -> list[str]:
    """Completed with the model's answer, one terminal event, a gapless journal with each
    iteration applied once."""
    task_id, record = outcome.task_id, outcome.record
    if record is None:
        return [f"{task_id}: lost (no record)"]
    problems = []
    if record.status.value != "completed":
        problems.append(f"{task_id}: ended {record.status.value}: {record.error}")
    elif record.output != f"Done after {iterations} turns.":
        problems.append(f"{task_id}: completed with {record.output!r}, not the model's answer")
    if outcome.terminal_events != 1:
        problems.append(f"{task_id}: {outcome.terminal_events} terminal events (want 1)")
    return problems + _journal_violations(task_id, outcome.journal)


# -- the report -------------------------------------------------------------------------------


@dataclass
class SlowChaosReport:
    """The outcome of one run: violations (empty means pass), the kills and the call counts."""

    plan: SlowChaosPlan
    elapsed_s: float
    statuses: dict[str, int]
    kills: list[Kill]
    audit: CallAudit
    calls: int
    applied_twice: int
    violations: list[str]
    exits: list[str]

    @property
    def passed(self) -> bool:
        """Every criterion held."""
        return not self.violations

    @property
    def lost_tasks(self) -> int:
        """Tasks that did not complete."""
        return sum(n for status, n in self.statuses.items() if status != "completed")

    def result_lines(self) -> list[str]:
        """The headline figures, one ``RESULT name value`` line each."""
        return [
            f"RESULT chaos_slow_resent_calls {self.audit.resent}",
            f"RESULT chaos_slow_duplicate_calls {self.audit.duplicates}",
            f"RESULT chaos_slow_lost_calls {self.audit.lost}",
            f"RESULT chaos_slow_iterations_applied_twice {self.applied_twice}",
            f"RESULT chaos_slow_lost_tasks {self.lost_tasks}",
        ]

    def summary(self) -> str:
        """The run, the kills, the re-sends and the verdict."""
        plan, audit = self.plan, self.audit
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        declared = [r.declared_at - r.killed_at for r in audit.resends if r.declared_at]
        silent = [r.killed_at - r.last_beat for r in audit.resends if r.last_beat]
        arrived = [r.arrived_at - r.killed_at for r in audit.resends]
        lines = [
            f"{plan.tasks} tasks x {plan.iterations} model calls "
            f"({plan.latency_s:g}s ± {plan.jitter:.0%}) in {self.elapsed_s:.1f}s: {statuses}",
            f"{len(self.kills)} reasoning worker kills; {self.calls} model calls, "
            f"{audit.lost} in flight at a kill, {audit.resent} re-sent, "
            f"{audit.duplicates} duplicates",
            f"last heartbeat of a lost call before its kill: {_spread(silent)}",
            f"after the kill, declared lost (heartbeat stale): {_spread(declared)}; the new "
            f"call at the model: {_spread(arrived)} (heartbeat interval "
            f"{plan.heartbeat_interval_s:g}s, timeout {plan.heartbeat_timeout_s:g}s, "
            f"observation deadline {plan.observation_deadline_s:g}s)",
            *(f"UNEXPECTED EXIT {line}" for line in self.exits),
            *(f"VIOLATION {v}" for v in self.violations[:50]),
            "PASS" if self.passed else f"FAIL: {len(self.violations)} violations",
        ]
        return "\n".join(lines)


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"median {statistics.median(values):.2f}s, min {min(values):.2f}s, max {max(values):.2f}s"
    )


# -- running ----------------------------------------------------------------------------------


def run_slow_chaos(
    plan: SlowChaosPlan, server: EmbeddedRedis, root: Path, say: Callable[[str], None] = print
) -> SlowChaosReport:
    """Run the plan against a started Redis; logs go under ``root``."""
    model = ModelServer.start(root, plan.latency_s, plan.jitter, plan.iterations)
    cluster = SlowCluster(plan, plan.environment(server.url, model.url, root), root, say)
    client = OrgaClient(server.url, partitions=plan.partitions)
    run = uuid.uuid4().hex[:8]
    try:
        cluster.start()
        workspace = make_workspace(root)
        started = time.time()
        task_ids = [client.submit(plan.task(f"{run}-{i}", workspace)) for i in range(plan.tasks)]
        say(f"  submitted {len(task_ids)} tasks")
        schedule = KillSchedule(plan, started, model, cluster)
        wait_ended(client, task_ids, started + plan.duration_s, schedule.tick, say)
        elapsed = time.time() - started
        records = model.stats(records=True)["records"]
    finally:
        cluster.stop()
        model.stop()
    try:
        return _report(
            plan,
            client=client,
            cluster=cluster,
            task_ids=task_ids,
            records=records,
            run=run,
            elapsed_s=elapsed,
        )
    finally:
        client.close()


def _report(
    plan: SlowChaosPlan,
    *,
    client: OrgaClient,
    cluster: SlowCluster,
    task_ids: list[str],
    records: list[dict[str, Any]],
    run: str,
    elapsed_s: float,
) -> SlowChaosReport:
    events = _all_events(client)
    outcomes = _collect(client, task_ids, events)
    fences = calls_by_fence(records, run)
    audit = audit_calls(fences, cluster.kills)
    audit.declare(heartbeat_losses(events, task_ids), last_beats(client.redis, task_ids), plan)
    violations = [v for o in outcomes for v in task_violations(o, plan.iterations)]
    violations += audit.violations
    statuses: dict[str, int] = defaultdict(int)
    for outcome in outcomes:
        statuses[outcome.record.status.value if outcome.record else "lost"] += 1
    return SlowChaosReport(
        plan=plan,
        elapsed_s=elapsed_s,
        statuses=dict(statuses),
        kills=cluster.kills,
        audit=audit,
        calls=sum(len(c) for c in fences.values()),
        applied_twice=sum(1 for v in violations if "applied twice" in v),
        violations=violations,
        exits=cluster.exits,
    )


def _arguments(argv: Sequence[str] | None) -> SlowChaosPlan:
    defaults = SlowChaosPlan()
    parser = argparse.ArgumentParser(description="Chaos with a slow model (see the module).")
    add = parser.add_argument
    add("--tasks", type=int, default=defaults.tasks, help="tasks submitted at once")
    add("--iterations", type=int, default=defaults.iterations, help="model calls per task")
    add("--latency", type=float, default=defaults.latency_s, help="seconds per model call")
    add("--jitter", type=float, default=defaults.jitter, help="± share of the latency")
    add("--kills", type=int, default=defaults.kills, help="reasoning worker kills")
    add("--kill-every", type=float, default=defaults.kill_every_s, help="seconds between kills")
    add("--duration", type=float, default=defaults.duration_s, help="bound of the run")
    add("--heartbeat-interval", type=float, default=defaults.heartbeat_interval_s,
        help="ORGA_HEARTBEAT_INTERVAL_S of the workers")  # fmt: skip
    add("--heartbeat-timeout", type=float, default=defaults.heartbeat_timeout_s,
        help="ORGA_HEARTBEAT_TIMEOUT_S of the coordinator")  # fmt: skip
    add("--deadline", type=float, default=defaults.observation_deadline_s,
        help="ORGA_OBSERVATION_DEADLINE_S of the coordinator")  # fmt: skip
    add("--partitions", type=int, default=defaults.partitions,
        help="ORGA_PARTITIONS of every process (the checks read every partition)")  # fmt: skip
    args = parser.parse_args(argv)
    return SlowChaosPlan(
        tasks=args.tasks,
        iterations=args.iterations,
        latency_s=args.latency,
        jitter=args.jitter,
        kills=args.kills,
        kill_every_s=args.kill_every,
        duration_s=args.duration,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        observation_deadline_s=args.deadline,
        partitions=args.partitions,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the slow-model chaos benchmark; 0 when every criterion held."""
    plan = _arguments(argv)

    def run(root: Path) -> bool:
        print(
            f"chaos (slow model): {plan.tasks} tasks x {plan.iterations} model calls, "
            f"{plan.kills} reasoning worker kills; logs in {root}"
        )
        server = EmbeddedRedis(directory=root / "redis").start()
        try:
            report = run_slow_chaos(plan, server, root)
        finally:
            server.stop()
        print(f"\n{report.summary()}")
        print("\n".join(report.result_lines()))
        return report.passed

    return run_in_scratch("orga-chaos-slow-", run)


if __name__ == "__main__":
    sys.exit(main())
