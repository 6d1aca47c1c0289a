"""Chaos with sub-agents: the coordinator is killed while parents wait on their children.

Run: ``.venv/bin/python bench/chaos_delegation.py`` (part of ``make chaos``); ``--parents 4``
for a short run.

It starts a private Redis with AOF on, one Celery worker (both queues) and one
``orga coordinator``, all real processes, registers a sub-agent (``helper``: two steps, the
first verified, each a ``run_command`` that appends a line to a side-effect file and sleeps),
and submits ``--parents`` tasks, each delegating to two helpers in one turn and answering once
both came back. Then:

- as soon as a parent has submitted its children (their intake entries may not be read yet),
  the coordinator is killed (SIGKILL) and a new one started, as a supervisor would;
- once every parent waits on its two children, it is killed and restarted again;
- once the first children have ended (their results are on the observations stream, maybe not
  yet applied), the coordinator is killed and restarted again.

Pass criteria (exit code 1 when one fails): every parent completed, with exactly two children;
each child submitted to the intake once, created once (one ``accepted`` event), completed;
each child's end applied to its parent once (one ``child_finished`` event per child, the
parent's two ``delegate`` results each once in its conversation); gapless parent journals.

Headlines are printed as ``RESULT <name> <value>`` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.chaos import _all_events, run_in_scratch
from coordinator.client import OrgaClient, TaskNotFoundError
from coordinator.state import TaskRecord
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.conversation import MessageRole
from tests.integration.harness import Cluster

__all__ = ["DelegationChaosPlan", "DelegationChaosReport", "main", "run_delegation_chaos"]

SIDE_EFFECTS = "side-effects.txt"


@dataclass(frozen=True)
class DelegationChaosPlan:
    """How many parents, how long each child's commands take, and the timings."""

    parents: int = 10
    child_command_s: float = 2.0
    observation_deadline_s: float = 8.0
    duration_s: float = 240.0
    partitions: int = 1
    """``ORGA_PARTITIONS`` of every process and of the client: a tree lives in its root's
    partition, the parents spread over them, and the checks read every partition's intake and
    events (``tests/integration`` passes the suite's count)."""

    def environment(self) -> dict[str, str]:
        return {
            "ORGA_PARTITIONS": str(self.partitions),
            "ORGA_OBSERVATION_DEADLINE_S": str(self.observation_deadline_s),
            "ORGA_HEARTBEAT_TIMEOUT_S": str(self.observation_deadline_s / 2),
            "ORGA_HEARTBEAT_INTERVAL_S": str(self.observation_deadline_s / 8),
            "ORGA_TICK_INTERVAL_S": "0.2",
            "ORGA_LEASE_TTL_S": "3",
            "ORGA_PARTITION_LEASE_TTL_S": "3",
            "ORGA_CLAIM_IDLE_MS": "1500",
        }

    def helper(self) -> dict[str, Any]:
        """The sub-agent: two steps, each one command that leaves a line in its workspace's
        ``SIDE_EFFECTS`` file and takes its time."""

        def command(step: str) -> str:
            line = f"echo {step} >> {SIDE_EFFECTS}"
            return f"{line}; sleep {self.child_command_s}; touch {step}"

        return {
            "name": "helper",
            "provider": {"kind": "scripted", "replies": [
                {"tool_calls": [{"name": "run_command", "arguments": {"command": command("one")}}]},
                "step one done",
                {"tool_calls": [{"name": "run_command", "arguments": {"command": command("two")}}]},
                "helper finished",
            ]},
            "tools": ["run_command"],
            "limits": {"tool_timeout": f"{self.child_command_s * 5:g}s", "max_iterations": 5},
        }  # fmt: skip

    def parent(self, index: int) -> dict[str, Any]:
        """Parent ``index``: two delegations in one turn, then the answer ``combined-<index>``."""
        steps = [
            {"id": "one", "instruction": "run step one", "done_when": "test -f one"},
            {"id": "two", "instruction": "run step two"},
        ]
        calls = [
            {"name": "delegate", "arguments": {"agent": "helper", "goal": f"half {h}",
                                               "steps": steps}}
            for h in (1, 2)
        ]  # fmt: skip
        return {
            "goal": f"delegation chaos {index}",
            "steps": [{"id": "main", "instruction": "delegate both halves, then combine"}],
            "provider": {"kind": "scripted", "replies": [{"tool_calls": calls},
                                                         f"combined-{index}"]},
            "limits": {"max_iterations": 20},
        }  # fmt: skip


@dataclass
class DelegationChaosReport:
    """What the run found: per-parent violations and the counts the criteria are made of."""

    parents: int
    kills: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    children_created: int = 0
    children_submitted_twice: int = 0
    children_started_twice: int = 0
    results_applied_twice: int = 0
    parents_completed: int = 0
    side_effect_lines: int = 0
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Every criterion held."""
        return not self.violations and self.parents_completed == self.parents

    def results(self) -> list[str]:
        """The headline figures, one ``RESULT`` line each."""
        return [
            f"RESULT delegation_parents_completed {self.parents_completed}/{self.parents}",
            f"RESULT delegation_children_created {self.children_created}",
            f"RESULT delegation_children_submitted_twice {self.children_submitted_twice}",
            f"RESULT delegation_children_started_twice {self.children_started_twice}",
            f"RESULT delegation_results_applied_twice {self.results_applied_twice}",
            f"RESULT delegation_coordinator_kills {len(self.kills)}",
            f"RESULT delegation_child_commands_run {self.side_effect_lines}",
            f"RESULT delegation_elapsed_s {self.elapsed_s:.1f}",
        ]


def run_delegation_chaos(
    plan: DelegationChaosPlan, server: EmbeddedRedis, root: Path, say: Callable[[str], None] = print
) -> DelegationChaosReport:
    """Run the plan against ``server`` with processes logging under ``root``."""
    cluster = Cluster(server.url, root)
    report = DelegationChaosReport(parents=plan.parents)
    started = time.monotonic()
    try:
        cluster.worker(concurrency=4, **plan.environment())
        coordinator = cluster.coordinator(**plan.environment())
        client = OrgaClient(server.url, partitions=plan.partitions)
        client.redis.hset(keys.agents_key, "helper", json.dumps(plan.helper()))
        parents = [
            client.submit(plan.parent(i), task_id=f"dchaos-{i}") for i in range(plan.parents)
        ]
        deadline = started + plan.duration_s
        _wait(lambda: _some_children_recorded(client, parents), deadline)
        coordinator = _restart(cluster, coordinator, "the first children were submitted", report)
        _wait(lambda: _all_waiting_on_children(client, parents), deadline)
        coordinator = _restart(cluster, coordinator, "parents waiting on both children", report)
        _wait(lambda: _some_child_ended(client, parents), deadline)
        coordinator = _restart(cluster, coordinator, "first children ended", report)
        _wait(lambda: all(_status(client, p) in ("completed", "failed", "aborted")
                          for p in parents), deadline)  # fmt: skip
        report.elapsed_s = time.monotonic() - started
        _check(client, parents, report)
        report.side_effect_lines = sum(
            len(f.read_text().splitlines()) for f in cluster.workspaces.rglob(SIDE_EFFECTS)
        )
    finally:
        for line in report.kills:
            say(f"killed: {line}")
        cluster.stop()
    return report


def _restart(cluster: Cluster, old: Any, when: str, report: DelegationChaosReport) -> Any:
    old.kill()
    cluster.processes.remove(old)
    report.kills.append(f"coordinator pid {old.pid} (SIGKILL) when {when}")
    return cluster.coordinator(name=f"c{len(report.kills) + 1}", **_env_of(old))


def _env_of(process: Any) -> dict[str, str]:
    return {k: v for k, v in process.env.items() if k.startswith("ORGA_") and k not in (
        "ORGA_REDIS_URL", "ORGA_WORKSPACE_ROOT")}  # fmt: skip


def _wait(condition: Callable[[], bool], deadline: float) -> None:
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError("the chaos run did not get there before its deadline")


def _status(client: OrgaClient, task_id: str) -> str | None:
    try:
        return str(client.status(task_id)["status"])
    except TaskNotFoundError:
        return None


def _record(client: OrgaClient, task_id: str) -> TaskRecord | None:
    try:
        return client.record(task_id)
    except TaskNotFoundError:
        return None


def _all_waiting_on_children(client: OrgaClient, parents: Sequence[str]) -> bool:
    """Every parent created its two children, and some parent still waits on them."""
    records = [_record(client, p) for p in parents]
    if any(r is None or len(r.children) < 2 for r in records):
        return False
    return any(r is not None and r.awaiting is not None for r in records)


def _some_children_recorded(client: OrgaClient, parents: Sequence[str]) -> bool:
    return any((r := _record(client, p)) is not None and r.children for p in parents)


def _some_child_ended(client: OrgaClient, parents: Sequence[str]) -> bool:
    return any(
        _status(client, f"{parent}.{n}") == "completed" for parent in parents for n in (1, 2)
    )


def _check(client: OrgaClient, parents: Sequence[str], report: DelegationChaosReport) -> None:
    """Every partition's intake entries and events (a child is in its parent's partition, the
    parents are spread over all of them)."""
    plain = redis.Redis.from_url(client.redis_url, decode_responses=True)
    submitted: dict[str, int] = {}
    for stream in keys.partition_streams(client.partition_count, keys.intake_stream):
        for _id, fields in plain.xrange(stream):
            task_id = fields.get("task_id", "")
            submitted[task_id] = submitted.get(task_id, 0) + 1
    plain.close()
    events = _all_events(client)
    for parent in parents:
        _check_parent(client, parent, submitted, events, report)


def _check_parent(
    client: OrgaClient,
    parent: str,
    submitted: dict[str, int],
    events: list[dict[str, str]],
    report: DelegationChaosReport,
) -> None:
    record = _record(client, parent)
    if record is None:
        report.violations.append(f"{parent}: lost")
        return
    index = parent.rsplit("-", 1)[1]
    if record.status.value == "completed" and record.output == f"combined-{index}":
        report.parents_completed += 1
    else:
        report.violations.append(f"{parent}: {record.status.value} {record.error!r}")
    children = [c.task_id for c in record.children]
    if children != [f"{parent}.1", f"{parent}.2"]:
        report.violations.append(f"{parent}: children {children}")
    for child in children:
        report.children_created += 1
        if submitted.get(child, 0) != 1:
            report.children_submitted_twice += submitted.get(child, 0) > 1
            report.violations.append(f"{child}: submitted {submitted.get(child, 0)} times")
        accepted = sum(1 for e in events if e.get("task_id") == child and e["event"] == "accepted")
        if accepted != 1:
            report.children_started_twice += accepted > 1
            report.violations.append(f"{child}: accepted {accepted} times")
        done = _record(client, child)
        if done is None or done.status.value != "completed" or done.milestones != ["step:one"]:
            shown = (done.status.value, done.milestones, done.error) if done else None
            report.violations.append(f"{child}: {shown}")
    applied = sum(
        1 for e in events if e.get("task_id") == parent and e["event"] == "child_finished"
    )
    results = [
        m for m in record.conversation.messages
        if m.role is MessageRole.TOOL and m.tool_name == "delegate"
    ]  # fmt: skip
    if applied != 2 or len(results) != 2:
        report.results_applied_twice += applied > 2 or len(results) > 2
        report.violations.append(f"{parent}: {applied} child ends applied, {len(results)} results")
    sequences = [e.sequence for e in client.journal(parent)]
    if sequences != list(range(len(sequences))):
        report.violations.append(f"{parent}: journal not gapless {sequences}")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Coordinator kills while parents wait on children."
    )
    parser.add_argument("--parents", type=int, default=10)
    parser.add_argument("--child-command", type=float, default=2.0, help="seconds per command")
    parser.add_argument(
        "--partitions", type=int, default=1, help="ORGA_PARTITIONS of every process"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs even when it passed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run it; 0 when every criterion held."""
    args = _arguments(argv)
    plan = DelegationChaosPlan(
        parents=args.parents, child_command_s=args.child_command, partitions=args.partitions
    )

    def run(root: Path) -> bool:
        (root / "redis").mkdir()
        print(
            f"delegation chaos: {plan.parents} parents x 2 children on {plan.partitions} "
            f"partition(s); logs in {root}"
        )
        server = EmbeddedRedis(appendonly=True, directory=root / "redis").start()
        try:
            report = run_delegation_chaos(plan, server, root)
        finally:
            server.stop()
        print("\n".join(report.results()))
        for violation in report.violations:
            print(f"VIOLATION {violation}")
        return report.passed

    return run_in_scratch("orga-chaos-delegation-", run, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
