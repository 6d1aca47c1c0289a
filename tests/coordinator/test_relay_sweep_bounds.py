"""Review of the relay hop (branch ``relayhop``): a sweep of the commits' outbox that holds more
than one batch. The docs promise that a relay removes what it sent at most
``keys.commit_outbox_flush_s`` later (so a relay killed leaves at most that much to be sent
again), and the partition lease keeps a second relay off an outbox."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from coordinator.relay import OutboxRelay
from shared import keys
from shared.outbox import OutboxEntry
from tests.coordinator.outbox_samples import sample_entry


class _SlowBroker:
    """A publisher whose every send takes ``delay_s`` (a slow broker, blocking as kombu's
    producer does); records, at each send, the ids then still on the commits' outbox."""

    def __init__(self, url: str, delay_s: float, on_send: Any = None) -> None:
        self.sent: list[OutboxEntry] = []
        self.on_stream: list[set[int]] = []
        self.sent_at: list[float] = []
        self.delay_s = delay_s
        self.on_send = on_send
        self._redis = redis.Redis.from_url(url)

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        for entry in entries:
            time.sleep(self.delay_s)
            rows: Any = self._redis.xrange(keys.commit_outbox_stream(0))
            self.on_stream.append({int(json.loads(f[b"payload"])["n"]) for _i, f in rows})
            self.sent.append(entry)
            self.sent_at.append(time.monotonic())
            if self.on_send is not None:
                self.on_send(len(self.sent))


async def _backlog(client: Any, count: int) -> None:
    for n in range(count):
        await client.xadd(keys.commit_outbox_stream(0), sample_entry(n).fields())


def test_a_long_sweep_removes_what_it_sent_within_the_flush_bound(
    redis_url: str, redis_client: Any
) -> None:
    """A takeover sweep of a backlog (a broker outage's, a dead coordinator's) sends it batch
    after batch: an entry sent more than ``flush_s`` ago is no longer on the outbox when a
    later one is sent, so a relay killed during the sweep leaves at most ``flush_s`` of it to
    be sent twice (as the old relay's removal per batch did, and as keys.py, protocol.md and
    performance.md say)."""

    async def scenario() -> None:
        async with redis_client() as client:
            await _backlog(client, 6)
            broker = _SlowBroker(redis_url, delay_s=0.1)
            relay = OutboxRelay(client, broker, "r1", batch=2, loop_chunk=1, flush_s=0.25)
            assert await relay.commits_round() == 6
            _assert_removed_within_flush_s(broker, relay)
            await relay.close()

    asyncio.run(scenario())


def test_a_sweep_stops_sending_a_partition_whose_lease_was_lost(
    redis_url: str, redis_client: Any
) -> None:
    """A relay that loses a partition during a long sweep stops sending its entries at the
    next batch (its new holder sweeps them too: every one sent after the loss is a second
    copy); before the relay hop a relay asked which partitions it served at every read of
    ``batch`` entries."""

    async def scenario() -> None:
        async with redis_client() as client:
            await _backlog(client, 8)
            served = {0}

            def lose_after_two(count: int) -> None:
                if count == 2:
                    served.clear()  # the lease lapsed; another coordinator holds it now

            broker = _SlowBroker(redis_url, delay_s=0.0, on_send=lose_after_two)
            relay = OutboxRelay(
                client, broker, "r1", batch=2, loop_chunk=1, serving=lambda _loop: served
            )
            await relay.commits_round()
            assert len(broker.sent) <= 2 + relay.batch, (
                f"{len(broker.sent)} of 8 entries sent though the partition was lost after "
                "the second"
            )
            await relay.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("in_thread", [False, True], ids=["on-the-loop", "in-its-thread"])
def test_a_burst_of_hand_offs_is_removed_within_the_flush_bound(
    redis_url: str, redis_client: Any, in_thread: bool
) -> None:
    """The steady state's promise too: hand-offs that queue up behind a slow broker (a burst
    of commits) are removed at most ``flush_s`` after they were sent, not only once the whole
    queue (up to ``max_handed``, 10,000) has gone out. The same with ``in_thread`` (the send
    in the relay's own thread), at the same granularity (``loop_chunk`` entries, 1 here): a
    chunk's sends are noted once the whole chunk went out, so a chunk of ``batch`` (64), as
    the thread sent before, kept the first entries on the outbox however long past
    ``flush_s``."""

    async def scenario() -> None:
        async with redis_client() as client:
            broker = _SlowBroker(redis_url, delay_s=0.1)
            relay = OutboxRelay(
                client, broker, "r1", in_thread=in_thread, loop_chunk=1, flush_s=0.25
            )
            assert await relay.commits_round() == 0  # the first round's sweep: empty
            for n in range(6):  # six commits, handed before the relay's next round
                entry = sample_entry(n)
                entry_id = await client.xadd(keys.commit_outbox_stream(0), entry.fields())
                relay.hand(0, [(entry_id.decode(), entry)])
            assert await relay.commits_round() == 6
            _assert_removed_within_flush_s(broker, relay)
            await relay.close()

    asyncio.run(scenario())


def _assert_removed_within_flush_s(broker: _SlowBroker, relay: OutboxRelay) -> None:
    """Entry 0, sent more than ``flush_s`` before entry 5, was off the outbox when 5 went out."""
    waited = broker.sent_at[5] - broker.sent_at[0]
    assert waited > relay.flush_s
    still = broker.on_stream[5]
    assert 0 not in still, (
        f"entry 0, sent {waited:.2f} s before entry 5, was still on the commits' "
        f"outbox then (on it: {sorted(still)}): a relay killed there sends it again"
    )
