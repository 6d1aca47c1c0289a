"""The rate limit a deployment shares per provider and key, and the record of waits.

When a provider answers 429, every worker calling it with the same key should hold off, not
only the one that was told: otherwise 200 tasks stampede a limited key. The hold is one Redis
string per provider and key, ``orga:ratelimit:{provider}:{digest}`` (``shared.keys``): the
time, in unix milliseconds, until which callers wait. A 429's ``Retry-After`` (or the backoff
when it sends none) moves it later, never earlier, in one Lua script; every call first waits
until then. The digest is a hash of the base URL and the key, never the key.

A "blocked until" key fits ``Retry-After`` exactly (the provider says when, not a rate), so no
token bucket is needed; it costs one script run per 429, and a ``GET`` per model call, which a
worker process reads in the round trip that starts the dispatch (:func:`read_ahead`) and at
most once per :data:`HOLD_FRESH_S` per key (:class:`HoldReads`): a dispatch that starts within
that time of the last read of its key takes that answer. A hold another process sets is thus
seen up to :data:`HOLD_FRESH_S` later (the calls started meanwhile go to the provider, which
answers them 429 if it still limits, and they hold off then); one this process sets is seen at
once.

Waits are reported with the iteration (``ReasonedMessage.provider_waits``) and journaled by
the coordinator: :func:`recording_waits` collects those of the model calls made inside it.
"""

from __future__ import annotations

import contextvars
import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Protocol

from redis.asyncio import Redis

from shared.inference import ProviderWait

__all__ = [
    "HOLD_FRESH_S",
    "HoldReads",
    "NoThrottle",
    "ProviderThrottle",
    "RedisThrottle",
    "key_digest",
    "read_ahead",
    "record_wait",
    "recording_waits",
]

_HOLD_SCRIPT = """
local until_ms = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if until_ms > current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return until_ms
end
return current
"""

HOLD_FRESH_S: Final = 0.5
"""How long a worker process takes the hold it last read of a key as current (seconds)."""
HOLDS_KEPT: Final = 256
"""How many keys' last reads :class:`HoldReads` keeps (the oldest forgotten first)."""

_waits: contextvars.ContextVar[list[ProviderWait] | None] = contextvars.ContextVar(
    "orga_provider_waits", default=None
)
_read_ahead: contextvars.ContextVar[dict[str, bytes | None] | None] = contextvars.ContextVar(
    "orga_hold_read_ahead", default=None
)


class ProviderThrottle(Protocol):
    """Holds every caller of one provider and key off while it rate-limits."""

    async def blocked_for_s(self) -> float:
        """Seconds callers must still wait before the next call (0: go)."""
        ...

    async def block(self, delay_s: float) -> None:
        """Make every caller wait ``delay_s`` seconds from now (a 429 said so)."""
        ...


class NoThrottle:
    """No shared limit: each call only honours its own answers (tests, the in-process runner)."""

    async def blocked_for_s(self) -> float:
        """Never blocked."""
        return 0.0

    async def block(self, delay_s: float) -> None:
        """Nothing to share."""


class HoldReads:
    """The holds one worker process read lately, by key: a read younger than ``fresh_s`` is
    taken as the hold's current value instead of reading it again (see the module docstring).
    Used on one event loop."""

    def __init__(
        self, fresh_s: float = HOLD_FRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fresh_s = fresh_s
        self._clock = clock
        self._read: dict[str, tuple[float, bytes | None]] = {}

    def fresh(self, key: str) -> tuple[bool, bytes | None]:
        """``(True, raw)``: the hold ``key`` as read less than ``fresh_s`` ago (None: no hold);
        ``(False, None)``: it must be read."""
        entry = self._read.get(key)
        if entry is None or self._clock() - entry[0] >= self._fresh_s:
            return False, None
        return True, entry[1]

    def saw(self, key: str, raw: bytes | None) -> None:
        """The hold ``key`` was read now: ``raw`` (None: no hold)."""
        self._read.pop(key, None)
        self._read[key] = (self._clock(), raw)
        while len(self._read) > HOLDS_KEPT:
            self._read.pop(next(iter(self._read)))

    def forget(self, key: str) -> None:
        """The hold ``key`` changed (this process set it): the next start reads it."""
        self._read.pop(key, None)


class RedisThrottle:
    """The shared hold of one provider and key, in Redis (see the module docstring); with
    ``reads``, the process's :class:`HoldReads`, which its reads and holds keep current."""

    def __init__(
        self,
        redis: Redis,
        key: str,
        clock: Callable[[], float] = time.time,
        reads: HoldReads | None = None,
    ) -> None:
        self._redis = redis
        self._key = key
        self._clock = clock
        self._reads = reads
        self._hold = redis.register_script(_HOLD_SCRIPT)

    async def blocked_for_s(self) -> float:
        """Seconds until the hold set by the latest 429 ends."""
        ahead = _read_ahead.get()
        raw: bytes | str | None
        if ahead is not None and self._key in ahead:
            raw = ahead.pop(self._key)
        else:
            raw = await self._redis.get(self._key)
            if self._reads is not None and (raw is None or isinstance(raw, bytes)):
                self._reads.saw(self._key, raw)
        until_ms = int(raw) if raw is not None else 0
        return max(until_ms / 1000 - self._clock(), 0.0)

    async def block(self, delay_s: float) -> None:
        """Move the hold to ``now + delay_s`` unless it already ends later."""
        until_ms = int((self._clock() + delay_s) * 1000)
        ttl_ms = int(delay_s * 1000) + 1000
        await self._hold(keys=[self._key], args=[until_ms, ttl_ms])
        if self._reads is not None:
            self._reads.forget(self._key)


def read_ahead(key: str, raw: bytes | None) -> None:
    """The hold ``key`` as the round trip that started this dispatch read it (``GET``): the
    next :meth:`RedisThrottle.blocked_for_s` of that key in this task (asyncio context) uses
    it instead of reading it again."""
    _read_ahead.set({key: raw})


def key_digest(base_url: str, api_key: str) -> str:
    """What names a provider key in Redis: a hash of the base URL and the key (never the key)."""
    material = f"{base_url.rstrip('/')}\0{api_key}".encode()
    return hashlib.sha256(material).hexdigest()[:24]


@contextmanager
def recording_waits() -> Iterator[list[ProviderWait]]:
    """Collect the waits of the model calls made inside (in this task's context)."""
    waits: list[ProviderWait] = []
    token = _waits.set(waits)
    try:
        yield waits
    finally:
        _waits.reset(token)


def record_wait(wait: ProviderWait) -> None:
    """Add a wait to the innermost :func:`recording_waits`, if any."""
    waits = _waits.get()
    if waits is not None:
        waits.append(wait)
