"""Integration fixtures: one private Redis per test module, real worker and coordinator
processes (see ``harness.py``); for the Redis Cluster tests (``test_cluster.py``,
``test_cluster_reshard.py``) a private cluster and a standalone broker Redis per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import PARTITIONS, Cluster, running_cluster, started_redis
from tests.redis_cluster import RedisCluster, started_or_required


@pytest.fixture(scope="module")
def partitions(request: pytest.FixtureRequest) -> int:
    """The partition count of the module's Redis and cluster: the suite's
    (``ORGA_TEST_PARTITIONS``), or the one a test marked ``on_16_partitions`` runs on."""
    count = getattr(request, "param", None)  # None: the suite's (the key unmarked tests share)
    return PARTITIONS if count is None else int(count)


@pytest.fixture(scope="module")
def private_redis(
    partitions: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedRedis]:
    """A real redis-server for this module (AOF on, so a restart keeps the data); one per
    partition count (a Redis keeps the count it was first used with)."""
    server = started_redis(tmp_path_factory.mktemp(f"redis-{partitions}p"), appendonly=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def cluster(
    private_redis: EmbeddedRedis, partitions: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One worker (3 processes) and one coordinator on ``partitions``, shared by the tests of a
    module."""
    root = tmp_path_factory.mktemp(f"cluster-{partitions}p")
    with running_cluster(private_redis.url, root, partitions=partitions) as running:
        yield running


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """A private Redis Cluster (3 masters, 3 replicas; :mod:`tests.redis_cluster`) for this
    module; skipped (or failed under CI) where redis-server cannot make one."""
    cluster = started_or_required(RedisCluster())
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A private standalone Redis for Celery's broker (Celery cannot use a cluster)."""
    server = started_redis(tmp_path_factory.mktemp("broker"))
    yield server
    server.close()
