"""Well-formed but wrong observations are counted, logged at most once a minute per task and
reason, and written as ``observation_refused`` events (issue 12, item 16); late or duplicate
answers to real dispatches stay silent."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from coordinator.logs import RateGate
from coordinator.machine import MachineSettings
from coordinator.metrics import CoordinatorMetrics
from coordinator.service import Coordinator, CoordinatorSettings
from shared import keys
from shared.protocol import Fence, ReasonedMessage, encode_entry
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)
TASK = json.dumps({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})


def test_the_rate_gate_lets_one_through_per_key_and_interval() -> None:
    """One event per key per interval goes through, reporting how many were held back."""
    gate = RateGate(interval_s=60.0)
    assert gate.admit("a", 0.0) == 0
    assert [gate.admit("a", t) for t in (1.0, 2.0, 59.0)] == [None, None, None]
    assert gate.admit("b", 1.0) == 0
    assert gate.admit("a", 60.0) == 3
    assert gate.admit("a", 61.0) is None


def test_the_rate_gate_stays_bounded() -> None:
    """A flood of distinct keys never holds more than ``max_keys`` of them."""
    gate = RateGate(interval_s=60.0, max_keys=100)
    for i in range(1_000):
        gate.admit(f"k{i}", 0.0)
    assert len(gate._seen) <= 100


def test_wrong_observations_are_counted_logged_and_recorded(
    redis_client: RedisClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Unknown task, unknown step, an attempt never dispatched and the awaited fence with a
    forged nonce each give one event and one log line with the reason (fifty forgeries: one
    line, fifty counted); a stale answer to an earlier attempt gives none."""
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(
                client, settings=SETTINGS, name="c", metrics=CoordinatorMetrics(registry)
            )
            await coordinator._ensure_groups()
            await client.xadd(keys.intake_stream(0), {"task_id": "t", "task": TASK})
            await coordinator._intake_once()
            record = await coordinator.store.load("t")
            assert record is not None and record.awaiting is not None
            awaited = record.awaiting.fence
            forged = awaited.model_copy(update={"nonce": "f0f0f0f0f0f0"})
            wrong = [
                Fence(task_id="ghost", step_id="s", iteration=0, attempt=1),
                awaited.model_copy(update={"step_id": "elsewhere"}),
                awaited.model_copy(update={"attempt": 99}),
                *[forged] * 50,
                awaited.model_copy(update={"attempt": 0}),  # an earlier dispatch: stale only
            ]
            for fence in wrong:
                message = ReasonedMessage(fence=fence, terminal_output="hijacked")
                await _send(client, message)
            for _ in range(3):
                await coordinator._observations_once()
            events = [
                f
                for _i, f in await client.xrange(keys.events_stream(0))
                if f["event"] == "observation_refused"
            ]
            reasons = sorted((e["task_id"], e["reason"]) for e in events)
            assert reasons == [
                ("ghost", "unknown_task"),
                ("t", "never_dispatched"),
                ("t", "nonce_mismatch"),
                ("t", "unknown_step"),
            ]
            still = await coordinator.store.load("t")
            assert still is not None and still.output == "" and still.version == record.version
            stream = keys.observations_stream(0)
            assert await client.xlen(stream) == 0  # deleted, each delivery left to a claim
            coordinator.settings = replace(SETTINGS, claim_idle_ms=0)  # a claim past the idle
            await coordinator._reclaim(stream, coordinator._observation)
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0
            again = await coordinator.store.load("t")
            assert again is not None and again.version == record.version

    with caplog.at_level(logging.WARNING, logger="orga.coordinator"):
        asyncio.run(scenario())
    lines = [r for r in caplog.records if r.getMessage() == "observation.refused"]
    assert len(lines) == 4
    assert (
        registry.get_sample_value("orga_observations_refused_total", {"reason": "nonce_mismatch"})
        == 50.0
    )
    assert (
        registry.get_sample_value("orga_observations_refused_total", {"reason": "unknown_task"})
        == 1.0
    )


async def _send(client: Redis, message: ReasonedMessage) -> None:
    await client.xadd(keys.observations_stream(0), encode_entry(message))
