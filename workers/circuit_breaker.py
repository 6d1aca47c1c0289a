"""Circuit breakers per tool: closed, open, half-open (Symbiont §3), with shared state.

The state machine is Symbiont's; the defaults are this project's (threshold 3, recovery 60 s,
one half-open probe):

* **closed** - calls pass. Each failure adds one to ``failure_count``; a success resets it, so
  only *consecutive* failures trip the breaker. At ``failure_threshold`` it opens.
* **open** - calls are refused with :class:`CircuitOpenError` until ``recovery_timeout`` has
  passed since it opened; the first check after that moves it to half-open and is the first
  probe.
* **half-open** - at most ``half_open_max_calls`` probes pass. A success closes the breaker, a
  failure opens it again with a fresh ``opened_at`` (the failure count is not incremented).

The state lives behind :class:`BreakerStateStore`, whose operations are atomic:
:class:`InMemoryBreakerStore` for one process (its clock is injectable), and
:class:`RedisBreakerStore`, so every worker process shares one breaker per tool. The Redis
scripts read the server clock (``TIME``), so the clocks of the workers do not matter; an idle
breaker's key expires after ``keys.breaker_ttl_s`` (and never before twice its recovery
timeout).

**A closed breaker with no failure counted is kept as no breaker at all** (issue 27): it has
nothing to remember, and nearly every call finds its breaker so. ``check`` of a missing
breaker lets the call through and creates nothing; ``record_failure`` creates the breaker;
``record_success`` removes it (closed, no failure, no probe: what a success leaves); on an
unknown tool it does nothing; ``get_state`` returns None for a missing breaker. A success is
not counted (there is no success count). In Redis, a check is then one ``HMGET``, and a script
runs only for an open or half-open breaker; a success after a check that found a task's own
breaker clean writes nothing, and a deployment-wide breaker's success is always one ``DEL``
(:class:`RedisBreakerStore`).

**Scope.** A breaker protects the callers from a failing dependency. For a tool that works on
the task's own workspace (``run_command``, the file tools, ``grep``), failures say something
about that task, not about the tool: task A's command timing out must not refuse task B's
``done_when`` check. Such tools get one breaker **per task** (scope ``task``, the default),
stored under the name ``{tool}:task:{task_id}``. A tool that calls an external service
(``web_fetch``) keeps one breaker for the whole **deployment** (scope ``deployment``), under the
tool's name, so one task's failures spare the others the dead endpoint. The scope of a tool is,
first match wins: ``CircuitBreakerConfig.scopes`` (the operator), the tool's own
``breaker_scope`` attribute, :data:`DEFAULT_BREAKER_SCOPES`, ``CircuitBreakerConfig.default_scope``.
A call without a task id (an in-process run that names no task) uses the tool's breaker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, Final, Literal, Protocol, get_args, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from shared import keys
from shared.durations import Duration
from shared.errors import ConfigError, OrgaError
from workers.redis_batch import PipelineRunner

__all__ = [
    "DEFAULT_BREAKER_SCOPES",
    "TASK_BREAKER_MARK",
    "Breaker",
    "BreakerScope",
    "BreakerState",
    "BreakerStateStore",
    "BreakerVerdict",
    "CircuitBreakerConfig",
    "CircuitBreakerRegistry",
    "CircuitOpenError",
    "CircuitState",
    "InMemoryBreakerStore",
    "RedisBreakerStore",
    "breaker_scope_of",
    "format_remaining",
]

BreakerScope = Literal["task", "deployment"]
"""``task``: one breaker per task and tool; ``deployment``: one per tool for every task."""

DEFAULT_BREAKER_SCOPES: Final[dict[str, BreakerScope]] = {"web_fetch": "deployment"}
"""Built-in tools that call external services: their breakers are deployment-wide."""


class CircuitState(StrEnum):
    """Where a breaker is in its state machine."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


TASK_BREAKER_MARK = ":task:"
"""What names a task's own breaker: ``{tool}:task:{task_id}`` (a tool's name alone is its
deployment-wide breaker)."""


class CircuitBreakerConfig(BaseModel):
    """Trip after ``failure_threshold`` consecutive failures; probe after ``recovery_timeout``.

    ``half_open_max_calls`` probes may run while half-open; the defaults are the production
    values (3 failures, 60 s, 1 probe).
    """

    model_config = ConfigDict(frozen=True)

    failure_threshold: int = Field(default=3, ge=1)
    recovery_timeout: Duration = timedelta(seconds=60)
    half_open_max_calls: int = Field(default=1, ge=1)
    default_scope: BreakerScope = "task"
    scopes: dict[str, BreakerScope] = Field(default_factory=dict)
    """The operator's choice of scope for named tools; it wins over the tool's own."""

    @property
    def recovery_timeout_s(self) -> float:
        """The recovery timeout in seconds."""
        return self.recovery_timeout.total_seconds()


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A snapshot of one breaker; times are seconds on the store's clock."""

    state: CircuitState = CircuitState.CLOSED
    failure_count: int = 0
    half_open_calls: int = 0
    opened_at: float | None = None
    last_failure: float | None = None


@dataclass(frozen=True, slots=True)
class BreakerVerdict:
    """The answer of a check: may the call run, and if not, how long until a probe."""

    allowed: bool
    consecutive_failures: int = 0
    recovery_remaining_s: float = 0.0


def format_remaining(seconds: float) -> str:
    """``59.9s`` from one second up, ``250ms`` below, ``0s`` when due now."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s"


class CircuitOpenError(OrgaError):
    """The breaker of a tool is open (or its half-open probes are taken): the call must not run.

    ``task_id`` is set when the breaker is the task's own (scope ``task``).
    """

    def __init__(
        self,
        tool: str,
        consecutive_failures: int,
        recovery_remaining_s: float,
        task_id: str | None = None,
    ) -> None:
        self.tool = tool
        self.consecutive_failures = consecutive_failures
        self.recovery_remaining_s = recovery_remaining_s
        self.task_id = task_id
        where = "" if task_id is None else f" in task {task_id!r}"
        super().__init__(
            f"Circuit open for tool {tool!r}{where}: {consecutive_failures} consecutive "
            f"failures, recovery in {format_remaining(recovery_remaining_s)}"
        )


def breaker_scope_of(tool_name: str, tool: object) -> BreakerScope | None:
    """The scope ``tool`` declares with a ``breaker_scope`` attribute, or None.

    Raises ConfigError for a value other than ``task`` or ``deployment``.
    """
    declared = getattr(tool, "breaker_scope", None)
    if declared is None or declared in get_args(BreakerScope):
        return declared
    raise ConfigError(
        f"tool {tool_name!r} declares breaker_scope={declared!r}; use 'task' (its breaker "
        "is per task) or 'deployment' (one breaker for every task)"
    )


@runtime_checkable
class BreakerStateStore(Protocol):
    """Holds the breakers; every operation is atomic with respect to every other caller."""

    async def check(self, tool: str, config: CircuitBreakerConfig) -> BreakerVerdict:
        """May ``tool`` run now? A missing breaker is closed (and stays missing); may move open
        to half-open."""
        ...

    async def record_success(self, tool: str, config: CircuitBreakerConfig) -> None:
        """A call of ``tool`` succeeded: its breaker is closed with no failure, i.e. removed;
        nothing happens for an unknown tool."""
        ...

    async def record_failure(self, tool: str, config: CircuitBreakerConfig) -> None:
        """A call of ``tool`` failed; creates the breaker when missing."""
        ...

    async def get_state(self, tool: str) -> BreakerState | None:
        """The breaker of ``tool``, or None when there is none."""
        ...


# -- the state machine, as pure functions (the Lua scripts below mirror them) ---------------


def _check(
    state: BreakerState, now: float, config: CircuitBreakerConfig
) -> tuple[BreakerState, BreakerVerdict]:
    if state.state is CircuitState.CLOSED:
        return state, BreakerVerdict(True, state.failure_count)
    if state.state is CircuitState.OPEN:
        elapsed = max(0.0, now - (state.opened_at if state.opened_at is not None else now))
        if elapsed >= config.recovery_timeout_s:
            probing = replace(state, state=CircuitState.HALF_OPEN, half_open_calls=1)
            return probing, BreakerVerdict(True, state.failure_count)
        remaining = config.recovery_timeout_s - elapsed
        return state, BreakerVerdict(False, state.failure_count, remaining)
    if state.half_open_calls < config.half_open_max_calls:
        probing = replace(state, half_open_calls=state.half_open_calls + 1)
        return probing, BreakerVerdict(True, state.failure_count)
    return state, BreakerVerdict(False, state.failure_count, 0.0)


def _on_failure(state: BreakerState, now: float, config: CircuitBreakerConfig) -> BreakerState:
    state = replace(state, last_failure=now)
    if state.state is CircuitState.CLOSED:
        failures = state.failure_count + 1
        if failures >= config.failure_threshold:
            return replace(state, state=CircuitState.OPEN, failure_count=failures, opened_at=now)
        return replace(state, failure_count=failures)
    if state.state is CircuitState.HALF_OPEN:
        return replace(state, state=CircuitState.OPEN, opened_at=now, half_open_calls=0)
    return replace(state, failure_count=state.failure_count + 1)


class InMemoryBreakerStore:
    """Breakers of one process. Atomic because no operation awaits between read and write.

    ``clock`` returns seconds (``time.monotonic`` by default); tests inject a fake one.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, BreakerState] = {}

    async def check(self, tool: str, config: CircuitBreakerConfig) -> BreakerVerdict:
        """May ``tool`` run now? (A missing breaker is closed and stays missing.)"""
        current = self._states.get(tool)
        if current is None:
            return BreakerVerdict(True)
        state, verdict = _check(current, self._clock(), config)
        self._states[tool] = state
        return verdict

    async def record_success(self, tool: str, config: CircuitBreakerConfig) -> None:
        """Close the breaker of ``tool``: closed with no failure is no breaker."""
        self._states.pop(tool, None)

    async def record_failure(self, tool: str, config: CircuitBreakerConfig) -> None:
        """Count a failure of ``tool``."""
        state = self._states.get(tool, BreakerState())
        self._states[tool] = _on_failure(state, self._clock(), config)

    async def get_state(self, tool: str) -> BreakerState | None:
        """The breaker of ``tool``, or None."""
        return self._states.get(tool)


# -- Redis ---------------------------------------------------------------------------------

# Shared prologue: KEYS[1] is the breaker hash, ARGV[1] its TTL in ms. Times are integer
# milliseconds of the server clock (13 digits: Lua's tostring keeps them exact).
_PROLOGUE = """
local key = KEYS[1]
local ttl_ms = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# ARGV[2] recovery timeout ms, ARGV[3] half-open max calls -> {allowed, failures, remaining_ms}
#   Run only for a breaker an HMGET found open or half-open (its transitions must be atomic);
#   one found closed (or gone) since is let through, as the HMGET would have. The server's
#   clock is read only for an open breaker.
_CHECK_LUA = """
local key = KEYS[1]
local ttl_ms = tonumber(ARGV[1])
local recovery_ms = tonumber(ARGV[2])
local half_open_max = tonumber(ARGV[3])
local f = redis.call('HMGET', key, 'state', 'failures', 'opened_at', 'half_open_calls')
local state = f[1]
local failures = tonumber(f[2] or 0)
if (not state) or state == 'closed' then
  return {1, failures, 0}
end
if state == 'open' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local elapsed = math.max(0, now - tonumber(f[3] or now))
  if elapsed >= recovery_ms then
    redis.call('HSET', key, 'state', 'half_open', 'half_open_calls', 1)
    redis.call('PEXPIRE', key, ttl_ms)
    return {1, failures, 0}
  end
  return {0, failures, recovery_ms - elapsed}
end
if tonumber(f[4] or 0) < half_open_max then
  redis.call('HINCRBY', key, 'half_open_calls', 1)
  redis.call('PEXPIRE', key, ttl_ms)
  return {1, failures, 0}
end
return {0, failures, 0}
"""

# ARGV[2] failure threshold
_FAILURE_LUA = (
    _PROLOGUE
    + """
local threshold = tonumber(ARGV[2])
local f = redis.call('HMGET', key, 'state', 'failures')
local state = f[1] or 'closed'
local failures = tonumber(f[2] or 0)
redis.call('HSET', key, 'last_failure', now)
if state == 'closed' then
  failures = failures + 1
  if failures >= threshold then
    redis.call('HSET', key, 'state', 'open', 'failures', failures, 'opened_at', now)
  else
    redis.call('HSET', key, 'state', 'closed', 'failures', failures)
  end
elseif state == 'half_open' then
  redis.call('HSET', key, 'state', 'open', 'opened_at', now, 'half_open_calls', 0)
else
  redis.call('HINCRBY', key, 'failures', 1)
end
redis.call('PEXPIRE', key, ttl_ms)
return 1
"""
)

_FIELDS = ("state", "failures", "half_open_calls", "opened_at", "last_failure")
_CHECK_FIELDS = ("state", "failures", "opened_at", "half_open_calls")
CLEAN_CHECKS_KEPT = 4096
"""How many breakers' clean checks a :class:`RedisBreakerStore` remembers (past it, it forgets
them all: the successes that follow are then written, which is always correct)."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(value: Any) -> float | None:
    text = _text(value)
    return None if text is None else int(text) / 1000


class RedisBreakerStore:
    """Breakers in Redis hashes (``keys.breaker_key``); a closed breaker with no failure
    counted has no hash.

    Works with any ``redis.asyncio.Redis`` client, ``decode_responses`` on or off, Redis 6.2+.
    ``ttl_s`` is how long an idle breaker lives (at least twice its recovery timeout).

    What each operation sends:

    * **check**: one ``HMGET``. A breaker it finds missing or closed lets the call through;
      one it finds open or half-open is checked again by a Lua script, which moves it to
      half-open and counts the probes atomically.
    * **success**: nothing after a check of this store that found the breaker clean (missing,
      or closed with no failure) and no failure of that breaker recorded through this store
      since: the success would leave it as that check found it. Otherwise one ``DEL``
      (closed, no failure, no probe).
    * **failure**: one Lua script (the count, the opening, the TTL).

    With ``pipelines`` (a worker's :class:`~workers.redis_batch.CoalescedPipeline`), a
    check's ``HMGET`` goes out in the pipeline of its loop turn, with the other calls' checks
    and starts, instead of a round trip of its own.

    A success writes nothing only for a task's own breaker (``{tool}:task:{task_id}``): a
    deployment-wide breaker's success is always one ``DEL``. The cost for a task's breaker: a
    failure of the same task's parallel call recorded through *another* store (another
    worker process) between this call's clean check and its success is not reset by this
    success, so where one task's calls of one tool interleave across processes, its breaker
    may open early.
    """

    def __init__(
        self,
        client: Redis,
        *,
        ttl_s: float = keys.breaker_ttl_s,
        pipelines: PipelineRunner | None = None,
    ) -> None:
        self._client = client
        self._pipelines = pipelines
        self._ttl_s = ttl_s
        self._clean: dict[str, int] = {}
        """Breaker -> checks of it that found it clean, whose success is not written yet."""
        self._check_script = client.register_script(_CHECK_LUA)
        self._failure_script = client.register_script(_FAILURE_LUA)

    def _ttl_ms(self, config: CircuitBreakerConfig) -> int:
        return math.ceil(max(self._ttl_s, 2 * config.recovery_timeout_s) * 1000)

    async def check(self, tool: str, config: CircuitBreakerConfig) -> BreakerVerdict:
        """May ``tool`` run now? One ``HMGET``; a script for an open or half-open breaker."""
        key = keys.breaker_key(tool)
        if self._pipelines is None:
            fields = await self._client.hmget(key, list(_CHECK_FIELDS))
        else:
            (fields,) = await self._pipelines.run(lambda pipe: pipe.hmget(key, _CHECK_FIELDS))
            if isinstance(fields, Exception):
                raise fields
        state, failures = _text(fields[0]), int(_text(fields[1]) or 0)
        if state is None or state == CircuitState.CLOSED.value:
            if failures == 0:
                self._remember_clean(tool)
            else:
                self._clean.pop(tool, None)  # older clean checks: a failure came since
            return BreakerVerdict(True, failures)
        self._clean.pop(tool, None)
        recovery_ms = math.ceil(config.recovery_timeout_s * 1000)
        args = [self._ttl_ms(config), recovery_ms, config.half_open_max_calls]
        allowed, failures, remaining_ms = await self._check_script(keys=[key], args=args)
        return BreakerVerdict(bool(allowed), int(failures), int(remaining_ms) / 1000)

    def _remember_clean(self, tool: str) -> None:
        if tool not in self._clean and len(self._clean) >= CLEAN_CHECKS_KEPT:
            self._clean.clear()  # forgotten checks only make their successes write
        self._clean[tool] = self._clean.get(tool, 0) + 1

    async def record_success(self, tool: str, config: CircuitBreakerConfig) -> None:
        """Close the breaker of ``tool``: for a task's own breaker, nothing to write after a
        clean check (see the class); else remove it. A deployment-wide breaker is always
        removed: its calls run in every worker process, and another process's failure since
        this call's check must be reset by this success, or failures that were never
        consecutive would open it."""
        if self._take_clean(tool) and TASK_BREAKER_MARK in tool:
            return
        await self._client.delete(keys.breaker_key(tool))

    def _take_clean(self, tool: str) -> bool:
        count = self._clean.get(tool, 0)
        if count <= 0:
            return False
        if count == 1:
            del self._clean[tool]
        else:
            self._clean[tool] = count - 1
        return True

    async def record_failure(self, tool: str, config: CircuitBreakerConfig) -> None:
        """Count a failure of ``tool`` (the checks that found it clean are clean no more)."""
        self._clean.pop(tool, None)
        args = [self._ttl_ms(config), config.failure_threshold]
        await self._failure_script(keys=[keys.breaker_key(tool)], args=args)

    async def get_state(self, tool: str) -> BreakerState | None:
        """The breaker of ``tool``, or None (also for a closed one with no failure)."""
        values = await self._client.hmget(keys.breaker_key(tool), list(_FIELDS))
        state, failures, half_open, opened_at, last_failure = values
        name = _text(state)
        if name is None:
            return None
        return BreakerState(
            state=CircuitState(name),
            failure_count=int(_text(failures) or 0),
            half_open_calls=int(_text(half_open) or 0),
            opened_at=_seconds(opened_at),
            last_failure=_seconds(last_failure),
        )


class CircuitBreakerRegistry:
    """Breakers with the same config in a :class:`BreakerStateStore`.

    ``check``, ``record_*`` and ``get_state`` take the breaker's name: a tool name is its
    deployment-wide breaker. :meth:`breaker` picks the breaker of one call by its scope.
    """

    def __init__(
        self, store: BreakerStateStore | None = None, config: CircuitBreakerConfig | None = None
    ) -> None:
        self.store: BreakerStateStore = store if store is not None else InMemoryBreakerStore()
        self.config = config if config is not None else CircuitBreakerConfig()

    def scope(self, tool: str, declared: BreakerScope | None = None) -> BreakerScope:
        """The scope of ``tool``'s breaker: the operator's, the tool's, built-in, default."""
        if tool in self.config.scopes:
            return self.config.scopes[tool]
        if declared is not None:
            return declared
        return DEFAULT_BREAKER_SCOPES.get(tool, self.config.default_scope)

    def breaker(
        self, tool: str, task_id: str | None = None, declared: BreakerScope | None = None
    ) -> Breaker:
        """The breaker a call of ``tool`` in task ``task_id`` goes through."""
        if task_id is None or self.scope(tool, declared) == "deployment":
            return Breaker(self, tool, tool)
        return Breaker(self, tool, f"{tool}{TASK_BREAKER_MARK}{task_id}", task_id)

    async def check(self, tool: str) -> None:
        """Return if ``tool`` may run now; raise :class:`CircuitOpenError` otherwise."""
        await Breaker(self, tool, tool).check()

    async def record_success(self, tool: str) -> None:
        """A call of ``tool`` succeeded."""
        await self.store.record_success(tool, self.config)

    async def record_failure(self, tool: str) -> None:
        """A call of ``tool`` failed (raised or timed out)."""
        await self.store.record_failure(tool, self.config)

    async def get_state(self, tool: str) -> BreakerState | None:
        """The breaker of ``tool``, or None when it was never checked nor failed."""
        return await self.store.get_state(tool)


@dataclass(frozen=True, slots=True)
class Breaker:
    """One breaker of a registry: a tool's, deployment-wide, or a tool's in one task."""

    registry: CircuitBreakerRegistry
    tool: str
    name: str
    """The key in the store: the tool name, or ``{tool}:task:{task_id}``."""
    task_id: str | None = None

    async def check(self) -> None:
        """Return if the call may run now; raise :class:`CircuitOpenError` otherwise."""
        verdict = await self.registry.store.check(self.name, self.registry.config)
        if not verdict.allowed:
            raise CircuitOpenError(
                self.tool,
                verdict.consecutive_failures,
                verdict.recovery_remaining_s,
                self.task_id,
            )

    async def record_success(self) -> None:
        """The call succeeded."""
        await self.registry.store.record_success(self.name, self.registry.config)

    async def record_failure(self) -> None:
        """The call failed (raised or timed out)."""
        await self.registry.store.record_failure(self.name, self.registry.config)

    async def get_state(self) -> BreakerState | None:
        """This breaker's state, or None when it was never checked nor failed."""
        return await self.registry.store.get_state(self.name)
