"""Integration fixtures: one private Redis per test module, real worker and coordinator
processes (see ``harness.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import Cluster, running_cluster, started_redis


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A real redis-server for this module (AOF on, so a restart keeps the data)."""
    server = started_redis(tmp_path_factory.mktemp("redis"), appendonly=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def cluster(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One worker (3 processes) and one coordinator, shared by the tests of a module."""
    with running_cluster(private_redis.url, tmp_path_factory.mktemp("cluster")) as running:
        yield running
