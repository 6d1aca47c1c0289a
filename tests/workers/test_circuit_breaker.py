"""Circuit breakers: one suite over the in-memory store and the Redis store on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import keys
from shared.errors import ConfigError
from tests.redis_server import RedisClientFactory, RedisServer
from workers.circuit_breaker import (
    TASK_BREAKER_MARK,
    BreakerState,
    BreakerStateStore,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    CircuitOpenError,
    CircuitState,
    InMemoryBreakerStore,
    RedisBreakerStore,
    breaker_scope_of,
    format_remaining,
)
from workers.redis_batch import CoalescedPipeline

FAST = 0.05
"""A recovery timeout short enough for real sleeps on Redis (seconds)."""


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Backend:
    """How a test gets stores sharing one set of breakers, and moves time forward."""

    name: str
    open_store: Callable[[], AbstractAsyncContextManager[BreakerStateStore]]
    advance: Callable[[float], Awaitable[None]]


def _memory_backend() -> Backend:
    clock = FakeClock()
    store = InMemoryBreakerStore(clock)

    @asynccontextmanager
    async def open_store() -> AsyncIterator[BreakerStateStore]:
        yield store

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    return Backend("memory", open_store, advance)


def _redis_backend(factory: RedisClientFactory, *, coalesced: bool = False) -> Backend:
    @asynccontextmanager
    async def open_store() -> AsyncIterator[BreakerStateStore]:
        async with factory() as client:
            pipelines = CoalescedPipeline(client) if coalesced else None
            yield RedisBreakerStore(client, pipelines=pipelines)

    return Backend("redis-coalesced" if coalesced else "redis", open_store, asyncio.sleep)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-coalesced", marks=pytest.mark.redis),
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The in-memory store with a fake clock, or the Redis store on the real server, its
    checks on their own or in a worker's shared pipelines."""
    if request.param == "memory":
        return _memory_backend()
    coalesced = request.param == "redis-coalesced"
    return _redis_backend(request.getfixturevalue("redis_client"), coalesced=coalesced)


def _run(
    backend: Backend,
    body: Callable[[CircuitBreakerRegistry], Awaitable[None]],
    config: CircuitBreakerConfig | None = None,
) -> None:
    async def scenario() -> None:
        async with backend.open_store() as store:
            await body(CircuitBreakerRegistry(store, config))

    asyncio.run(scenario())


async def _state(registry: CircuitBreakerRegistry, tool: str) -> BreakerState:
    state = await registry.get_state(tool)
    assert state is not None
    return state


async def _fail(registry: CircuitBreakerRegistry, tool: str, times: int) -> None:
    for _ in range(times):
        await registry.record_failure(tool)


# -- config and formatting -----------------------------------------------------------------


def test_defaults_are_this_projects() -> None:
    """Defaults: 3 consecutive failures, 60 s recovery, one half-open probe."""
    config = CircuitBreakerConfig()
    assert config.failure_threshold == 3
    assert config.recovery_timeout == timedelta(seconds=60)
    assert config.half_open_max_calls == 1


def test_config_is_frozen_and_validated() -> None:
    """The config is immutable, takes duration text, and refuses a zero threshold."""
    config = CircuitBreakerConfig(recovery_timeout="250ms")
    assert config.recovery_timeout_s == 0.25
    with pytest.raises(ValueError, match="frozen"):
        config.failure_threshold = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreakerConfig(failure_threshold=0)


@pytest.mark.parametrize(
    ("seconds", "text"), [(59.9, "59.9s"), (1.0, "1.0s"), (0.25, "250ms"), (0.0, "0s"), (-1, "0s")]
)
def test_format_remaining(seconds: float, text: str) -> None:
    """Remaining recovery time reads as seconds with one decimal, or milliseconds below 1 s."""
    assert format_remaining(seconds) == text


def test_error_message_names_tool_failures_and_remaining_time() -> None:
    """The open-circuit error says the tool, the consecutive failures and the time left."""

    async def scenario() -> None:
        clock = FakeClock()
        registry = CircuitBreakerRegistry(InMemoryBreakerStore(clock))
        await _fail(registry, "x", 3)
        clock.advance(0.1)
        with pytest.raises(CircuitOpenError) as caught:
            await registry.check("x")
        assert str(caught.value) == (
            "Circuit open for tool 'x': 3 consecutive failures, recovery in 59.9s"
        )
        assert (caught.value.tool, caught.value.consecutive_failures) == ("x", 3)
        assert caught.value.recovery_remaining_s == pytest.approx(59.9)

    asyncio.run(scenario())


def test_stores_implement_the_protocol() -> None:
    """Both stores satisfy the BreakerStateStore protocol."""
    assert isinstance(InMemoryBreakerStore(), BreakerStateStore)
    assert issubclass(RedisBreakerStore, BreakerStateStore)


# -- the state machine, on every store (Symbiont §13.11 with this project's defaults) ------


def test_starts_closed(backend: Backend) -> None:
    """A new breaker is closed with no failures: a check lets the call through and stores
    nothing (a closed breaker with no failure is kept as no breaker at all)."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await registry.check("t")
        assert await registry.get_state("t") is None
        await registry.record_failure("t")
        state = await _state(registry, "t")
        assert (state.state, state.failure_count) == (CircuitState.CLOSED, 1)

    _run(backend, body)


def test_allows_when_closed(backend: Backend) -> None:
    """A closed breaker lets every check through."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        for _ in range(5):
            await registry.check("t")

    _run(backend, body)


def test_trips_after_threshold(backend: Backend) -> None:
    """Still closed after 2 failures, open after 3 (the default), and the check raises."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 2)
        assert (await _state(registry, "t")).state is CircuitState.CLOSED
        await registry.check("t")
        await registry.record_failure("t")
        assert (await _state(registry, "t")).state is CircuitState.OPEN
        with pytest.raises(CircuitOpenError) as caught:
            await registry.check("t")
        assert caught.value.consecutive_failures == 3
        assert 59.0 < caught.value.recovery_remaining_s <= 60.0

    _run(backend, body)


def test_recovery_moves_to_half_open_then_success_closes(backend: Backend) -> None:
    """After the recovery timeout the next check is a probe (half-open); a success closes it."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 2)
        with pytest.raises(CircuitOpenError):
            await registry.check("t")
        await backend.advance(FAST * 1.5)
        await registry.check("t")
        assert (await _state(registry, "t")).state is CircuitState.HALF_OPEN
        await registry.record_success("t")
        assert await registry.get_state("t") is None  # closed, no failure, no probe
        await registry.check("t")

    _run(backend, body, CircuitBreakerConfig(failure_threshold=2, recovery_timeout=FAST))


def test_half_open_failure_reopens(backend: Backend) -> None:
    """A failed probe opens the breaker again, restarting the timeout, without counting more."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 2)
        await backend.advance(FAST * 1.5)
        await registry.check("t")
        await registry.record_failure("t")
        state = await _state(registry, "t")
        assert (state.state, state.failure_count, state.half_open_calls) == (
            CircuitState.OPEN,
            2,
            0,
        )
        with pytest.raises(CircuitOpenError) as caught:
            await registry.check("t")
        assert caught.value.recovery_remaining_s > FAST / 2

    _run(backend, body, CircuitBreakerConfig(failure_threshold=2, recovery_timeout=FAST))


def test_success_resets_failures(backend: Backend) -> None:
    """Only consecutive failures count: one success resets the count to zero."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 2)
        assert (await _state(registry, "t")).failure_count == 2
        await registry.record_success("t")
        assert await registry.get_state("t") is None  # closed, no failure
        await _fail(registry, "t", 2)
        assert (await _state(registry, "t")).state is CircuitState.CLOSED

    _run(backend, body)


def test_half_open_limits_calls(backend: Backend) -> None:
    """With half_open_max_calls 2, two probes pass and the third is refused with 0 s left."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await registry.record_failure("t")
        await backend.advance(FAST * 1.5)
        await registry.check("t")
        await registry.check("t")
        with pytest.raises(CircuitOpenError) as caught:
            await registry.check("t")
        assert caught.value.recovery_remaining_s == 0.0
        assert str(caught.value).endswith("recovery in 0s")

    config = CircuitBreakerConfig(failure_threshold=1, recovery_timeout=FAST, half_open_max_calls=2)
    _run(backend, body, config)


def test_default_allows_a_single_probe(backend: Backend) -> None:
    """With the default half_open_max_calls of 1, the second check while half-open is refused."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 3)
        await backend.advance(FAST * 1.5)
        await registry.check("t")
        with pytest.raises(CircuitOpenError):
            await registry.check("t")

    _run(backend, body, CircuitBreakerConfig(recovery_timeout=FAST))


def test_registry_basic(backend: Backend) -> None:
    """Breakers are per tool: one tool tripping leaves the others closed."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await registry.check("new_tool")
        await _fail(registry, "failing_tool", 3)
        with pytest.raises(CircuitOpenError):
            await registry.check("failing_tool")
        await registry.check("new_tool")

    _run(backend, body)


def test_registry_get_state(backend: Backend) -> None:
    """An unknown tool has no state, nor has one only checked; a failure makes one."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        assert await registry.get_state("unknown") is None
        await registry.check("known")
        assert await registry.get_state("known") is None
        await registry.record_failure("known")
        assert (await _state(registry, "known")).state is CircuitState.CLOSED

    _run(backend, body)


def test_success_of_unknown_tool_creates_nothing(backend: Backend) -> None:
    """record_success on a tool without a breaker does nothing; record_failure creates one."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await registry.record_success("ghost")
        assert await registry.get_state("ghost") is None
        await registry.record_failure("ghost")
        state = await _state(registry, "ghost")
        assert (state.state, state.failure_count) == (CircuitState.CLOSED, 1)
        assert state.last_failure is not None

    _run(backend, body)


def test_success_while_open_closes(backend: Backend) -> None:
    """A call that was in flight when the breaker opened and then succeeded closes it."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 3)
        await registry.record_success("t")
        assert await registry.get_state("t") is None  # closed, no failure
        await registry.check("t")

    _run(backend, body)


def test_failure_while_open_counts_but_keeps_the_timeout(backend: Backend) -> None:
    """A late failure while open adds to the count without restarting the recovery timeout."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 3)
        opened_at = (await _state(registry, "t")).opened_at
        await backend.advance(0.02)
        await registry.record_failure("t")
        state = await _state(registry, "t")
        assert (state.state, state.failure_count, state.opened_at) == (
            CircuitState.OPEN,
            4,
            opened_at,
        )

    _run(backend, body)


def test_two_registries_share_one_breaker(backend: Backend) -> None:
    """Failures recorded through one registry (connection) open the breaker seen by another."""

    async def scenario() -> None:
        async with backend.open_store() as first, backend.open_store() as second:
            worker_a, worker_b = CircuitBreakerRegistry(first), CircuitBreakerRegistry(second)
            await _fail(worker_a, "shared", 2)
            await worker_b.record_failure("shared")
            with pytest.raises(CircuitOpenError) as caught:
                await worker_a.check("shared")
            assert caught.value.consecutive_failures == 3
            with pytest.raises(CircuitOpenError):
                await worker_b.check("shared")

    asyncio.run(scenario())


def test_concurrent_failures_count_exactly(backend: Backend) -> None:
    """180 concurrent record_failure calls, from three connections, add exactly 180."""
    config = CircuitBreakerConfig(failure_threshold=1_000)

    async def scenario() -> None:
        async with backend.open_store() as a, backend.open_store() as b, backend.open_store() as c:
            registries = [CircuitBreakerRegistry(store, config) for store in (a, b, c)]
            await asyncio.gather(
                *(registry.record_failure("busy") for registry in registries for _ in range(60))
            )
            state = await _state(registries[0], "busy")
            assert (state.state, state.failure_count) == (CircuitState.CLOSED, 180)

    asyncio.run(scenario())


def test_concurrent_probes_admit_exactly_the_limit(backend: Backend) -> None:
    """Of 30 concurrent checks on a breaker due for probing, exactly half_open_max_calls pass."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        await _fail(registry, "t", 3)
        await backend.advance(FAST * 1.5)
        results = await asyncio.gather(
            *(registry.check("t") for _ in range(30)), return_exceptions=True
        )
        assert sum(result is None for result in results) == 2
        assert all(isinstance(r, CircuitOpenError) for r in results if r is not None)

    _run(backend, body, CircuitBreakerConfig(recovery_timeout=FAST, half_open_max_calls=2))


# -- scope: per task or for the whole deployment ------------------------------------------


def test_task_scoped_breakers_are_separate_per_task(backend: Backend) -> None:
    """Task A's three failures open A's breaker of the tool; task B's stays closed."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        in_a, in_b = registry.breaker("run_command", "A"), registry.breaker("run_command", "B")
        for _ in range(3):
            await in_a.record_failure()
        with pytest.raises(CircuitOpenError) as caught:
            await in_a.check()
        assert caught.value.task_id == "A"
        assert "Circuit open for tool 'run_command' in task 'A': 3 consecutive" in str(caught.value)
        await in_b.check()
        assert await in_b.get_state() is None  # closed, no failure
        assert (await in_a.get_state()) is not None
        assert await registry.get_state("run_command") is None, "no deployment-wide breaker"

    _run(backend, body)


def test_deployment_scoped_breaker_is_shared_by_every_task(backend: Backend) -> None:
    """web_fetch keeps one breaker for every task: A's failures refuse B's call."""

    async def body(registry: CircuitBreakerRegistry) -> None:
        for _ in range(3):
            await registry.breaker("web_fetch", "A").record_failure()
        with pytest.raises(CircuitOpenError) as caught:
            await registry.breaker("web_fetch", "B").check()
        assert caught.value.task_id is None
        assert (await _state(registry, "web_fetch")).state is CircuitState.OPEN

    _run(backend, body)


def test_scope_resolution_order() -> None:
    """The operator's scopes win over the tool's, which win over the built-ins and default."""
    registry = CircuitBreakerRegistry(
        config=CircuitBreakerConfig(scopes={"web_fetch": "task", "api": "deployment"})
    )
    assert registry.scope("web_fetch") == "task"
    assert registry.scope("api", declared="task") == "deployment"
    assert registry.scope("mine", declared="deployment") == "deployment"
    assert registry.scope("run_command") == "task"
    assert CircuitBreakerRegistry().scope("web_fetch") == "deployment"
    shared = CircuitBreakerRegistry(config=CircuitBreakerConfig(default_scope="deployment"))
    assert shared.scope("run_command") == "deployment"


def test_breaker_names() -> None:
    """A task's breaker is stored as tool:task:id; deployment-wide and task-less calls use the
    tool's name."""
    registry = CircuitBreakerRegistry()
    assert registry.breaker("grep", "t-1").name == "grep:task:t-1"
    assert registry.breaker("grep", None).name == "grep"
    assert registry.breaker("web_fetch", "t-1").name == "web_fetch"
    assert registry.breaker("mine", "t-1", declared="deployment").name == "mine"


def test_invalid_declared_scope_is_a_config_error() -> None:
    """A tool declaring a scope other than task or deployment is refused with the fix."""

    class Odd:
        breaker_scope = "global"

    with pytest.raises(ConfigError, match=r"'odd' declares breaker_scope='global'; use 'task'"):
        breaker_scope_of("odd", Odd())
    assert breaker_scope_of("plain", object()) is None


@pytest.mark.redis
def test_redis_task_breakers_have_their_own_keys(redis_client: RedisClientFactory) -> None:
    """In Redis a task's breaker lives under keys.breaker_key('tool:task:id')."""

    async def scenario() -> None:
        async with redis_client() as client:
            registry = CircuitBreakerRegistry(RedisBreakerStore(client))
            await registry.breaker("run_command", "A").record_failure()
            assert await client.exists(keys.breaker_key("run_command:task:A")) == 1
            assert await client.exists(keys.breaker_key("run_command")) == 0

    asyncio.run(scenario())


# -- Redis specifics -----------------------------------------------------------------------


@pytest.mark.redis
def test_redis_breaker_key_has_a_ttl(redis_client: RedisClientFactory) -> None:
    """The breaker lives under keys.breaker_key with a TTL of at least twice the recovery."""

    async def scenario() -> None:
        async with redis_client() as client:
            short = RedisBreakerStore(client, ttl_s=5)
            await short.record_failure("t", CircuitBreakerConfig())
            ttl_ms = await client.pttl(keys.breaker_key("t"))
            assert 115_000 < ttl_ms <= 120_000
            store = RedisBreakerStore(client)
            await store.check("u", CircuitBreakerConfig())
            assert await client.exists(keys.breaker_key("u")) == 0, "a check writes nothing"
            await store.record_failure("u", CircuitBreakerConfig())
            ttl_ms = await client.pttl(keys.breaker_key("u"))
            assert keys.breaker_ttl_s * 1000 - 5_000 < ttl_ms <= keys.breaker_ttl_s * 1000

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_breaker_expires_when_idle(redis_client: RedisClientFactory) -> None:
    """An idle breaker's key expires, so a dead tool does not stay open forever."""

    async def scenario() -> None:
        async with redis_client() as client:
            store = RedisBreakerStore(client, ttl_s=0.05)
            config = CircuitBreakerConfig(recovery_timeout=0.01)
            await store.record_failure("t", config)
            await asyncio.sleep(0.12)
            assert await store.get_state("t") is None

    asyncio.run(scenario())


TASK_T = f"t{TASK_BREAKER_MARK}task-1"
"""A task's own breaker of tool ``t``."""


@pytest.mark.redis
def test_redis_breaker_sends_one_hmget_per_clean_call(redis_client: RedisClientFactory) -> None:
    """A call whose (task's own) breaker is closed with no failure costs one HMGET: the
    check writes nothing and the success after it writes nothing; a deployment-wide
    breaker's success always removes it (one DEL). A success after a check that found
    failures, or after a failure recorded through this store since a clean check, removes
    the breaker (one DEL)."""

    async def scenario() -> None:
        async with redis_client() as client:
            store = RedisBreakerStore(client)
            registry = CircuitBreakerRegistry(store)
            sent: list[str] = []
            execute = client.execute_command

            async def counting(*args: object, **options: object) -> object:
                sent.append(str(args[0]).upper())
                return await execute(*args, **options)

            client.execute_command = counting  # type: ignore[method-assign]
            await registry.check(TASK_T)
            await registry.record_success(TASK_T)
            assert sent == ["HMGET"]
            assert await store.get_state(TASK_T) is None

            sent.clear()
            await registry.check("web_fetch")  # a deployment-wide breaker
            await registry.record_success("web_fetch")
            assert sent == ["HMGET", "DEL"]

            await registry.check(TASK_T)  # clean
            await registry.record_failure(TASK_T)  # since the clean check: not clean any more
            sent.clear()
            await registry.record_success(TASK_T)
            assert sent == ["DEL"]
            assert await store.get_state(TASK_T) is None

            await registry.record_failure(TASK_T)
            await registry.check(TASK_T)  # not clean: one failure counted
            sent.clear()
            await registry.record_success(TASK_T)
            assert sent == ["DEL"]
            assert await store.get_state(TASK_T) is None

    asyncio.run(scenario())


@pytest.mark.redis
def test_a_failure_elsewhere_after_a_clean_check_is_the_documented_race(
    redis_client: RedisClientFactory,
) -> None:
    """A failure recorded through another store (another worker process) between a clean
    check of a task's own breaker and its success is not reset by that success
    (RedisBreakerStore's cost); a success whose own check saw the failure resets it."""

    async def scenario() -> None:
        async with redis_client() as a, redis_client() as b:
            here, there = (
                CircuitBreakerRegistry(RedisBreakerStore(a)),
                CircuitBreakerRegistry(RedisBreakerStore(b)),
            )
            await here.check(TASK_T)
            await there.record_failure(TASK_T)
            await here.record_success(TASK_T)
            assert (await _state(here, TASK_T)).failure_count == 1
            await here.check(TASK_T)
            await here.record_success(TASK_T)
            assert await here.get_state(TASK_T) is None

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_breaker_with_decoded_responses(redis_client: RedisClientFactory) -> None:
    """The Redis store works on a client that decodes responses to str."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            registry = CircuitBreakerRegistry(RedisBreakerStore(client))
            await _fail(registry, "t", 3)
            state = await _state(registry, "t")
            assert (state.state, state.failure_count) == (CircuitState.OPEN, 3)

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_breaker_survives_a_server_restart_with_aof(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """With AOF on, an open breaker is still open after Redis restarts on the same port."""
    server = redis_server_factory(appendonly=True)
    factory = RedisClientFactory(server.url)

    async def trip() -> None:
        async with factory() as client:
            await _fail(CircuitBreakerRegistry(RedisBreakerStore(client)), "t", 3)

    async def after_restart() -> None:
        async with factory() as client:
            registry = CircuitBreakerRegistry(RedisBreakerStore(client))
            assert (await _state(registry, "t")).state is CircuitState.OPEN
            with pytest.raises(CircuitOpenError):
                await registry.check("t")

    asyncio.run(trip())
    port = server.port
    server.restart()
    assert server.port == port
    asyncio.run(after_restart())


_OPERATIONS = st.lists(st.sampled_from(["check", "success", "failure"]), max_size=25)


@pytest.mark.redis
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=_OPERATIONS, recovery_s=st.sampled_from([0.0, 60.0]), threshold=st.integers(1, 4))
def test_lua_scripts_match_the_python_state_machine(
    redis_client: RedisClientFactory, operations: list[str], recovery_s: float, threshold: int
) -> None:
    """Any sequence of operations leaves the Redis and in-memory breakers in the same state."""
    config = CircuitBreakerConfig(failure_threshold=threshold, recovery_timeout=recovery_s)
    tool = f"model-{uuid4().hex}"

    async def step(store: BreakerStateStore, operation: str) -> bool | None:
        if operation == "check":
            return (await store.check(tool, config)).allowed
        if operation == "success":
            await store.record_success(tool, config)
        else:
            await store.record_failure(tool, config)
        return None

    def shape(state: BreakerState | None) -> tuple[object, ...] | None:
        if state is None:
            return None
        return (state.state, state.failure_count, state.half_open_calls)

    async def scenario() -> None:
        memory = InMemoryBreakerStore(FakeClock())
        async with redis_client() as client:
            redis_store = RedisBreakerStore(client)
            for operation in operations:
                assert await step(memory, operation) == await step(redis_store, operation)
                assert shape(await memory.get_state(tool)) == shape(
                    await redis_store.get_state(tool)
                )

    asyncio.run(scenario())


@pytest.mark.redis
def test_failures_each_followed_by_a_success_elsewhere_do_not_open_the_breaker(
    redis_client: RedisClientFactory,
) -> None:
    """A deployment-wide breaker (web_fetch) across two worker processes: failures of one
    process, each followed by a success of the other's calls checked while it was clean,
    were never consecutive and do not open it."""

    async def scenario() -> None:
        async with redis_client() as a, redis_client() as b:
            here = CircuitBreakerRegistry(RedisBreakerStore(a))  # process A, 3 calls in flight
            there = CircuitBreakerRegistry(RedisBreakerStore(b))  # process B
            for _ in range(3):
                await here.check("web_fetch")  # each finds the breaker clean
            for _ in range(3):  # threshold 3: fail, success, fail, success, fail
                await there.record_failure("web_fetch")
                await here.record_success("web_fetch")
            state = await here.get_state("web_fetch")
            # A success came after every failure: never more than one consecutive failure.
            assert state is None or state.state is CircuitState.CLOSED, state

    asyncio.run(scenario())
