"""Coordinator control entries on a real Redis: a decision's reviewer is a name, not free text."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.state import ReviewerError, check_reviewer
from shared import keys
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)


@pytest.mark.parametrize(
    "by", ["deadline", "Deadline", "system", "coordinator", "", "a b", "x" * 65]
)
def test_reserved_and_malformed_reviewer_names_are_refused(by: str) -> None:
    """The runtime's own names (any case), empty, spaced and over-long names are refused."""
    with pytest.raises(ReviewerError, match=r"reserved|is not valid"):
        check_reviewer(by)


@pytest.mark.parametrize(
    "by", ["alice", "bob.smith", "ops@example.org", "cli", "u-1_2", "inbox:alice"]
)
def test_a_person_or_account_name_is_a_reviewer(by: str) -> None:
    """User names, e-mail addresses and the CLI's fallback are accepted as they are."""
    assert check_reviewer(by) == by


def test_a_control_entry_deciding_as_the_deadline_is_rejected(
    redis_client: RedisClientFactory,
) -> None:
    """A decision sent straight to orga:control with ``by=deadline`` is a ``control_rejected``
    event naming the reserved name, and is acknowledged."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(client, settings=SETTINGS, name="c")
            await coordinator._ensure_groups()
            await client.xadd(
                keys.control_stream(0),
                {"action": "review", "task_id": "t", "review_id": "r", "decision": "abort",
                 "by": "deadline"},
            )  # fmt: skip
            await coordinator._control_once()
            (event,) = [f for _i, f in await client.xrange(keys.events_stream(0))]
            assert event["event"] == "control_rejected"
            assert "reviewer name 'deadline' is reserved" in event["error"]
            summary = await client.xpending(keys.control_stream(0), keys.coordinator_group)
            assert summary["pending"] == 0

    asyncio.run(scenario())
