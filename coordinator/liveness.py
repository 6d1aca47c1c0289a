"""Whether an unanswered dispatch is running, answered, queued or lost: deadlines that measure
work, not queueing.

Temporal's activity timeouts are the model. Workers write, per dispatch, a heartbeat score in
``orga:heartbeats`` (:mod:`workers.liveness`): the time of the last beat while it runs, minus the
time it was answered once its observation is published. When a dispatch's deadline passes the
coordinator reads those scores and the depth and drain rate of the dispatch's queue, and
:meth:`Liveness.judge` decides:

- **running** (a beat younger than the heartbeat timeout): look again one timeout after the
  last beat, unless it has run longer than ``start_to_close_s`` (then it is lost); a
  reasoning that may chain its one call, whose call's tool worker beats its fence too, has
  :data:`CHAINED_LEGS` of them (the model call, the call's wait in the tools queue, the call);
- **answered** (the observation is in the stream): look again one timeout later. While the
  coordinators may not have read or applied it yet (their group has not been delivered entries
  that new, or still has one that old pending), it is never re-sent: on a saturated
  coordinator an observation can wait longer than any fixed grace, and re-sending would pay for
  the model call twice. A reasoning that chained its one approved call handed its answer to
  that call (:class:`~shared.protocol.CompleteReasoning`): it is marked answered at once (its
  worker marks the answer "chained", :func:`shared.keys.answered_via_member`), and
  its observation is written only once a tool worker ran the call; while the tools queue holds
  messages that call may be among them, so it is queued (or has no consumer) as below, not
  lost, and once that queue is empty it gets one look more (taken, not started yet). A
  reasoning whose answer is marked as published on the observations stream ("direct") has no
  such wait (nor the three legs below), whatever it may have chained; one with no mark (a
  worker older than the marks) may have chained. It is
  lost once it must have been read and was not applied (two timeouts after the answer, and
  no chained call it may travel with still waiting), and in any case past
  ``start_to_close_s``;
- **stale** (beats stopped): its worker is gone, it is lost and re-sent;
- **not started**: while its queue holds messages and drains, it is queued, and the next look
  is when the queue should have drained (twice the depth over the drain rate); a queue that
  holds messages and does not drain has no consumer (look again, and say so); a dispatch still
  not started once its queue is empty, one timeout after the first such look, is lost.

This module is pure (no Redis): the service reads the scores, the machine applies the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from shared import keys

__all__ = [
    "UNKNOWN_PROGRESS",
    "Judgement",
    "Liveness",
    "LivenessSettings",
    "StreamProgress",
    "Verdict",
]

ANSWER_SLACK_MS = 5000
"""How far a worker's clock (the answer's time) may be from Redis's (the entry's id)."""

MAX_QUEUED_WAIT_S = 600.0
"""The longest a queued dispatch waits before the coordinator looks at it again."""
CHAINED_LEGS = 3
"""A reasoning that may chain its one call runs in three legs, each within start-to-close:
its model call, the call's wait in the tools queue, the call (its worker beats the
reasoning's fence too)."""


class Verdict(StrEnum):
    """What a late dispatch is."""

    RUNNING = "running"
    ANSWERED = "answered"
    QUEUED = "queued"
    NO_CONSUMER = "no_consumer"
    UNSTARTED = "unstarted"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class LivenessSettings:
    """The timeouts the verdicts use (``ORGA_HEARTBEAT_TIMEOUT_S``, ``ORGA_START_TO_CLOSE_S``),
    and how often workers beat (``ORGA_HEARTBEAT_INTERVAL_S``: they add their start counts
    with each beat, so the drain rate is measured over two of them)."""

    heartbeat_timeout_s: float = 30.0
    start_to_close_s: float = 900.0
    heartbeat_interval_s: float = 5.0


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """Where the coordinators' group stands on a stream, as stream-id milliseconds (Redis
    server time): the newest entry delivered to one of them, and the oldest delivered but not
    yet acknowledged (None: unknown, or nothing pending)."""

    delivered_ms: int | None = None
    oldest_pending_ms: int | None = None

    def may_hold(self, at_ms: int, slack_ms: int) -> bool:
        """Whether an entry written at ``at_ms`` may still be unread or unapplied: not yet
        delivered, or delivered no earlier than the oldest entry still pending. ``slack_ms``
        covers the difference between the writer's clock and Redis's."""
        if self.delivered_ms is None:
            return False
        unread = self.delivered_ms < at_ms + slack_ms
        pending = self.oldest_pending_ms is not None and self.oldest_pending_ms <= at_ms + slack_ms
        return unread or pending


UNKNOWN_PROGRESS = StreamProgress()
"""No group seen (yet): an answer is judged by its age alone."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict, why, and when to look again (None: re-send now)."""

    verdict: Verdict
    reason: str
    look_again_at: float | None


@dataclass(frozen=True, slots=True)
class Liveness:
    """What Redis said about one task's late dispatch."""

    scores: Mapping[str, float | None]
    """Heartbeat score of each liveness id of the dispatch (None: no entry)."""
    queue: str
    queue_depth: int
    drain_per_s: float
    """Dispatches started per second on that queue, lately (0: none started)."""
    observations: StreamProgress = UNKNOWN_PROGRESS
    """How far the coordinators have read and applied the observations stream."""
    chains: bool = False
    """The dispatch is a reasoning that may chain its calls: its answer may travel with the one
    call it chained, queued in the tools queue (``chained_depth``) or about to start. The
    answer marks (``marks``) narrow it: an answer its worker marked as published on the
    observations stream did not travel with a call."""
    marks: Mapping[str, float | None] = field(default_factory=dict)
    """Heartbeat score of the answer marks (:func:`shared.keys.answered_via_member`) of each
    liveness id of the dispatch (None, or missing: no such mark)."""
    chained_depth: int = 0
    """Messages waiting in the tools queue (read with ``chains``)."""
    chained_drain_per_s: float = 0.0
    """Dispatches started per second on the tools queue, lately (read with ``chains``)."""

    def judge(
        self,
        ids: Sequence[str],
        now: float,
        dispatched_at: float | None,
        unstarted_looks: int,
        settings: LivenessSettings,
    ) -> Judgement:
        """The verdict on the dispatch whose liveness ids are ``ids``."""
        timeout = settings.heartbeat_timeout_s
        scores = [s for s in (self.scores.get(i) for i in ids) if s is not None]
        beats = [s for s in scores if s > 0]
        chains = self.may_have_chained(ids)
        if any(s < 0 for s in scores):
            answered = -min(s for s in scores if s < 0)
            return self._answered(answered, now, unstarted_looks, settings, chains)
        if beats:
            return self._started(max(beats), now, dispatched_at, settings, chains)
        return self._unstarted(now, unstarted_looks, timeout)

    def may_have_chained(self, ids: Sequence[str]) -> bool:
        """Whether the dispatch's answer may travel with a call it chained: it may chain
        (``chains``) and the latest answer mark of ``ids`` says so; no mark (not answered
        yet, or answered by a worker older than the marks) keeps "may have chained"."""
        if not self.chains:
            return False
        latest: tuple[float, str] | None = None
        for via in (keys.ANSWERED_CHAINED, keys.ANSWERED_DIRECT):  # a tie: direct
            for i in ids:
                score = self.marks.get(keys.answered_via_member(i, via))
                if score is not None and (latest is None or -score >= latest[0]):
                    latest = (-score, via)
        return latest is None or latest[1] == keys.ANSWERED_CHAINED

    def _answered(
        self,
        answered: float,
        now: float,
        unstarted_looks: int,
        settings: LivenessSettings,
        chains: bool,
    ) -> Judgement:
        timeout = settings.heartbeat_timeout_s
        age = now - answered
        queued = self.observations.may_hold(int(answered * 1000), ANSWER_SLACK_MS)
        if age < settings.start_to_close_s and (age < 2 * timeout or queued):
            return Judgement(Verdict.ANSWERED, "answered; its observation is on its way",
                             now + timeout)  # fmt: skip
        if age < settings.start_to_close_s and chains:
            why = f"answered {age:.0f}s ago, its answer maybe with the call it chained: "
            if self.chained_depth > 0:
                return self._queued(
                    keys.tools_queue, self.chained_depth, self.chained_drain_per_s, now=now,
                    timeout=timeout, why=why,
                )  # fmt: skip
            if unstarted_looks == 0:  # one grace look: taken from the queue, not started yet
                reason = why + f"{keys.tools_queue} is empty"
                return Judgement(Verdict.UNSTARTED, reason, now + timeout)
        return Judgement(Verdict.LOST, f"answered {age:.0f}s ago and never applied", None)

    @staticmethod
    def _started(
        beat: float,
        now: float,
        dispatched_at: float | None,
        settings: LivenessSettings,
        chains: bool = False,
    ) -> Judgement:
        timeout = settings.heartbeat_timeout_s
        if now - beat >= timeout:
            return Judgement(
                Verdict.LOST, f"its worker stopped heartbeating {now - beat:.0f}s ago", None
            )
        # A reasoning that chains its one call is beaten by its model call, then by the call
        # (after its wait in the tools queue): each leg has its start-to-close.
        legs = CHAINED_LEGS if chains else 1
        if dispatched_at is not None and now - dispatched_at > legs * settings.start_to_close_s:
            return Judgement(
                Verdict.LOST,
                f"still running after {now - dispatched_at:.0f}s "
                f"(ORGA_START_TO_CLOSE_S={settings.start_to_close_s:g}"
                f"{f' for each of its {legs} legs' if legs > 1 else ''})",
                None,
            )
        return Judgement(Verdict.RUNNING, "running", beat + timeout)

    def _unstarted(self, now: float, unstarted_looks: int, timeout: float) -> Judgement:
        if self.queue_depth > 0:
            return self._queued(
                self.queue, self.queue_depth, self.drain_per_s, now=now, timeout=timeout
            )
        if unstarted_looks == 0:
            return Judgement(Verdict.UNSTARTED, "not started; its queue is empty", now + timeout)
        return Judgement(Verdict.LOST, "never started and no longer queued", None)

    @staticmethod
    def _queued(
        queue: str, depth: int, drain_per_s: float, *, now: float, timeout: float, why: str = ""
    ) -> Judgement:
        """Waiting in ``queue`` (``depth`` > 0): look again once it should have drained, or,
        when no worker started one of its messages lately, one timeout later (and say so)."""
        if drain_per_s > 0:
            wait = min(max(2 * depth / drain_per_s, timeout), MAX_QUEUED_WAIT_S)
            reason = f"queued behind {depth} messages on {queue} (draining {drain_per_s:.1f}/s)"
            return Judgement(Verdict.QUEUED, why + reason, now + wait)
        role = "reasoning" if queue == keys.reasoning_queue else "tools"
        reason = (
            f"{queue} holds {depth} messages and no worker started one lately: start a worker "
            f"for that queue (orga worker --role {role}, or celery -A orga worker -Q {queue})"
        )
        return Judgement(Verdict.NO_CONSUMER, why + reason, now + timeout)
