"""The two drivers of the loop behind one test seam, and what their runs are compared on.

``inprocess`` steps :class:`~orga.inprocess.InProcessDriver` over a
:func:`~workers.runtime.local_core`; ``distributed`` submits to a real coordinator process and a
real Celery worker process through :class:`~coordinator.client.OrgaClient`. Both implement
:class:`LoopDriver` and answer a run with an :class:`Outcome`; :func:`comparable` keeps what
must be identical between two runs of one task.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from coordinator.agents import AgentRegistry
from coordinator.client import OrgaClient
from coordinator.machine import MachineSettings
from coordinator.state import ReviewDecision, ReviewItem, TaskRecord
from orga.inprocess import InProcessDriver, ReviewVerdict
from shared.agent_profile import AgentProfile
from shared.events import JournalEntry
from tests.integration.harness import Cluster, status_of
from workers.runtime import local_core

__all__ = [
    "TRANSPORT_EVENTS",
    "Decision",
    "DistributedLoop",
    "InProcessLoop",
    "LoopDriver",
    "Outcome",
    "comparable",
]

TRANSPORT_EVENTS = frozenset({"redispatched", "dispatch_lost", "no_consumer"})
"""Lifecycle events about the transport, not the loop: only the distributed driver has them."""

STORED_ID = re.compile(r"^Stored fact: .* \(id: ([^)\s]+)\)$", re.S)
"""A knowledge item's id in ``store_knowledge``'s answer: each store draws its own (a uuid in
Redis, a counter in memory), as each run draws its task id."""

MEASURED = frozenset({"timestamp", "duration", "duration_ms", "deadline"})
"""Fields that measure or depend on the clock (a review's deadline): never equal in two runs."""

WAIT_S = 60.0
"""How long a distributed run may take to end or escalate."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A reviewer's answer to the next escalation of a run."""

    decision: ReviewDecision
    hint: str | None = None
    arguments: dict[str, Any] | None = None
    """An ``edit``'s new arguments for a held call."""


@dataclass
class Outcome:
    """What one run of a task produced, read back the way its driver offers it."""

    task_id: str
    workspace_root: str
    record: TaskRecord
    journal: list[JournalEntry]
    events: list[str]
    review_ids: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    """From the start of the run (the submission) until it returned."""

    @property
    def status(self) -> str:
        """The task's status when the run returned."""
        return self.record.status.value

    @property
    def result(self) -> dict[str, Any]:
        """What ``orga result`` prints."""
        return self.record.result()

    def events_of(self, kind: str) -> list[Any]:
        """The journal's events of one type, in order."""
        return [e.event for e in self.journal if e.event.type == kind]

    def drawn_ids(self) -> list[str]:
        """Ids the run drew at random, in order: its reviews', then its stored items'."""
        stored = [STORED_ID.match(m) for m in self.messages()]
        return [*self.review_ids, *(m.group(1) for m in stored if m)]

    def messages(self) -> list[str]:
        """The text of every conversation message, in order."""
        return [m.content for m in self.record.conversation.messages]


class LoopDriver(Protocol):
    """Runs a task to its end (or an undecided review), deciding escalations as told."""

    name: str

    def run(
        self,
        task: dict[str, Any],
        decisions: Sequence[Decision] = (),
        agents: Sequence[AgentProfile] = (),
    ) -> Outcome:
        """Run ``task``; the n-th escalation gets ``decisions[n]``, later ones stay open;
        ``agents`` are the registered agents the task (its critics and its sub-agents) may name."""
        ...


@dataclass
class _Reviewer:
    """Decides the escalations of one in-process run from a list, then leaves them open."""

    decisions: list[Decision]
    seen: list[str] = field(default_factory=list)

    async def decide(self, review: ReviewItem) -> ReviewVerdict | None:
        self.seen.append(review.review_id)
        if len(self.seen) > len(self.decisions):
            return None
        chosen = self.decisions[len(self.seen) - 1]
        return ReviewVerdict(
            chosen.decision, chosen.hint, decided_by="parity", arguments=chosen.arguments
        )


@dataclass
class InProcessLoop:
    """The in-process driver over a local core, each task in a workspace under ``root``."""

    root: Path
    name: str = "inprocess"

    def run(
        self,
        task: dict[str, Any],
        decisions: Sequence[Decision] = (),
        agents: Sequence[AgentProfile] = (),
    ) -> Outcome:
        """Run the task in this process (no Redis, no Celery)."""
        return asyncio.run(self._run(task, list(decisions), agents))

    async def _run(
        self, task: dict[str, Any], decisions: list[Decision], agents: Sequence[AgentProfile]
    ) -> Outcome:
        started = time.monotonic()
        core = local_core()
        reviewer = _Reviewer(decisions)
        driver = InProcessDriver(
            core,
            MachineSettings(workspace_root=str(self.root)),
            reviewer=reviewer,
            agents={a.name: a for a in agents},
        )
        try:
            run = await driver.run(task)
        finally:
            await core.aclose()
        return Outcome(
            task_id=run.record.task_id,
            workspace_root=str(self.root),
            record=run.record,
            journal=run.journal,
            events=[e["event"] for e in run.events],
            review_ids=reviewer.seen,
            elapsed_s=time.monotonic() - started,
        )


@dataclass
class DistributedLoop:
    """A real coordinator process and a real Celery worker process over a private Redis."""

    cluster: Cluster
    name: str = "distributed"

    def run(
        self,
        task: dict[str, Any],
        decisions: Sequence[Decision] = (),
        agents: Sequence[AgentProfile] = (),
    ) -> Outcome:
        """Register the agents, submit the task, decide its escalations with the client, read
        it back."""
        started = time.monotonic()
        client = self.cluster.client()
        try:
            registry = AgentRegistry(client.redis)
            for agent in agents:
                registry.add(agent, replace=True)
            task_id = client.submit(task)
            review_ids: list[str] = []
            for decision in decisions:
                review_id = _settled(client, task_id, review_ids)
                if review_id is None:
                    break
                review_ids.append(review_id)
                client.decide(
                    review_id,
                    decision.decision,
                    decision.hint,
                    by="parity",
                    arguments=decision.arguments,
                )
            last = _settled(client, task_id, review_ids)
            if last is not None:
                review_ids.append(last)
            elapsed_s = time.monotonic() - started
            return Outcome(
                task_id=task_id,
                workspace_root=str(self.cluster.workspaces),
                record=client.record(task_id),
                journal=client.journal(task_id),
                events=_events(client, task_id),
                review_ids=review_ids,
                elapsed_s=elapsed_s,
            )
        finally:
            client.close()


def _settled(client: OrgaClient, task_id: str, decided: list[str]) -> str | None:
    """Wait until the task ended (None) or waits on a review not yet decided (its id)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        status = status_of(client, task_id)
        if status in ("completed", "failed", "aborted"):
            return None
        if status == "awaiting_review":
            review_id = client.status(task_id)["review_id"]
            if review_id is not None and review_id not in decided:
                return str(review_id)
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} neither ended nor escalated within {WAIT_S}s")


def _events(client: OrgaClient, task_id: str) -> list[str]:
    """The names of the task's lifecycle events, in order."""
    names: list[str] = []
    after = "0-0"
    while rows := client.events(after=after):
        names.extend(f["event"] for _id, f in rows if f.get("task_id") == task_id)
        after = rows[-1][0]
    return names


def comparable(outcome: Outcome) -> dict[str, Any]:
    """The run without what differs by nature between two runs: timestamps, measured
    durations, drawn ids and the workspace root (each replaced by a placeholder), and the
    lifecycle events about the transport. Sequence, step, iteration and every event field are
    kept."""
    journal = [_unmeasured(entry.model_dump(mode="json")) for entry in outcome.journal]
    document = {
        "status": outcome.status,
        "result": outcome.result,
        "journal": journal,
        "conversation": outcome.record.conversation.model_dump(mode="json"),
        "milestones": list(outcome.record.milestones),
        "events": [e for e in outcome.events if e not in TRANSPORT_EVENTS],
    }
    normalised: dict[str, Any] = _without_ids(document, outcome)
    return normalised


def _unmeasured(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmeasured(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [_unmeasured(v) for v in value]
    return value


def _without_ids(value: Any, outcome: Outcome) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v, outcome) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_ids(v, outcome) for v in value]
    if not isinstance(value, str):
        return value
    text = value.replace(outcome.workspace_root, "<root>").replace(outcome.task_id, "<task>")
    for number, drawn in enumerate(outcome.drawn_ids()):
        text = text.replace(drawn, f"<id {number}>")
    return text
