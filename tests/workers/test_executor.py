"""The Act phase executor: concurrency, timeouts, order, validation and circuit breakers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shared.actions import ToolCallAction
from shared.errors import ConfigError
from shared.events import RecoveryTriggered
from shared.inference import ToolDefinition
from shared.loop_types import LoopConfig, Retry
from tests.conftest import FakeRedisFactory
from tests.redis_server import RedisClientFactory
from workers.circuit_breaker import (
    BreakerState,
    BreakerVerdict,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    CircuitState,
    InMemoryBreakerStore,
    RedisBreakerStore,
)
from workers.executor import ExecutionReport, ToolExecutor
from workers.result_cache import (
    InMemoryResultCache,
    RedisResultCache,
    ResultCache,
    call_scope,
)
from workers.tools.base import Tool, ToolContext, ToolOutput

NO_RECOVERY = Retry(max_attempts=0)
"""A strategy that takes no action, to look at raw failures."""

Behaviour = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


# -- fakes shared with test_recovery -------------------------------------------------------


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSleep:
    """An injected sleep that returns at once and remembers the delays."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@dataclass
class FakeTool:
    """A tool whose behaviour is a coroutine function; it records every call."""

    name: str
    behaviour: Behaviour
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(name=self.name, description=f"the {self.name} tool")

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        self.calls.append(arguments)
        return await self.behaviour(arguments, context)


async def echo(arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
    """Answer with the arguments as JSON, plus detector metadata."""
    return ToolOutput(content=json.dumps(arguments, sort_keys=True), metadata={"kind": "read"})


def raising(error: Exception) -> Behaviour:
    """Always raise ``error``."""

    async def behaviour(arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        raise error

    return behaviour


def flaky(failures: int, error: Exception | None = None) -> Behaviour:
    """Raise the first ``failures`` times, then echo."""
    state = {"left": failures}

    async def behaviour(arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        if state["left"] > 0:
            state["left"] -= 1
            raise error or ConnectionError("endpoint down")
        return await echo(arguments, context)

    return behaviour


def sleeping(delay_s: float, done: list[str] | None = None, label: str = "") -> Behaviour:
    """Sleep, note completion in ``done``, then echo."""

    async def behaviour(arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        await asyncio.sleep(delay_s)
        if done is not None:
            done.append(label)
        return await echo(arguments, context)

    return behaviour


def call(name: str, call_id: str, arguments: str = "{}") -> ToolCallAction:
    """A tool call action."""
    return ToolCallAction(call_id=call_id, name=name, arguments=arguments)


def context(timeout_s: float = 30.0) -> ToolContext:
    """A tool context in a fake workspace."""
    return ToolContext(workspace=Path("/workspace"), timeout_s=timeout_s, agent_id="agent-1")


def config(**overrides: Any) -> LoopConfig:
    """A loop config with no recovery unless told otherwise."""
    return LoopConfig(**{"default_recovery": NO_RECOVERY, **overrides})


def executor(
    *tools: Tool,
    clock: FakeClock | None = None,
    breaker_config: CircuitBreakerConfig | None = None,
    **options: Any,
) -> ToolExecutor:
    """An executor over ``tools`` with in-memory breakers and a recording sleep."""
    store = InMemoryBreakerStore(clock or FakeClock())
    breakers = CircuitBreakerRegistry(store, breaker_config)
    options.setdefault("sleep", RecordingSleep())
    return ToolExecutor({tool.definition.name: tool for tool in tools}, breakers, **options)


def execute(
    runner: ToolExecutor,
    actions: list[ToolCallAction],
    loop_config: LoopConfig | None = None,
    tool_context: ToolContext | None = None,
    **options: Any,
) -> ExecutionReport:
    """Run one batch in a fresh event loop."""
    return asyncio.run(
        runner.execute(actions, loop_config or config(), tool_context or context(), **options)
    )


async def breaker(runner: ToolExecutor, tool: str) -> BreakerState:
    """The breaker state of ``tool``, which must exist."""
    state = await runner.breakers.get_state(tool)
    assert state is not None
    return state


# -- basics --------------------------------------------------------------------------------


def test_no_actions_no_observations() -> None:
    """An empty batch gives an empty report."""
    report = execute(executor(FakeTool("search", echo)), [])
    assert report == ExecutionReport()
    assert report.escalation is None


def test_single_call_observation() -> None:
    """A success carries the source, call id, content, the tool's metadata and tool_name."""
    report = execute(executor(FakeTool("search", echo)), [call("search", "c1", '{"q": "test"}')])
    (observation,) = report.observations
    assert observation.source == "search"
    assert observation.call_id == "c1"
    assert observation.content == '{"q": "test"}'
    assert not observation.is_error
    assert observation.metadata == {"kind": "read", "tool_name": "search"}
    assert report.events == ()


def test_results_in_input_order_despite_completion_order() -> None:
    """Observations follow the input order and match their call ids, whatever finishes first."""
    done: list[str] = []
    tools = [
        FakeTool(f"t{i}", sleeping(delay, done, f"t{i}"))
        for i, delay in enumerate([0.03, 0.015, 0.0])
    ]
    actions = [call("t0", "a"), call("t1", "b"), call("t2", "c")]
    report = execute(executor(*tools), actions)
    assert done == ["t2", "t1", "t0"]
    assert [(o.source, o.call_id) for o in report.observations] == [
        ("t0", "a"),
        ("t1", "b"),
        ("t2", "c"),
    ]


def test_concurrency_is_bounded_by_max_concurrent_tools() -> None:
    """At most max_concurrent_tools calls run at once, and they do run concurrently."""
    in_flight = {"now": 0, "max": 0}

    async def tracked(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.005)
        in_flight["now"] -= 1
        return ToolOutput(content="ok")

    tool = FakeTool("work", tracked)
    actions = [call("work", f"c{i}") for i in range(10)]
    report = execute(executor(tool), actions, config(max_concurrent_tools=3))
    assert in_flight["max"] == 3
    assert len(tool.calls) == 10
    assert all(not o.is_error for o in report.observations)


def test_parallel_dispatch_is_fast() -> None:
    """Five 20 ms tools with the default limit of 5 finish in about one tool's time."""

    async def scenario() -> float:
        runner = executor(*(FakeTool(f"t{i}", sleeping(0.02)) for i in range(5)))
        loop = asyncio.get_running_loop()
        start = loop.time()
        await runner.execute([call(f"t{i}", f"c{i}") for i in range(5)], config(), context())
        return loop.time() - start

    assert asyncio.run(scenario()) < 0.08


# -- timeouts and failures -----------------------------------------------------------------


def test_tool_timeout_from_config() -> None:
    """A tool slower than config.tool_timeout gives a timeout error observation."""
    report = execute(
        executor(FakeTool("slow", sleeping(5))), [call("slow", "c1")], config(tool_timeout=0.02)
    )
    (observation,) = report.observations
    assert observation.is_error
    assert observation.content == "Tool 'slow' timed out after 20ms"
    assert observation.metadata == {"tool_name": "slow", "error_type": "timeout"}
    assert observation.call_id == "c1"


def test_tool_timeout_from_context_when_shorter() -> None:
    """The timeout is min(config.tool_timeout, context.timeout_s)."""
    report = execute(
        executor(FakeTool("slow", sleeping(5))),
        [call("slow", "c1")],
        config(tool_timeout=30),
        context(timeout_s=0.02),
    )
    assert report.observations[0].content == "Tool 'slow' timed out after 20ms"


def test_cancelling_execute_cancels_running_tools() -> None:
    """Cancelling the batch (a worker shutting down) cancels the tools still running."""
    cancelled: list[str] = []

    async def long_running(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise
        return ToolOutput(content="never")

    async def scenario() -> None:
        runner = executor(FakeTool("slow", long_running))
        task = asyncio.ensure_future(runner.execute([call("slow", "c1")], config(), context()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert cancelled == ["slow"]


def test_tool_raising_timeout_itself_is_an_exception() -> None:
    """A TimeoutError raised by the tool is reported as its exception, not as our timeout."""
    report = execute(
        executor(FakeTool("t", raising(TimeoutError("upstream slow")))), [call("t", "c1")]
    )
    observation = report.observations[0]
    assert observation.content == "Tool 't' failed: TimeoutError: upstream slow"
    assert observation.metadata["error_type"] == "exception"


def test_tool_exception_becomes_error_observation() -> None:
    """A tool raising gives an error observation naming the exception."""
    report = execute(
        executor(FakeTool("boom", raising(RuntimeError("kaput")))), [call("boom", "c1")]
    )
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content == "Tool 'boom' failed: RuntimeError: kaput"
    assert observation.metadata == {"tool_name": "boom", "error_type": "exception"}


def test_unknown_tool_lists_known_tools() -> None:
    """An unknown tool is an error listing the known tools; nothing runs, no recovery."""
    runner = executor(FakeTool("search", echo), FakeTool("fetch", echo))
    report = execute(runner, [call("serach", "c1")], config(default_recovery=Retry()))
    observation = report.observations[0]
    assert observation.content == "Unknown tool 'serach'; known tools: fetch, search"
    assert observation.metadata == {"tool_name": "serach", "error_type": "unknown_tool"}
    assert report.events == ()
    assert asyncio.run(runner.breakers.get_state("serach")) is None


@pytest.mark.parametrize("arguments", ['{"q": ', "[1, 2]", '"text"'])
def test_arguments_must_be_a_json_object(arguments: str) -> None:
    """Bad JSON or a non-object is an error observation; the tool does not run."""
    tool = FakeTool("search", echo)
    report = execute(executor(tool), [call("search", "c1", arguments)])
    observation = report.observations[0]
    assert observation.is_error
    assert observation.content.startswith("Invalid arguments for tool 'search': ")
    assert observation.content.endswith("send the arguments as a JSON object")
    assert observation.metadata["error_type"] == "invalid_arguments"
    assert tool.calls == []


def test_empty_arguments_are_an_empty_object() -> None:
    """Blank argument text means no arguments."""
    tool = FakeTool("search", echo)
    execute(executor(tool), [call("search", "c1", "  ")])
    assert tool.calls == [{}]


def test_error_output_is_an_answer_not_a_failure() -> None:
    """An is_error output reaches the model as is and counts as a success for the breaker."""

    async def missing(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content="no such file", is_error=True, metadata={"kind": "read"})

    runner = executor(FakeTool("file_read", missing))
    for i in range(4):
        report = execute(runner, [call("file_read", f"c{i}")], config(default_recovery=Retry()))
        assert report.observations[0].content == "no such file"
        assert report.observations[0].is_error
        assert report.events == ()
    # closed with no failure counted: kept as no breaker at all
    assert asyncio.run(runner.breakers.get_state("file_read")) is None


def test_error_output_as_failure_when_configured() -> None:
    """With treat_error_outputs_as_failures, an error output counts and triggers recovery."""

    async def failing(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content="HTTP 503", is_error=True)

    sleep = RecordingSleep()
    runner = executor(
        FakeTool("web_fetch", failing), sleep=sleep, treat_error_outputs_as_failures=True
    )
    report = execute(runner, [call("web_fetch", "c1")], config(default_recovery=Retry()))
    observation = report.observations[0]
    assert observation.metadata["error_type"] == "tool_error"
    assert observation.metadata["attempts"] == "3"
    assert sleep.delays == [0.5, 1.0]
    assert asyncio.run(breaker(runner, "web_fetch")).state is CircuitState.OPEN


# -- circuit breakers ----------------------------------------------------------------------


def test_breaker_trips_after_three_failures_and_rejects_the_fourth_call() -> None:
    """Three failing calls open the breaker; the 4th is rejected without running the tool."""
    tool = FakeTool("flaky", raising(ConnectionError("down")))
    runner = executor(tool)
    for i in range(3):
        assert (
            execute(runner, [call("flaky", f"c{i}")]).observations[0].metadata["error_type"]
            == "exception"
        )
    observation = execute(runner, [call("flaky", "c3")]).observations[0]
    assert len(tool.calls) == 3
    assert observation.is_error
    assert observation.metadata == {"tool_name": "flaky", "error_type": "circuit_open"}
    assert observation.content == (
        "Tool circuit is open: Circuit open for tool 'flaky': 3 consecutive failures, "
        "recovery in 60.0s. The tool endpoint has been failing and is temporarily disabled."
    )
    assert observation.call_id == "c3"


def test_breaker_is_checked_per_call_within_a_batch() -> None:
    """With one call at a time, the 4th call of a batch already sees the open breaker."""
    tool = FakeTool("flaky", raising(ConnectionError("down")))
    actions = [call("flaky", f"c{i}") for i in range(4)]
    report = execute(executor(tool), actions, config(max_concurrent_tools=1))
    kinds = [o.metadata["error_type"] for o in report.observations]
    assert kinds == ["exception", "exception", "exception", "circuit_open"]
    assert len(tool.calls) == 3


def test_rejections_do_not_count_as_failures() -> None:
    """Open-circuit rejections leave the failure count alone (Symbiont counted them)."""
    runner = executor(FakeTool("flaky", raising(ConnectionError("down"))))
    for i in range(8):
        execute(runner, [call("flaky", f"c{i}")])
    state = asyncio.run(breaker(runner, "flaky"))
    assert (state.state, state.failure_count) == (CircuitState.OPEN, 3)


def test_half_open_probe_after_recovery_closes_on_success() -> None:
    """After 60 s (injected clock) one probe runs; its success closes the breaker."""
    clock = FakeClock()
    tool = FakeTool("flaky", flaky(3))
    runner = executor(tool, clock=clock)
    for i in range(4):
        execute(runner, [call("flaky", f"c{i}")])
    assert len(tool.calls) == 3
    clock.advance(60)
    observation = execute(runner, [call("flaky", "probe", '{"x": 1}')]).observations[0]
    assert not observation.is_error
    assert len(tool.calls) == 4
    assert asyncio.run(runner.breakers.get_state("flaky")) is None  # closed, no failure


def test_half_open_admits_one_probe_per_batch() -> None:
    """While half-open, only one call of a batch probes; the others are rejected."""
    clock = FakeClock()
    failures = flaky(3)

    async def slow_probe(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        output = await failures(arguments, ctx)
        await asyncio.sleep(0.01)
        return output

    runner = executor(FakeTool("flaky", slow_probe), clock=clock)
    for i in range(3):
        execute(runner, [call("flaky", f"c{i}")])
    clock.advance(61)
    report = execute(runner, [call("flaky", "p1"), call("flaky", "p2")])
    kinds = sorted(o.metadata.get("error_type", "ok") for o in report.observations)
    assert kinds == ["circuit_open", "ok"]


def test_failed_probe_reopens_the_breaker() -> None:
    """A failing probe opens the breaker again for another full recovery timeout."""
    clock = FakeClock()
    tool = FakeTool("flaky", raising(ConnectionError("down")))
    runner = executor(tool, clock=clock)
    for i in range(3):
        execute(runner, [call("flaky", f"c{i}")])
    clock.advance(60)
    assert (
        execute(runner, [call("flaky", "probe")]).observations[0].metadata["error_type"]
        == "exception"
    )
    clock.advance(30)
    rejected = execute(runner, [call("flaky", "later")]).observations[0]
    assert "recovery in 30.0s" in rejected.content
    assert len(tool.calls) == 4


def test_breakers_are_per_tool() -> None:
    """One tool's open breaker does not affect another tool."""
    runner = executor(FakeTool("bad", raising(OSError("x"))), FakeTool("good", echo))
    for i in range(3):
        execute(runner, [call("bad", f"c{i}")])
    report = execute(runner, [call("bad", "b"), call("good", "g")])
    assert report.observations[0].metadata["error_type"] == "circuit_open"
    assert not report.observations[1].is_error


def _in_task(task_id: str, workspace: str = "/workspace", timeout_s: float = 30.0) -> ToolContext:
    return ToolContext(workspace=Path(workspace), timeout_s=timeout_s, task_id=task_id)


async def _hangs_in_task_a(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    """Task A's command hangs past the timeout; any other task's answers at once."""
    if ctx.task_id == "A":
        await asyncio.sleep(5)
    return ToolOutput(content="exit code: 0\n", metadata={"kind": "command", "exit_code": "0"})


async def _breakers_per_task(registry: CircuitBreakerRegistry) -> None:
    runner = ToolExecutor({"run_command": FakeTool("run_command", _hangs_in_task_a)}, registry)
    for i in range(3):
        report = await runner.execute(
            [call("run_command", f"a{i}")], config(), _in_task("A", timeout_s=0.02)
        )
        assert report.observations[0].metadata["error_type"] == "timeout"
    rejected = await runner.execute([call("run_command", "a3")], config(), _in_task("A"))
    assert rejected.observations[0].metadata["error_type"] == "circuit_open"
    assert "in task 'A'" in rejected.observations[0].content
    check = await runner.execute([call("run_command", "verify-b")], config(), _in_task("B"))
    assert not check.observations[0].is_error, check.observations[0].content


def test_a_tasks_timeouts_do_not_open_another_tasks_breaker() -> None:
    """Task A's command timing out three times leaves task B's done_when check running (it
    was refused with 'Circuit open' when breakers were one per tool)."""
    asyncio.run(_breakers_per_task(CircuitBreakerRegistry(InMemoryBreakerStore(FakeClock()))))


@pytest.mark.redis
def test_a_tasks_timeouts_do_not_open_another_tasks_breaker_on_redis(
    redis_client: RedisClientFactory,
) -> None:
    """The same isolation with the breakers every worker shares in Redis."""

    async def scenario() -> None:
        async with redis_client() as client:
            await _breakers_per_task(CircuitBreakerRegistry(RedisBreakerStore(client)))

    asyncio.run(scenario())


@dataclass
class SharedEndpointTool(FakeTool):
    """A third-party tool that declares its breaker deployment-wide."""

    breaker_scope: str = "deployment"


def test_external_tools_keep_one_breaker_for_every_task() -> None:
    """web_fetch, and a tool declaring breaker_scope='deployment', fail for every task."""
    down = raising(ConnectionError("endpoint down"))
    runner = executor(FakeTool("web_fetch", down), SharedEndpointTool("search_api", down))
    for name in ("web_fetch", "search_api"):
        for i in range(3):
            execute(runner, [call(name, f"a{i}")], tool_context=_in_task("A"))
        refused = execute(runner, [call(name, "b")], tool_context=_in_task("B"))
        assert refused.observations[0].metadata["error_type"] == "circuit_open", name
        assert "in task" not in refused.observations[0].content


def test_operator_can_make_a_local_tool_deployment_wide() -> None:
    """CircuitBreakerConfig.scopes overrides the default per-task scope of a tool."""
    shared = CircuitBreakerConfig(scopes={"run_command": "deployment"})
    runner = executor(FakeTool("run_command", raising(OSError("x"))), breaker_config=shared)
    for i in range(3):
        execute(runner, [call("run_command", f"a{i}")], tool_context=_in_task("A"))
    refused = execute(runner, [call("run_command", "b")], tool_context=_in_task("B"))
    assert refused.observations[0].metadata["error_type"] == "circuit_open"


def test_executor_refuses_a_tool_with_an_unknown_breaker_scope() -> None:
    """A tool declaring breaker_scope='global' is a configuration error at construction."""
    with pytest.raises(ConfigError, match="breaker_scope='global'"):
        executor(SharedEndpointTool("odd", echo, breaker_scope="global"))


async def _cache_per_task_and_workspace(cache: ResultCache) -> None:
    answers = {"/ws/a": "secret of task A"}

    async def read(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if str(ctx.workspace) in answers:
            return ToolOutput(content=answers[str(ctx.workspace)], metadata={"kind": "read"})
        raise ConnectionError("storage down")

    runner = ToolExecutor(
        {"file_read": FakeTool("file_read", read)}, CircuitBreakerRegistry(), cache
    )
    cached = config(default_recovery={"CachedResult": {"max_staleness": "1h"}})
    first = call("file_read", "a1", '{"path": "notes.txt"}')
    await runner.execute([first], cached, _in_task("A", "/ws/a"))
    answers.clear()
    for task_id, workspace in [("B", "/ws/b"), ("B", "/ws/a"), ("A", "/ws/b")]:
        again = call("file_read", "x", '{"path": "notes.txt"}')
        report = await runner.execute([again], cached, _in_task(task_id, workspace))
        observation = report.observations[0]
        assert observation.is_error, (task_id, workspace)
        assert "secret of task A" not in observation.content
        assert "no cached result of 'file_read'" in observation.content
    same = await runner.execute([first], cached, _in_task("A", "/ws/a"))
    assert same.observations[0].metadata["recovery"] == "cached_result"
    assert same.observations[0].content.endswith("secret of task A")


def test_cached_results_stay_in_their_task_and_workspace() -> None:
    """A task in another workspace (or another task in the same one) never gets the first
    task's cached result; the same task and workspace still does."""
    asyncio.run(_cache_per_task_and_workspace(InMemoryResultCache()))


def test_cached_results_stay_in_their_task_and_workspace_on_fakeredis(
    fake_redis: FakeRedisFactory,
) -> None:
    """The same isolation with the Redis cache every worker shares."""

    async def scenario() -> None:
        async with fake_redis() as client:
            await _cache_per_task_and_workspace(RedisResultCache(client))

    asyncio.run(scenario())


# -- tools, cache, events, infrastructure ---------------------------------------------------


class Registry:
    """A registry that is not a Mapping: ``get`` and ``__iter__`` only."""

    def __init__(self, *tools: Tool) -> None:
        self._tools = {tool.definition.name: tool for tool in tools}

    def get(self, name: str, /) -> Tool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)


def test_tool_definitions_and_registry_objects() -> None:
    """tool_definitions lists every tool; a get/__iter__ registry works like a mapping."""
    registry = Registry(FakeTool("b_tool", echo), FakeTool("a_tool", echo))
    runner = ToolExecutor(registry, CircuitBreakerRegistry())
    assert [d.name for d in runner.tool_definitions()] == ["b_tool", "a_tool"]
    report = execute(runner, [call("a_tool", "c1"), call("zzz", "c2")])
    assert not report.observations[0].is_error
    assert report.observations[1].content == "Unknown tool 'zzz'; known tools: a_tool, b_tool"


def test_successes_are_cached_for_tools_recovered_from_the_cache() -> None:
    """With CachedResult, successful results are stored in the cache; error outputs are not."""

    async def maybe(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return (
            ToolOutput(content="bad", is_error=True)
            if arguments.get("bad")
            else ToolOutput(content="good", metadata={"kind": "read"})
        )

    cache = InMemoryResultCache()
    runner = executor(FakeTool("t", maybe), cache=cache)
    cached = config(default_recovery={"CachedResult": {"max_staleness": "1m"}})
    execute(runner, [call("t", "c1", '{"n": 1}'), call("t", "c2", '{"bad": true}')], cached)

    scope = call_scope(None, Path("/workspace"))

    async def lookups() -> list[str | None]:
        hits = [await cache.get("t", args, 60, scope=scope) for args in ({"n": 1}, {"bad": True})]
        return [hit.content if hit else None for hit in hits]

    assert asyncio.run(lookups()) == ["good", None]
    hit = asyncio.run(cache.get("t", {"n": 1}, 60, scope=scope))
    assert hit is not None
    assert dict(hit.metadata) == {"kind": "read", "tool_name": "t"}


def test_nothing_is_cached_when_no_recovery_reads_the_cache() -> None:
    """With the default Retry strategy no result is written to the cache (nobody reads it)."""
    cache = InMemoryResultCache()
    runner = executor(FakeTool("t", echo), cache=cache)
    execute(runner, [call("t", "c1", '{"n": 1}')])
    scope = call_scope(None, Path("/workspace"))
    assert asyncio.run(cache.get("t", {"n": 1}, 60, scope=scope)) is None


@pytest.mark.parametrize("asynchronous", [False, True])
def test_on_event_receives_recovery_events(asynchronous: bool) -> None:
    """A sync or async on_event callback receives each RecoveryTriggered, as the report does."""
    received: list[RecoveryTriggered] = []

    def sync_callback(event: RecoveryTriggered) -> None:
        received.append(event)

    async def async_callback(event: RecoveryTriggered) -> None:
        received.append(event)

    runner = executor(FakeTool("flaky", flaky(1)))
    report = execute(
        runner,
        [call("flaky", "c1")],
        config(default_recovery=Retry(max_attempts=1)),
        on_event=async_callback if asynchronous else sync_callback,
        iteration=7,
    )
    assert list(report.events) == received
    (event,) = received
    assert (event.iteration, event.tool_name) == (7, "flaky")
    assert event.error == "Tool 'flaky' failed: ConnectionError: endpoint down"


class BrokenStore(InMemoryBreakerStore):
    """A breaker store whose Redis went away for one tool."""

    async def check(self, tool: str, config: CircuitBreakerConfig) -> BreakerVerdict:
        if tool == "broken":
            raise ConnectionError("redis unreachable")
        return await super().check(tool, config)


def test_infrastructure_errors_propagate_and_cancel_the_batch() -> None:
    """A failing breaker store raises out of execute and cancels the calls still running."""
    cancelled: list[str] = []

    async def long_running(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise
        return ToolOutput(content="never")

    tools = {"slow": FakeTool("slow", long_running), "broken": FakeTool("broken", echo)}
    runner = ToolExecutor(tools, CircuitBreakerRegistry(BrokenStore()))

    async def scenario() -> None:
        actions = [call("slow", "c1"), call("broken", "c2")]
        with pytest.raises(ConnectionError, match="redis unreachable"):
            await runner.execute(actions, config(), context())

    asyncio.run(scenario())
    assert cancelled == ["slow"]


@pytest.mark.redis
def test_executor_on_redis_breakers_and_cache(redis_client: RedisClientFactory) -> None:
    """Two executors (workers) on one Redis share the breaker and the cached results."""

    async def scenario() -> None:
        async with redis_client() as first, redis_client() as second:
            good = FakeTool("search", echo)
            bad = FakeTool("search", raising(ConnectionError("down")))
            worker_a = ToolExecutor(
                {"search": good},
                CircuitBreakerRegistry(RedisBreakerStore(first)),
                RedisResultCache(first),
            )
            worker_b = ToolExecutor(
                {"search": bad},
                CircuitBreakerRegistry(RedisBreakerStore(second)),
                RedisResultCache(second),
                sleep=RecordingSleep(),
            )
            cached_config = config(default_recovery={"CachedResult": {"max_staleness": "1m"}})
            await worker_a.execute([call("search", "a1", '{"q": "x"}')], cached_config, context())
            cached = await worker_b.execute(
                [call("search", "b1", '{"q": "x"}')], cached_config, context()
            )
            assert cached.observations[0].metadata["recovery"] == "cached_result"
            assert cached.observations[0].content.endswith('{"q": "x"}')
            for i in range(2):
                await worker_b.execute([call("search", f"b{i + 2}")], config(), context())
            rejected = await worker_a.execute([call("search", "a2")], config(), context())
            assert rejected.observations[0].metadata["error_type"] == "circuit_open"
            assert len(good.calls) == 1

    asyncio.run(scenario())
