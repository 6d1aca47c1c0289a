"""Outages: a service the task needs is down (its provider, the policy engine).

A worker reports one as ``provider_unavailable`` or ``policy_unavailable`` once its own retries
are spent. It is not the task's failure: no attempt is used up and the progress tracker is not
told (its stuck detection would read the same error repeated as a stuck step). The task holds
the dispatch and sends it again after a back-off (``outage_backoff_s``, doubling, at most
:data:`MAX_BACKOFF_S`), until ``outage_deadline_s`` after the outage began; then it fails,
with a reason that names the outage. The first answer that is not an outage ends it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from coordinator.machine.core import Section
from coordinator.state import Awaiting, Outage, TaskStatus
from shared.events import DispatchFailed, ServiceUnavailable
from shared.protocol import WorkerFailedMessage

__all__ = ["MAX_BACKOFF_S", "OUTAGE_KINDS", "Outages"]

OUTAGE_KINDS = frozenset({"provider_unavailable", "policy_unavailable"})
"""The ``error_kind`` values that report an outage."""

MAX_BACKOFF_S = 300.0
"""The longest the task holds a dispatch between two outage reports."""


class Outages(Section):
    """Outage reports applied: hold the dispatch, send it again, or give up naming it."""

    def reported(self, awaiting: Awaiting, message: WorkerFailedMessage) -> None:
        """A worker said the dispatch met an outage: hold it until the back-off ends, or end
        the task once the outage has lasted ``outage_deadline_s``."""
        m = self.m
        outage = self._track(message)
        settings = m.settings
        ends_at = outage.since + settings.outage_deadline_s
        give_up = m.now >= ends_at
        retry_at = None
        if not give_up:
            backoff = min(settings.outage_backoff_s * 2 ** (outage.reports - 1), MAX_BACKOFF_S)
            retry_at = min(m.now + backoff, ends_at)
        m.journal(
            DispatchFailed(
                fence=message.fence.token(),
                error=message.error[:2000],
                retried=not give_up,
                error_kind=message.error_kind,
            )
        )
        m.journal(
            ServiceUnavailable(
                error_kind=outage.error_kind,
                service=outage.service,
                since=_at(outage.since),
                error=outage.error,
                reports=outage.reports,
                retry_at=_at(retry_at) if retry_at is not None else None,
            )
        )
        m.event(
            outage.error_kind,
            service=outage.service,
            fence=message.fence.token(),
            retry_at="" if retry_at is None else f"{retry_at:.3f}",
        )
        if retry_at is None:
            m.steps.finish(TaskStatus.FAILED, outage.reason(m.now))
            return
        outage.retry_at = retry_at
        awaiting.deadline = retry_at

    def holding(self) -> bool:
        """Whether the task holds its dispatch for an outage."""
        outage = self.record.outage
        return outage is not None and outage.retry_at is not None

    def retry(self, awaiting: Awaiting) -> None:
        """The back-off ended: send the held dispatch again (not a redelivery: an outage uses
        up neither the dispatch's redeliveries nor the step's attempts)."""
        outage = self.record.outage
        assert outage is not None
        outage.retry_at = None
        redeliveries = awaiting.redeliveries
        self.m.redelivery.redispatch(awaiting)
        awaiting.redeliveries = redeliveries

    def answered(self) -> None:
        """A worker answered the task: an outage it met is over."""
        outage = self.record.outage
        if outage is None:
            return
        self.record.outage = None
        self.m.event("service_available", service=outage.service, since=f"{outage.since:.3f}")

    def _track(self, message: WorkerFailedMessage) -> Outage:
        """The outage this report continues, or a new one (another service, another kind)."""
        record = self.record
        kind = (
            "policy_unavailable"
            if message.error_kind == "policy_unavailable"
            else ("provider_unavailable")
        )
        service = message.service or "unknown"
        outage = record.outage
        if outage is None or (outage.error_kind, outage.service) != (kind, service):
            outage = Outage(error_kind=kind, service=service, since=self.m.now, error="", reports=0)
            record.outage = outage
        outage.reports += 1
        outage.error = message.error[:2000]
        return outage


def _at(when: float) -> datetime:
    return datetime.fromtimestamp(when, UTC)
