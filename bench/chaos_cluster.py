"""Chaos on a Redis Cluster: 100 tasks run while a master is killed (its replica is promoted),
a coordinator is killed, and a coordinator is killed while its relay holds outbox entries it
read (between publishing them and removing them).

The state is on a cluster of 3 masters and 3 replicas started from ``redis-server`` processes
(:mod:`tests.redis_cluster`, ``cluster-node-timeout`` 2 s), 16 partitions; Celery's broker is a
private standalone Redis; two coordinators, a reasoning and a tools worker. The tasks are
:class:`bench.chaos.ChaosPlan`'s (tool calls that append a line to the task's workspace).

Printed, from what the run left: ``RESULT cluster_chaos_lost_tasks <n>`` (tasks not completed
when the run ends), ``RESULT cluster_chaos_iterations_applied_twice <n>`` (journal entries of
one iteration applied twice), ``RESULT cluster_chaos_dispatches_published_twice <n>`` (Celery
task ids the workers received more than once, read from their logs: a relay killed after
publishing and before removing sends its entries again, with the same id; the fences apply the
second answer never), and ``RESULT cluster_chaos_commands_run_twice <n>`` (side effects seen
twice: a command re-run after its worker's answer was lost). Exit 0 when no task was lost and no
iteration applied twice.

    python bench/chaos_cluster.py [--tasks 100] [--keep] [--faults master,coordinator,relay]
        [--kill-named-node]

A harsher run: ``--faults master,coordinator,relay,master2 --kill-named-node`` (the node the
processes' ``ORGA_REDIS_URL`` names first killed, then a second master at 75 %).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.exceptions import RedisClusterException, RedisError

from bench.chaos import ChaosPlan, _journal_violations, _side_effects, run_in_scratch
from coordinator.client import OrgaClient
from coordinator.state import TERMINAL_STATUSES
from orga.embedded_redis import EmbeddedRedis
from orga.redis_client import RedisClients
from shared import keys
from tests.integration.harness import Process
from tests.redis_cluster import RedisCluster

__all__ = ["main"]

T = TypeVar("T")

PARTITIONS = 16
RECEIVED = re.compile(r"\[([0-9a-f-]{36})\] received")
"""A worker's log line for a Celery message received (``Task reason <task> ... act[<id>]``)."""
TERMINAL = {s.value for s in TERMINAL_STATUSES}
FAULTS = ("master", "coordinator", "relay", "master2")


def _retrying(what: Callable[[], T], timeout_s: float = 60.0) -> T:
    """``what()``, retried while the cluster fails over (this process's client meets it too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return what()
        except (RedisError, RedisClusterException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Run:
    """The processes of one run and the faults injected into them."""

    def __init__(self, plan: ChaosPlan, cluster: RedisCluster, broker: EmbeddedRedis, root: Path):
        self.plan, self.cluster, self.root = plan, cluster, root
        # every node: a process started after a master died reaches the others
        self.env = plan.environment(cluster.urls, root / "workspaces")
        self.env.update(
            ORGA_REDIS_CLUSTER="true",
            ORGA_BROKER_URL=broker.url,
            ORGA_PARTITIONS=str(PARTITIONS),
            ORGA_LOG_EACH_TASK="true",  # "Task ...[id] received": what was published twice
        )
        self.workers: list[Process] = []
        self.coordinators: list[Process] = []
        self.numbers = iter(range(1, 1000))
        self.client = OrgaClient(
            cluster.url,
            partitions=PARTITIONS,
            client=RedisClients(cluster.urls, cluster=True).sync(decode_responses=True),
        )

    def start(self) -> None:
        for queue in (keys.reasoning_queue, keys.tools_queue):
            name = f"worker-{queue.rsplit('.', 1)[-1]}"
            command = [
                sys.executable, "-m", "celery", "-A", "orga", "worker", "-Q", queue,
                "-c", str(self.plan.concurrency), "--loglevel", "INFO", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "-n", f"{name}-{os.getpid()}@%h",
            ]  # fmt: skip
            worker = Process(name, command, self.env, self.root / f"{name}.log").start()
            worker.wait_for_log("ready.", timeout_s=90)
            self.workers.append(worker)
        self.coordinators += [self.coordinator(), self.coordinator()]

    def coordinator(self) -> Process:
        name = f"coordinator-{next(self.numbers)}"
        command = [sys.executable, "-m", "orga.cli", "coordinator"]
        process = Process(name, command, self.env, self.root / f"{name}.log").start()
        process.wait_for_log("coordinator ", timeout_s=90)
        return process

    def stop(self) -> None:
        for process in [*self.coordinators, *self.workers]:
            process.stop()
        self.client.close()

    # -- faults --------------------------------------------------------------------------

    def kill_a_master(self, named_first: bool = False) -> str:
        """SIGKILL a master that has a replica (``named_first``: the node ``ORGA_REDIS_URL``
        names first, when it is such a master); wait until its replica is promoted and the
        cluster is ok."""
        masters = self.cluster.replicated_masters()
        first = self.cluster.ports[0]
        port = first if named_first and first in masters else masters[0]
        self.cluster.kill(port)
        started = time.monotonic()
        replicas = sum(1 for p in self.cluster.running_ports if p not in self.cluster.masters())
        self.cluster.wait_ok(time.monotonic() + 60, replicas=replicas - 1, without=port)
        named = " (named first in ORGA_REDIS_URL)" if port == first else ""
        return (
            f"master :{port}{named} killed, cluster ok again after "
            f"{time.monotonic() - started:.1f}s"
        )

    def kill_a_coordinator(self) -> str:
        old = self.coordinators.pop(0)
        old.kill()
        self.coordinators.append(self.coordinator())
        return f"{old.name} killed (SIGKILL), {self.coordinators[-1].name} started"

    def kill_a_relay_holding_entries(self, timeout_s: float = 30.0) -> str:
        """SIGKILL a coordinator when the outbox of a partition it serves holds entries (its
        relay reads every entry still there, and removes each once published): they were
        being published, or were about to be."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for coordinator in self.coordinators:
                held = self._outbox_pending(coordinator)
                if held:
                    coordinator.kill()
                    self.coordinators.remove(coordinator)
                    self.coordinators.append(self.coordinator())
                    return f"{coordinator.name} killed holding {held} outbox entries"
            time.sleep(0.01)
        return "no relay held outbox entries long enough to be killed (not injected)"

    def _outbox_pending(self, coordinator: Process) -> int:
        total = 0
        for p in range(PARTITIONS):
            try:
                holder = self.client.redis.get(keys.partition_lease_key(p))
                if holder is not None and f"-{coordinator.pid}-" in str(holder):
                    total += int(self.client.redis.xlen(keys.outbox_stream(p)))
                    total += int(self.client.redis.xlen(keys.commit_outbox_stream(p)))
            except (RedisError, RedisClusterException):
                continue
        return total

    # -- the outcome ---------------------------------------------------------------------

    def statuses(self, task_ids: Sequence[str]) -> dict[str, str | None]:
        def read() -> dict[str, str | None]:
            found = {}
            for t in task_ids:
                key = keys.task_key(t, keys.partition_of(t, PARTITIONS))
                status = self.client.redis.hget(key, "status")
                found[t] = None if status is None else str(status)
            return found

        return _retrying(read)

    def groups(self, partition: int) -> str:
        """Each stream's consumer groups (lag, pending) in one partition, for a report."""
        seen = []
        for stream in (keys.observations_stream(partition), keys.outbox_stream(partition),
                       keys.intake_stream(partition), keys.control_stream(partition)):  # fmt: skip
            try:
                groups = self.client.redis.xinfo_groups(stream)
            except (RedisError, RedisClusterException) as exc:
                seen.append(f"{stream}: {exc}")
                continue
            seen += [f"{stream} {g['name']} lag {g['lag']} pending {g['pending']}" for g in groups]
        return "; ".join(seen)

    def events(self) -> list[dict[str, str]]:
        """Every partition's lifecycle events (``orga:{p:NN}:events``), oldest first."""

        def read() -> list[dict[str, str]]:
            found: list[dict[str, str]] = []
            for p in range(PARTITIONS):
                rows = self.client.redis.xrange(keys.events_stream(p), "-", "+")
                found += [{"id": str(i), **{str(k): str(v) for k, v in f.items()}} for i, f in rows]
            return found

        return _retrying(read)

    def received(self) -> int:
        """Celery messages the workers' logs say they received."""
        return sum(len(RECEIVED.findall(w.log.read_text("utf-8", "replace"))) for w in self.workers)

    def received_twice(self) -> int:
        """Celery task ids the workers' logs say were received more than once."""
        counts: Counter[str] = Counter()
        for worker in self.workers:
            counts.update(
                m.group(1) for m in RECEIVED.finditer(worker.log.read_text("utf-8", "replace"))
            )
        return sum(n - 1 for n in counts.values() if n > 1)


def _reason(reason: str) -> str:
    """A ``dispatch_lost`` reason with its figures taken out, to count the reasons."""
    return re.sub(r"[0-9]+(\.[0-9]+)?", "N", reason)


def run(
    plan: ChaosPlan,
    root: Path,
    say: Callable[[str], None] = print,
    *,
    kinds: Sequence[str] = ("master", "coordinator", "relay"),
    named_first: bool = False,
) -> bool:
    cluster = RedisCluster(directory=root / "cluster").start()
    broker = EmbeddedRedis(directory=root / "broker").start()
    chaos = Run(plan, cluster, broker, root)
    try:
        chaos.start()
        task_ids = [
            _retrying(partial(chaos.client.submit, plan.task(i))) for i in range(plan.tasks)
        ]
        say(f"  submitted {len(task_ids)} tasks on {PARTITIONS} partitions, 3 masters")
        started = time.monotonic()

        dispatches = plan.tasks * (2 * plan.iterations + 1)  # reasonings and tool calls

        def done_share() -> float:
            """The share of the run's dispatches the workers have received."""
            return chaos.received() / dispatches

        planned = {
            "master": (0.1, partial(chaos.kill_a_master, named_first=named_first)),
            "coordinator": (0.35, chaos.kill_a_coordinator),
            "relay": (0.55, chaos.kill_a_relay_holding_entries),
            "master2": (0.75, chaos.kill_a_master),
        }
        faults = [planned[kind] for kind in planned if kind in kinds]
        while time.monotonic() - started < plan.duration_s:
            share = done_share()
            while faults and share >= faults[0][0]:
                _at, fault = faults.pop(0)
                say(f"  {time.monotonic() - started:6.1f}s at {share:.0%} done: {fault()}")
            if share >= 1.0 or not faults:
                statuses = chaos.statuses(task_ids)
                if all(s in TERMINAL for s in statuses.values()):
                    break
            time.sleep(0.2)
        for _at, fault in faults:
            say(f"  not injected (the run ended first): {getattr(fault, '__name__', fault)}")
        elapsed = time.monotonic() - started
        statuses = chaos.statuses(task_ids)
        lost = [t for t, s in statuses.items() if s != "completed"]
        twice: list[str] = []
        failed: Counter[str] = Counter()
        for task_id in task_ids:
            if statuses[task_id] is not None:
                journal = _retrying(partial(chaos.client.journal, task_id))
                twice += _journal_violations(task_id, journal)
                failed += Counter(  # a worker's failure: re-sent, and counted as a re-dispatch
                    str(getattr(e.event, "error_kind", "?"))
                    for e in journal
                    if e.event.type == "DispatchFailed"
                )
        commands_twice, _missing = _side_effects(root / "workspaces", task_ids, plan.iterations)
        published_twice = chaos.received_twice()
        events = chaos.events()
        (root / "events.json").write_text(json.dumps(events, indent=1), "utf-8")
        if lost:  # where the lost tasks' partitions stand: unread or unacknowledged entries
            for p in sorted({keys.partition_of(t, PARTITIONS) for t in lost}):
                say(f"  partition {p}: {chaos.groups(p)}")
    finally:
        chaos.stop()
        broker.close()
        cluster.close()
    say(f"  {len(task_ids) - len(lost)}/{len(task_ids)} completed in {elapsed:.1f}s")
    redispatched = sum(1 for e in events if e.get("event") == "redispatched")
    why = Counter(_reason(e.get("reason", "")) for e in events if e.get("event") == "dispatch_lost")
    say(f"  re-dispatched {redispatched}; judged lost because: {dict(why.most_common())}")
    say(f"  failures workers reported, by kind: {dict(failed)}")
    for problem in [*(f"lost: {t} ({statuses[t]})" for t in lost[:10]), *twice[:10]]:
        say(f"  {problem}")
    print(f"RESULT cluster_chaos_lost_tasks {len(lost)}")
    print(f"RESULT cluster_chaos_iterations_applied_twice {len(twice)}")
    print(f"RESULT cluster_chaos_dispatches_published_twice {published_twice}")
    print(f"RESULT cluster_chaos_commands_run_twice {commands_twice}")
    print(f"RESULT cluster_chaos_redispatches {redispatched}")
    print(f"RESULT cluster_chaos_dispatch_failures {sum(failed.values())}")
    return not lost and not twice


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the logs of a passing run")
    parser.add_argument(
        "--faults",
        default="master,coordinator,relay",
        help="which faults, comma-separated, of master (10%%), coordinator (35%%), relay (55%%) "
        "and master2 (a second master killed at 75%%); empty: the same load without faults",
    )
    parser.add_argument(
        "--kill-named-node",
        action="store_true",
        help="the first master killed is the node ORGA_REDIS_URL names first (every process "
        "started after it must reach the cluster through the others)",
    )
    args = parser.parse_args(argv)
    unknown = [k for k in args.faults.split(",") if k and k not in FAULTS]
    if unknown:
        parser.error(f"--faults {args.faults!r}: unknown {unknown}; known: {', '.join(FAULTS)}")
    plan = replace(ChaosPlan(), tasks=args.tasks, iterations=args.iterations, duration_s=400.0)
    print(f"chaos on a Redis Cluster: {plan.tasks} tasks x {plan.iterations + 1} iterations")
    return run_in_scratch(
        "orga-chaos-cluster-",
        lambda root: run(
            plan,
            root,
            kinds=[k for k in args.faults.split(",") if k],
            named_first=args.kill_named_node,
        ),
        keep=args.keep,
        kept="logs",
    )


if __name__ == "__main__":
    sys.exit(main())
