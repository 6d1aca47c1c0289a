"""Partition leases: which coordinator serves which partitions.

Each coordinator holds the lease of a fair share of the deployment's partitions
(``orga:{p:NN}:partition_lease``, in the partition's own slot) and reads only those partitions'
intake, observations and control streams, looks only at their deadlines and runs only their
outbox relays. Task leases (``orga:{p:NN}:lease:{task}``) and the commit's compare-and-set stay
the fence that keeps every input applied once; partition leases spread the work and bound how
long two coordinators read one partition's streams.

Membership
    Every coordinator scores its name in ``orga:coordinators`` with Redis's clock (``TIME`` in
    the script, so hosts' clocks do not matter) each heartbeat; a name older than the lease TTL
    is dropped. The fair share of the ``i``-th of ``N`` members in name order is
    ``P // N + (1 if i < P % N else 0)``: the shares add up to ``P``, and every coordinator
    computes the same ones from the same members.

Heartbeat (every third of ``ttl_s``; at once when a tick finds the members changed, a
newcomer or a coordinator gone; every tick while this coordinator holds less than its share)
    1. renew every lease this coordinator holds; one found expired or held by another is
       *lost*: it stops being served at once;
    2. more than the share: the excess (the highest partitions) is *drained*: no longer served
       from now on, its lease kept until each of the coordinator's loops has started a new
       iteration since (none still works on it; at most ``ttl_s``), then deleted;
    3. less: free partitions are taken (``SET NX PX``), starting at an offset drawn from the
       name so that two newcomers seldom race for the same one.

Bounds
    A partition is served only while its last renewal was *sent* less than ``ttl_s`` ago (local
    monotonic clock): Redis keeps the lease at least that long, so a coordinator paused past its
    lease stops reading before (or as) another takes over, whatever its heartbeat loop does. A
    handover overlaps no read: a drained partition's lease is deleted only once no loop works on
    it. A dead coordinator's partitions are taken ``ttl_s`` (plus at most a tick) after its last
    renewal; its tasks are then driven once their task leases expire (``ORGA_LEASE_TTL_S``) and
    its read but unapplied entries are claimed after ``ORGA_CLAIM_IDLE_MS``.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from shared import keys

__all__ = ["LeasePlan", "PartitionLeases", "fair_share", "forget_holders", "plan_leases"]

log = logging.getLogger("orga.coordinator.partitions")

_MEMBERS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[2]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

_TOUCH = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return owner
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def forget_holders(redis: Redis, partitions: int) -> None:
    """Delete every partition lease and the members: for a process that knows it is the only
    coordinator of its Redis (the embedded runtime, holding its home's lock), so that leases
    left by a predecessor killed with SIGKILL do not keep it waiting for their TTL."""
    await redis.delete(keys.coordinators_key)
    for p in range(partitions):
        await redis.delete(keys.partition_lease_key(p))


def fair_share(partitions: int, members: Iterable[str], name: str) -> int:
    """How many partitions ``name`` should hold among ``members`` (``name`` counted in)."""
    ordered = sorted(set(members) | {name})
    base, extra = divmod(partitions, len(ordered))
    return base + (1 if ordered.index(name) < extra else 0)


@dataclass(frozen=True, slots=True)
class LeasePlan:
    """What one heartbeat does: partitions to stop serving (then release), partitions to try
    to take."""

    drain: tuple[int, ...] = ()
    acquire: tuple[int, ...] = ()


def plan_leases(
    partitions: int, share: int, serving: Iterable[int], owners: Mapping[int, str | None], name: str
) -> LeasePlan:
    """Drain the highest partitions served beyond ``share``; or try as many free partitions
    (no owner in ``owners``) as are missing, in order from an offset drawn from ``name``."""
    served = sorted(serving)
    if len(served) > share:
        return LeasePlan(drain=tuple(served[share:]))
    missing = share - len(served)
    if not missing:
        return LeasePlan()
    start = zlib.crc32(name.encode()) % partitions
    order = [(start + i) % partitions for i in range(partitions)]
    free = [p for p in order if owners.get(p) is None]
    return LeasePlan(acquire=tuple(free[:missing]))


@dataclass
class PartitionLeases:
    """The partitions one coordinator serves, kept by :meth:`heartbeat`."""

    redis: Redis
    name: str
    partitions: int
    ttl_s: float = float(keys.partition_lease_ttl_s)
    on_released: Callable[[frozenset[int]], Awaitable[None]] | None = None
    """Called with the partitions this coordinator stopped holding (drained and released, or
    lost), once no loop works on them: the coordinator lets go of their tasks' leases."""
    clock: Callable[[], float] = time.monotonic
    members: tuple[str, ...] = ()
    """The live coordinators at the last heartbeat, in name order."""
    _valid_until: dict[int, float] = field(default_factory=dict, init=False)
    _draining: dict[int, tuple[int, float]] = field(default_factory=dict, init=False)
    _epoch: int = field(default=0, init=False)
    _seen: dict[str, int] = field(default_factory=dict, init=False)
    _last_beat: float | None = field(default=None, init=False)
    _short: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        self._members_script = self.redis.register_script(_MEMBERS)
        self._touch = self.redis.register_script(_TOUCH)
        self._release = self.redis.register_script(_RELEASE)

    @property
    def ttl_ms(self) -> int:
        return max(int(self.ttl_s * 1000), 1)

    def register(self, *loops: str) -> None:
        """Name the loops whose iterations a drained partition waits for."""
        for loop in loops:
            self._seen[loop] = self._epoch

    def serving(self, loop: str | None = None) -> frozenset[int]:
        """The partitions to work on now; ``loop`` (a registered loop starting an iteration)
        says so, which tells a drain that this loop is done with the partitions dropped."""
        if loop is not None:
            self._seen[loop] = self._epoch
        now = self.clock()
        return frozenset(p for p, until in self._valid_until.items() if until > now)

    @property
    def held(self) -> frozenset[int]:
        """Partitions whose lease this coordinator holds (served or draining)."""
        return frozenset(self._valid_until) | frozenset(self._draining)

    async def tick(self) -> None:
        """The membership looked at (one round trip); a heartbeat when it changed, when one
        is due (every third of the TTL) or while short of the share; else the drains whose
        loops have moved on released."""
        sent = self.clock()
        members = await self._members()
        due = self._last_beat is None or sent - self._last_beat >= self.ttl_s / 3
        if due or self._short or members != self.members:
            await self.heartbeat(members, sent)
        else:
            await self._finish_draining()

    async def heartbeat(self, members: tuple[str, ...] | None = None, sent: float = 0.0) -> None:
        """Membership (``members``: as just read), renewals, then drain or take partitions
        towards the fair share."""
        if members is None:
            sent = self.clock()
            members = await self._members()
        self._last_beat = sent
        self.members = members
        owners = await self._owners()
        lost = self._renewed(owners, sent)
        await self._finish_draining()
        if lost:
            await self._notify(lost)
        share = fair_share(self.partitions, self.members, self.name)
        plan = plan_leases(self.partitions, share, self._valid_until, owners, self.name)
        self._drain(plan.drain)
        if plan.acquire:
            await self._acquire(plan.acquire, sent)
        self._short = len(self._valid_until) < share

    async def leave(self) -> None:
        """Release every lease held and leave the members (a coordinator stopping): the
        others take its partitions at their next heartbeat instead of after the TTL."""
        held = self.held
        for p in sorted(held):
            await self._release(keys=[keys.partition_lease_key(p)], args=[self.name])
        await self._members_script(keys=[keys.coordinators_key], args=[self.name, self.ttl_ms, "1"])
        self._valid_until.clear()
        self._draining.clear()
        if held:
            log.info(
                "partitions.left", extra={"coordinator": self.name, "partitions": sorted(held)}
            )

    # -- steps ----------------------------------------------------------------------------

    async def _members(self) -> tuple[str, ...]:
        """This coordinator's membership renewed; the live members, in name order."""
        members = await self._members_script(
            keys=[keys.coordinators_key], args=[self.name, self.ttl_ms, "0"]
        )
        return tuple(sorted(_text(m) for m in members))

    async def _owners(self) -> dict[int, str | None]:
        """Every partition's lease holder, this coordinator's leases renewed on the way."""
        replies = await self._evalsha_all(
            self._touch,
            [keys.partition_lease_key(p) for p in range(self.partitions)],
            [self.name, str(self.ttl_ms)],
        )
        return {p: (None if r is None else _text(r)) for p, r in enumerate(replies)}

    def _renewed(self, owners: Mapping[int, str | None], sent: float) -> frozenset[int]:
        """Extend what was renewed; the leases found held by another or expired: lost."""
        lost = {p for p in self.held if owners.get(p) != self.name}
        for p in self._valid_until:
            self._valid_until[p] = sent + self.ttl_s
        for p in lost:
            self._valid_until.pop(p, None)
            self._draining.pop(p, None)
        if lost:
            self._epoch += 1
            log.warning(
                "partitions.lost",
                extra={"coordinator": self.name, "partitions": sorted(lost),
                       "holders": {p: owners.get(p) for p in sorted(lost)}},
            )  # fmt: skip
        return frozenset(lost)

    def _drain(self, partitions: Sequence[int]) -> None:
        if not partitions:
            return
        self._epoch += 1
        for p in partitions:
            self._valid_until.pop(p, None)
            self._draining[p] = (self._epoch, self.clock())
        log.info(
            "partitions.draining",
            extra={"coordinator": self.name, "partitions": list(partitions),
                   "members": len(self.members)},
        )  # fmt: skip

    async def _finish_draining(self) -> None:
        """Release the drained partitions no loop works on any more (or drained a TTL ago)."""
        now = self.clock()
        done = [
            p
            for p, (epoch, since) in self._draining.items()
            if all(seen >= epoch for seen in self._seen.values()) or now - since >= self.ttl_s
        ]
        if not done:
            return
        for p in done:
            del self._draining[p]
        await self._notify(frozenset(done))  # tasks first: the next holder may tick them at once
        for p in done:
            await self._release(keys=[keys.partition_lease_key(p)], args=[self.name])
        log.info("partitions.released", extra={"coordinator": self.name, "partitions": done})

    async def _acquire(self, partitions: Sequence[int], sent: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.set(keys.partition_lease_key(p), self.name, nx=True, px=self.ttl_ms)
        replies = await pipe.execute()
        taken = [p for p, ok in zip(partitions, replies, strict=True) if ok]
        for p in taken:
            self._valid_until[p] = sent + self.ttl_s
        if taken:
            log.info(
                "partitions.acquired",
                extra={"coordinator": self.name, "partitions": taken,
                       "held": len(self._valid_until), "members": len(self.members)},
            )  # fmt: skip

    async def _notify(self, partitions: frozenset[int]) -> None:
        if self.on_released is not None:
            await self.on_released(partitions)

    async def _evalsha_all(self, script: Any, script_keys: Sequence[str], args: list[str]) -> Any:
        """One script over each key, in one pipeline (loaded first if Redis lost it)."""
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for key in script_keys:
                pipe.evalsha(script.sha, 1, key, *args)
            replies = await pipe.execute(raise_on_error=False)
            if not any(isinstance(r, NoScriptError) for r in replies) or attempt:
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
                return replies
            await self.redis.script_load(script.script)
        raise AssertionError("unreachable")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
