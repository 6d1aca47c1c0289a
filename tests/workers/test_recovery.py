"""Recovery strategies: Retry, Fallback, CachedResult, LlmRecovery, Escalate, DeadLetter."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from shared.events import RecoveryTriggered
from shared.loop_types import (
    CachedResult,
    DeadLetter,
    Escalate,
    Fallback,
    LlmRecovery,
    RecoveryStrategy,
    Retry,
)
from tests.workers.test_executor import (
    FakeClock,
    FakeTool,
    RecordingSleep,
    call,
    config,
    echo,
    execute,
    executor,
    flaky,
    raising,
)
from workers.circuit_breaker import CircuitBreakerConfig, CircuitBreakerRegistry
from workers.executor import ToolExecutor
from workers.recovery import (
    DeadLetterRecord,
    DeadLetterSink,
    InMemoryDeadLetterSink,
    RecoveryLedger,
    resolve_strategy,
)
from workers.result_cache import InMemoryResultCache
from workers.tools.base import ToolContext, ToolOutput

DOWN = "Tool 'primary' failed: ConnectionError: down"


def _down() -> FakeTool:
    return FakeTool("primary", raising(ConnectionError("down")))


def _strategies(report_events: tuple[RecoveryTriggered, ...]) -> list[str]:
    return [event.strategy.strategy for event in report_events]


# -- which strategy ------------------------------------------------------------------------


def test_resolve_strategy_precedence() -> None:
    """A per-tool override beats the per-call strategy, which beats the config default."""
    loop_config = config(default_recovery=DeadLetter())
    per_call, per_tool = Escalate(), Fallback(alternatives=["b"])
    assert resolve_strategy("a", loop_config) == DeadLetter()
    assert resolve_strategy("a", loop_config, per_call) == per_call
    assert resolve_strategy("a", loop_config, per_call, {"a": per_tool}) == per_tool
    assert resolve_strategy("c", loop_config, None, {"a": per_tool}) == DeadLetter()


def test_executor_applies_overrides_per_tool() -> None:
    """In one batch, the tool named in tool_recovery uses its strategy; the other the call's."""
    runner = executor(_down(), FakeTool("other", raising(OSError("nope"))), FakeTool("b", echo))
    report = execute(
        runner,
        [call("primary", "c1"), call("other", "c2")],
        config(default_recovery=Retry()),
        recovery=DeadLetter(),
        tool_recovery={"primary": Fallback(alternatives=["b"])},
    )
    assert report.observations[0].metadata["answered_by"] == "b"
    assert report.observations[1].metadata["recovery"] == "dead_letter"
    assert sorted(_strategies(report.events)) == ["dead_letter", "fallback"]


# -- Retry ---------------------------------------------------------------------------------


def test_retry_succeeds_after_backoff() -> None:
    """Two failures then a success: two retries after 0.5 s and 1 s, the breaker reset."""
    sleep = RecordingSleep()
    runner = executor(FakeTool("primary", flaky(2)), sleep=sleep)
    report = execute(runner, [call("primary", "c1", '{"q": 1}')], config(default_recovery=Retry()))
    observation = report.observations[0]
    assert not observation.is_error
    assert observation.content == '{"q": 1}'
    assert observation.call_id == "c1"
    assert observation.metadata["recovery"] == "retry"
    assert observation.metadata["attempts"] == "3"
    assert sleep.delays == [0.5, 1.0]
    assert _strategies(report.events) == ["retry", "retry"]
    assert [event.error for event in report.events] == [
        "Tool 'primary' failed: ConnectionError: endpoint down"
    ] * 2
    # a success after failures resets the breaker: a clean closed breaker is stored as none
    assert asyncio.run(runner.breakers.get_state("primary")) is None


def test_retry_exhausted_reports_last_error() -> None:
    """With every attempt failing, delays double each time and the last error is returned."""
    sleep = RecordingSleep()
    breakers = CircuitBreakerRegistry(config=CircuitBreakerConfig(failure_threshold=10))
    tool = _down()
    runner = ToolExecutor({"primary": tool}, breakers, sleep=sleep)
    strategy = Retry(max_attempts=3, base_delay=timedelta(milliseconds=100))
    report = execute(runner, [call("primary", "c1")], config(default_recovery=strategy))
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content == DOWN
    assert observation.metadata["attempts"] == "4"
    assert sleep.delays == pytest.approx([0.1, 0.2, 0.4])
    assert len(tool.calls) == 4
    assert len(report.events) == 3


def test_retry_stops_at_an_open_circuit() -> None:
    """The 3rd failure trips the breaker: the next retry is rejected and retrying stops."""
    sleep = RecordingSleep()
    tool = _down()
    runner = executor(tool, sleep=sleep)
    strategy = Retry(max_attempts=5, base_delay=0.01)
    report = execute(runner, [call("primary", "c1")], config(default_recovery=strategy))
    observation = report.observations[0]
    assert observation.metadata["error_type"] == "circuit_open"
    assert observation.metadata["attempts"] == "4"
    assert len(tool.calls) == 3
    assert len(sleep.delays) == 3


def test_retry_never_retries_a_rejected_call() -> None:
    """A call rejected by an open circuit is not retried and triggers no event."""
    sleep = RecordingSleep()
    runner = executor(_down(), sleep=sleep)
    for i in range(3):
        execute(runner, [call("primary", f"c{i}")])
    report = execute(runner, [call("primary", "c9")], config(default_recovery=Retry()))
    assert report.observations[0].metadata == {
        "tool_name": "primary",
        "error_type": "circuit_open",
    }
    assert report.events == ()
    assert sleep.delays == []


def test_retry_after_timeout() -> None:
    """A timed-out call is retried; the retry's answer is the observation."""
    slow_then_fast = {"calls": 0}

    async def behaviour(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        slow_then_fast["calls"] += 1
        if slow_then_fast["calls"] == 1:
            await asyncio.sleep(5)
        return ToolOutput(content="fast enough")

    report = execute(
        executor(FakeTool("primary", behaviour)),
        [call("primary", "c1")],
        config(tool_timeout=0.02, default_recovery=Retry(max_attempts=1)),
    )
    assert report.observations[0].content == "fast enough"
    assert report.events[0].error == "Tool 'primary' timed out after 20ms"


# -- Fallback ------------------------------------------------------------------------------


def test_fallback_tries_alternatives_in_order() -> None:
    """The first alternative that answers is the observation, and it says which tool answered."""
    second = FakeTool("second", raising(OSError("also down")))
    third = FakeTool("third", echo)
    runner = executor(_down(), second, third)
    strategy = Fallback(alternatives=["missing", "second", "third"])
    report = execute(runner, [call("primary", "c1", '{"q": 2}')], config(default_recovery=strategy))
    observation = report.observations[0]
    assert not observation.is_error
    assert observation.source == "primary"
    assert observation.call_id == "c1"
    assert observation.content == (
        f"[Answered by fallback tool 'third'; 'primary' failed: {DOWN}]\n" + '{"q": 2}'
    )
    assert observation.metadata == {
        "kind": "read",
        "tool_name": "primary",
        "answered_by": "third",
        "recovery": "fallback",
    }
    assert second.calls == [{"q": 2}]
    assert third.calls == [{"q": 2}]
    assert [event.error for event in report.events] == [
        DOWN,
        "Unknown tool 'missing'; known tools: primary, second, third",
        "Tool 'second' failed: OSError: also down",
    ]


def test_fallback_all_failing_lists_every_error() -> None:
    """When every alternative fails the error names each tool and its error."""
    runner = executor(_down(), FakeTool("second", raising(OSError("also down"))))
    report = execute(
        runner, [call("primary", "c1")], config(default_recovery=Fallback(alternatives=["second"]))
    )
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content == (
        f"Tool 'primary' and its fallbacks failed: 'primary': {DOWN}; "
        "'second': Tool 'second' failed: OSError: also down"
    )
    assert observation.metadata["recovery"] == "fallback"
    assert observation.metadata["error_type"] == "exception"


def test_fallback_when_the_circuit_is_open() -> None:
    """An open circuit on the primary goes straight to the fallback without running it."""
    primary = _down()
    runner = executor(primary, FakeTool("mirror", echo))
    for i in range(3):
        execute(runner, [call("primary", f"c{i}")])
    report = execute(
        runner, [call("primary", "c9")], config(default_recovery=Fallback(alternatives=["mirror"]))
    )
    assert report.observations[0].metadata["answered_by"] == "mirror"
    assert len(primary.calls) == 3


# -- CachedResult --------------------------------------------------------------------------


def _cached_runner(cache: InMemoryResultCache | None) -> tuple[ToolExecutor, dict[str, bool]]:
    """An executor whose tool answers while ``state["up"]`` and raises otherwise."""
    state = {"up": True}

    async def sometimes(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if not state["up"]:
            raise ConnectionError("down")
        return ToolOutput(content="fresh data", metadata={"content_hash": "h1"})

    return executor(FakeTool("primary", sometimes), cache=cache), state


def test_cached_result_answers_with_a_fresh_enough_result() -> None:
    """After a success, a failure of the same call is answered from the cache with its age."""
    clock = FakeClock()
    runner, state = _cached_runner(InMemoryResultCache(clock=clock))
    strategy = CachedResult(max_staleness=timedelta(minutes=5))
    execute(runner, [call("primary", "c1", '{"a": 1, "b": 2}')], config(default_recovery=strategy))
    state["up"] = False
    clock.advance(42)
    report = execute(
        runner, [call("primary", "c2", '{"b": 2, "a": 1}')], config(default_recovery=strategy)
    )
    observation = report.observations[0]
    assert not observation.is_error
    assert observation.call_id == "c2"
    assert observation.content == (
        f"[Cached result from 42.0s ago; the live call failed: {DOWN}]\nfresh data"
    )
    assert observation.metadata == {
        "content_hash": "h1",
        "tool_name": "primary",
        "recovery": "cached_result",
        "cache_age_s": "42.000",
    }
    assert _strategies(report.events) == ["cached_result"]


def test_cached_result_too_stale() -> None:
    """A cached result older than max_staleness is not used: the error says so."""
    clock = FakeClock()
    runner, state = _cached_runner(InMemoryResultCache(clock=clock))
    strategy = CachedResult(max_staleness=timedelta(minutes=5))
    execute(runner, [call("primary", "c1")], config(default_recovery=strategy))
    state["up"] = False
    clock.advance(301)
    report = execute(runner, [call("primary", "c2")], config(default_recovery=strategy))
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content == (
        f"{DOWN} (no cached result of 'primary' for these arguments: none younger than 5m)"
    )
    assert observation.metadata["recovery"] == "cached_result"


def test_cached_result_without_a_cache() -> None:
    """Without a result cache the strategy reports that none is configured."""
    runner, state = _cached_runner(None)
    state["up"] = False
    report = execute(
        runner, [call("primary", "c1")], config(default_recovery=CachedResult(max_age="30s"))
    )
    assert report.observations[0].content == (
        f"{DOWN} (no cached result of 'primary' for these arguments: no result cache is configured)"
    )


# -- LlmRecovery ---------------------------------------------------------------------------


def test_llm_recovery_returns_the_error_then_escalates() -> None:
    """The error goes back to the model twice (max 2); the third failure escalates."""
    runner = executor(_down(), breaker_config=CircuitBreakerConfig(failure_threshold=10))
    strategy = LlmRecovery(max_recovery_attempts=2)
    ledger = RecoveryLedger()
    reports = [
        execute(
            runner, [call("primary", f"c{i}")], config(default_recovery=strategy), ledger=ledger
        )
        for i in range(3)
    ]
    for attempt, report in enumerate(reports[:2], start=1):
        observation = report.observations[0]
        assert observation.content == DOWN
        assert observation.metadata["recovery"] == "llm"
        assert observation.metadata["recovery_attempt"] == str(attempt)
        assert observation.metadata["max_recovery_attempts"] == "2"
        assert report.escalation is None
        assert _strategies(report.events) == ["llm_recovery"]
    last = reports[2]
    assert last.escalation is not None
    assert last.escalation.queue == "human_review"
    assert last.observations[0].metadata["recovery"] == "escalate"
    assert _strategies(last.events) == ["escalate"]
    assert ledger.snapshot() == {"primary": 2}


def test_llm_recovery_count_resets_on_success() -> None:
    """A success of the tool resets its LlmRecovery count."""
    outcomes = iter([False, True, False, False])

    async def alternating(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if not next(outcomes):
            raise ConnectionError("down")
        return ToolOutput(content="ok")

    runner = executor(FakeTool("primary", alternating))
    strategy = LlmRecovery(max_recovery_attempts=1)
    reports = [
        execute(runner, [call("primary", f"c{i}")], config(default_recovery=strategy))
        for i in range(4)
    ]
    assert [r.observations[0].metadata.get("recovery") for r in reports] == [
        "llm",
        None,
        "llm",
        "escalate",
    ]
    assert runner.ledger.snapshot() == {"primary": 1}


def test_ledger_round_trips_through_a_snapshot() -> None:
    """A ledger rebuilt from its snapshot continues counting where it stopped."""
    ledger = RecoveryLedger({"t": 1})
    assert ledger.count_llm_attempt("t") == 2
    rebuilt = RecoveryLedger(ledger.snapshot())
    assert rebuilt.llm_attempts("t") == 2
    rebuilt.reset("t")
    assert rebuilt.snapshot() == {}


# -- Escalate and DeadLetter ---------------------------------------------------------------


def test_escalate_returns_a_signal_with_a_context_snapshot() -> None:
    """Escalate gives the error observation plus a signal the caller turns into a review item."""
    tool_context = ToolContext(workspace="/ws", agent_id="agent-1", task_id="task-9")
    report = execute(
        executor(_down()),
        [call("primary", "c1", '{"path": "a.txt"}')],
        config(default_recovery=Escalate(queue="ops")),
        tool_context,
        iteration=4,
    )
    observation = report.observations[0]
    assert observation.content == f"{DOWN}\n[Escalated to human review queue 'ops']"
    assert observation.metadata["escalation_queue"] == "ops"
    signal = report.escalation
    assert signal is not None
    assert (signal.queue, signal.tool_name, signal.call_id, signal.error) == (
        "ops",
        "primary",
        "c1",
        DOWN,
    )
    assert signal.context_snapshot == {
        "call_id": "c1",
        "tool_name": "primary",
        "arguments": '{"path": "a.txt"}',
        "error": DOWN,
        "agent_id": "agent-1",
        "task_id": "task-9",
        "iteration": "4",
        "workspace": "/ws",
    }
    assert report.events[0].iteration == 4


def test_escalate_without_snapshot_and_several_escalations() -> None:
    """context_snapshot=False leaves it out; each escalating call of a batch gives a signal."""
    runner = executor(_down(), FakeTool("other", raising(OSError("x"))), FakeTool("ok", echo))
    report = execute(
        runner,
        [call("primary", "c1"), call("ok", "c2"), call("other", "c3")],
        config(default_recovery=Escalate(context_snapshot=False)),
    )
    assert [signal.call_id for signal in report.escalations] == ["c1", "c3"]
    assert report.escalation == report.escalations[0]
    assert report.escalations[0].context_snapshot is None


def test_dead_letter_hands_the_call_to_the_sink() -> None:
    """DeadLetter puts the failed call in the sink and says so in the observation."""
    sink = InMemoryDeadLetterSink()
    assert isinstance(sink, DeadLetterSink)
    runner = executor(_down(), dead_letter=sink)
    tool_context = ToolContext(workspace="/ws", agent_id="agent-1", task_id="task-9")
    report = execute(
        runner,
        [call("primary", "c1", '{"n": 1}')],
        config(default_recovery=DeadLetter()),
        tool_context,
        iteration=2,
    )
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content == f"Tool 'primary' failed and the call was dead-lettered: {DOWN}"
    assert observation.metadata["recovery"] == "dead_letter"
    (record,) = sink.records
    assert isinstance(record, DeadLetterRecord)
    assert (record.tool_name, record.call_id, record.arguments, record.error) == (
        "primary",
        "c1",
        '{"n": 1}',
        DOWN,
    )
    assert (record.agent_id, record.task_id, record.iteration) == ("agent-1", "task-9", 2)
    assert _strategies(report.events) == ["dead_letter"]


def test_default_dead_letter_sink_is_in_memory() -> None:
    """Without a sink the executor keeps dead letters in memory, inspectable."""
    runner = executor(_down())
    execute(runner, [call("primary", "c1")], config(default_recovery="DeadLetter"))
    assert isinstance(runner.dead_letter, InMemoryDeadLetterSink)
    assert [record.call_id for record in runner.dead_letter.records] == ["c1"]


# -- events --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "count"),
    [
        (Retry(max_attempts=2), 2),
        (Fallback(alternatives=["a", "b"]), 2),
        (CachedResult(), 1),
        (LlmRecovery(), 1),
        (Escalate(), 1),
        (DeadLetter(), 1),
    ],
)
def test_every_strategy_emits_recovery_triggered(strategy: RecoveryStrategy, count: int) -> None:
    """Each strategy emits RecoveryTriggered with the iteration, tool, itself and the error."""
    received: list[RecoveryTriggered] = []
    runner = executor(_down(), FakeTool("a", raising(OSError("a"))), FakeTool("b", echo))
    report = execute(
        runner,
        [call("primary", "c1")],
        config(default_recovery=strategy),
        on_event=received.append,
        iteration=3,
    )
    assert list(report.events) == received
    assert len(received) == count
    first = received[0]
    assert (first.iteration, first.tool_name, first.error) == (3, "primary", DOWN)
    assert first.strategy == strategy
    assert RecoveryTriggered.model_validate_json(first.model_dump_json()) == first


def test_unknown_tool_and_bad_arguments_are_never_recovered() -> None:
    """Model mistakes go straight back, even under Escalate."""
    report = execute(
        executor(FakeTool("t", echo)),
        [call("nope", "c1"), call("t", "c2", "not json")],
        config(default_recovery=Escalate()),
    )
    assert report.events == ()
    assert report.escalations == ()


def test_backoff_does_not_hold_a_concurrency_slot() -> None:
    """Backoff sleeps happen outside the semaphore: another call runs before the retry."""
    order: list[str] = []
    first_fails = flaky(1)

    async def primary(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        order.append("primary")
        return await first_fails(arguments, ctx)

    async def quick(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        order.append("quick")
        return ToolOutput(content="q")

    async def backoff(delay: float) -> None:
        order.append("backoff")
        await asyncio.sleep(0.01)

    runner = executor(FakeTool("primary", primary), FakeTool("quick", quick), sleep=backoff)
    report = execute(
        runner,
        [call("primary", "c1"), call("quick", "c2")],
        config(max_concurrent_tools=1, default_recovery=Retry(max_attempts=1)),
    )
    assert order == ["primary", "backoff", "quick", "primary"]
    assert [o.is_error for o in report.observations] == [False, False]
