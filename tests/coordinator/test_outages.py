"""The coordinator applies an outage of a provider or policy engine: the dispatch is held and
sent again with back-off, the step's attempts and the progress tracker untouched, until the
outage deadline; then the task fails with a reason naming the outage (not "stuck")."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.metrics import CoordinatorMetrics
from coordinator.state import AwaitKind, TaskRecord, TaskStatus
from shared.conversation import ConversationMessage
from shared.protocol import ReasonedMessage, WorkerFailedMessage
from shared.task_spec import parse_task

SETTINGS = MachineSettings(
    observation_deadline_s=10.0,
    max_redeliveries=2,
    workspace_root="/ws",
    outage_deadline_s=100.0,
    outage_backoff_s=5.0,
)
ERROR = (
    "ProviderUnavailableError: openai at http://model/v1/chat/completions answered HTTP 503 "
    "Service Unavailable through the retries; the provider is failing, try again later: busy"
)


def _record() -> TaskRecord:
    spec = parse_task(
        {
            "goal": "answer",
            "steps": [{"id": "answer", "instruction": "answer it"}],
            "step_iteration": {"max_reattempts_per_step": 1},
        }
    )
    return TaskRecord(task_id="t1", spec=spec, created_at=0.0, updated_at=0.0)


def _apply(record: TaskRecord, now: float, step: Any) -> Effects:
    effects: Effects = step(TaskMachine(record, now, SETTINGS))
    return effects


def _outage(record: TaskRecord, now: float, kind: str = "provider_unavailable") -> Effects:
    assert record.awaiting is not None
    failed = WorkerFailedMessage(
        fence=record.awaiting.fence,
        error=ERROR,
        error_kind=kind,  # type: ignore[arg-type]
        service="openai" if kind == "provider_unavailable" else "opa at http://opa:8181",
    )
    return _apply(record, now, lambda m: m.on_worker_failed(failed))


def _tick(record: TaskRecord, now: float) -> Effects:
    return _apply(record, now, lambda m: m.on_tick())


def _events(effects: Effects, kind: str) -> list[Any]:
    return [e.event for e in effects.journal if e.event.type == kind]


def test_an_outage_holds_the_dispatch_and_sends_it_again_with_back_off() -> None:
    """Each outage report holds the model call (no new dispatch, no attempt, the tracker not
    told) until a back-off of 5, then 10, then 20 s; the tick at that time sends it again; the
    journal has DispatchFailed and ServiceUnavailable naming the provider and the retry time."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    tracker = dict(record.tracker)
    sent_at = 1.0
    for report, backoff in enumerate((5.0, 10.0, 20.0), start=1):
        now = sent_at + 2.0
        effects = _outage(record, now)
        assert effects.reason_dispatches == []
        assert record.awaiting is not None and record.awaiting.deadline == now + backoff
        assert record.steps[0].attempts == 0
        assert record.tracker == tracker
        unavailable = _events(effects, "ServiceUnavailable")
        assert [(u.service, u.reports, u.retry_at.timestamp()) for u in unavailable] == [
            ("openai", report, now + backoff)
        ]
        assert unavailable[0].since.timestamp() == 3.0
        assert [d.error_kind for d in _events(effects, "DispatchFailed")] == [
            "provider_unavailable"
        ]
        assert _events(effects, "AttemptFailed") == []
        assert [e["event"] for e in effects.events] == ["provider_unavailable"]
        assert not _tick(record, now + backoff - 0.5).changed
        effects = _tick(record, now + backoff)
        assert len(effects.reason_dispatches) == 1
        assert record.awaiting.redeliveries == 0
        sent_at = now + backoff


def test_the_first_answer_after_an_outage_ends_it_with_the_attempts_intact() -> None:
    """The provider recovers: the re-sent call's answer completes the step, no attempt used."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    _outage(record, 3.0)
    _tick(record, 8.0)
    assert record.awaiting is not None
    answer = ReasonedMessage(
        fence=record.awaiting.fence,
        new_messages=[ConversationMessage.assistant("42")],
        terminal_output="42",
    )
    effects = _apply(record, 9.0, lambda m: m.on_reasoned(answer))
    assert record.status is TaskStatus.COMPLETED, record.error
    assert record.outage is None
    assert record.steps[0].attempts == 0
    assert "service_available" in [e["event"] for e in effects.events]


def test_an_outage_past_its_deadline_fails_the_task_naming_it() -> None:
    """Reports until 100 s after the first report of the outage: the task fails with a
    reason that names the provider, its error and since when; nothing says "stuck" or
    "similar", and no attempt was used."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    now = 3.0
    while record.status is TaskStatus.RUNNING:
        effects = _outage(record, now)
        if record.status is not TaskStatus.RUNNING:
            break
        assert record.awaiting is not None
        retry_at = record.awaiting.deadline
        assert retry_at <= 103.0
        _tick(record, retry_at)
        now = retry_at + 2.0
    assert record.status is TaskStatus.FAILED
    assert record.error is not None
    assert record.error.startswith("provider openai unavailable since 1970-01-01T00:00:03+00:00")
    assert "HTTP 503" in record.error
    assert "stuck" not in record.error and "similar" not in record.error
    assert record.steps[0].attempts == 0
    assert record.steps[0].note == record.error
    gave_up = _events(effects, "ServiceUnavailable")
    assert [u.retry_at for u in gave_up] == [None]
    assert [d.retried for d in _events(effects, "DispatchFailed")] == [False]


def test_a_policy_engine_outage_is_held_the_same_way() -> None:
    """An OPA server that cannot be asked holds the call like a provider outage, named as
    the policy engine in the journal and in the task's reason once it gives up."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    effects = _outage(record, 3.0, "policy_unavailable")
    assert effects.reason_dispatches == [] and record.steps[0].attempts == 0
    assert [u.service for u in _events(effects, "ServiceUnavailable")] == ["opa at http://opa:8181"]
    _outage(record, 200.0, "policy_unavailable")
    assert record.status is TaskStatus.FAILED
    assert record.error is not None
    assert record.error.startswith("policy engine opa at http://opa:8181 unavailable since")


def test_cancel_while_the_dispatch_is_held_aborts_the_task() -> None:
    """`orga cancel` during the hold aborts at once; the hold's tick then changes nothing."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    _outage(record, 3.0)
    _apply(record, 4.0, lambda m: m.cancel("operator"))
    assert record.status is TaskStatus.ABORTED
    assert not _tick(record, 8.0).changed


def test_the_held_dispatch_says_what_it_waits_on() -> None:
    """While held, the outage says "waiting on the provider openai (retry at ...)"."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    _outage(record, 3.0)
    assert record.outage is not None
    assert record.outage.waiting() == (
        "waiting on the provider openai (retry at 1970-01-01T00:00:08+00:00; "
        "down since 1970-01-01T00:00:03+00:00)"
    )
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON


def test_metrics_count_outages_by_outcome() -> None:
    """orga_service_unavailable counts each report: held, then gave_up."""
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    metrics.record(record, _outage(record, 3.0))
    metrics.record(record, _outage(record, 200.0))
    labels = {"kind": "provider_unavailable", "service": "openai"}
    for outcome in ("held", "gave_up"):
        value = registry.get_sample_value(
            "orga_service_unavailable_total", {**labels, "outcome": outcome}
        )
        assert value == 1.0, outcome
