"""The state's clients on a Redis Cluster (a real one: 3 masters, 3 replicas, started by
:mod:`tests.redis_cluster`): the factory, a cluster refused without a broker, the per-partition
stream reads, the eviction check of every node, the workers' publish split per slot, and one
commit per slot; plus the schedules' keys renamed under their hash tag on a standalone Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import cast

import fakeredis
import pytest
import redis
import redis.cluster
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException

from coordinator.schedules import adopt_legacy_schedules
from coordinator.service import check_redis_keeps_keys
from coordinator.streams import parse_release, read_group, redis_version
from orga.redis_client import RedisClients
from shared import keys
from shared.errors import ConfigError
from shared.eviction import EvictingRedisError
from shared.settings import OrgaSettings, celery_broker_url
from tests.redis_cluster import RedisCluster, started_or_required
from workers.redis_policy import check_redis_keeps_keys as worker_check

PARTITIONS = 16


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    running = started_or_required(RedisCluster())
    try:
        yield running
    finally:
        running.close()


def test_a_cluster_needs_a_broker_of_its_own() -> None:
    """Celery cannot use a Redis Cluster as its broker: refused, naming the fix."""
    on_cluster = OrgaSettings(redis_url="redis://n1:7000/0", redis_cluster=True)
    with pytest.raises(ConfigError, match="ORGA_REDIS_CLUSTER=true needs ORGA_BROKER_URL"):
        celery_broker_url(on_cluster)
    with pytest.raises(ConfigError, match="ORGA_BROKER_URL"):
        RedisClients.from_settings(on_cluster)
    brokered = on_cluster.model_copy(update={"broker_url": "amqp://rabbit//"})
    assert celery_broker_url(brokered) == "amqp://rabbit//"
    assert RedisClients.from_settings(brokered) == RedisClients("redis://n1:7000/0", True)
    standalone = OrgaSettings(redis_url="redis://r:6379/0")
    assert celery_broker_url(standalone) == "redis://r:6379/0"  # the default stays
    assert RedisClients.from_settings(standalone) == RedisClients("redis://r:6379/0", False)


def test_the_factory_builds_cluster_clients(cluster: RedisCluster) -> None:
    clients = RedisClients(cluster.url, cluster=True)
    sync = clients.sync(decode_responses=True)
    try:
        assert isinstance(sync, redis.cluster.RedisCluster)
        for p in range(PARTITIONS):  # every partition's keys, wherever their slot is
            sync.set(keys.status_counts_key(p) + ":probe", p)
        assert [int(sync.get(keys.status_counts_key(p) + ":probe")) for p in range(4)] == [
            0,
            1,
            2,
            3,
        ]
    finally:
        sync.close()
    down_first = RedisClients(f"redis://127.0.0.1:1/0,{cluster.urls}", cluster=True)
    with down_first.sync(decode_responses=True) as reached:  # a node down: the next is asked
        assert reached.get(keys.status_counts_key(0) + ":probe") == "0"
    assert isinstance(clients.asyncio(), AsyncRedisCluster)
    assert not isinstance(RedisClients(cluster.url).asyncio(), AsyncRedisCluster)


def test_reads_and_checks_go_to_each_partition_and_node(cluster: RedisCluster) -> None:
    """One XREADGROUP over several partitions is refused by the cluster; read_group reads each
    partition's stream apart and returns every entry; the eviction check asks every node."""

    async def scenario() -> None:
        client: Redis = RedisClients(cluster.url, cluster=True).asyncio()
        try:
            streams = [keys.observations_stream(p) for p in range(PARTITIONS)]
            for stream in streams:
                await client.xgroup_create(stream, "g", id="0", mkstream=True)
                await client.xadd(stream, {"from": stream})
            with pytest.raises(RedisClusterException):
                await client.xreadgroup("g", "c", dict.fromkeys(streams, ">"), count=10)
            rows = await read_group(client, "g", "c", streams, count=10, block_ms=100)
            assert sorted(stream for stream, _entries in rows) == sorted(streams)
            assert all(len(entries) == 1 for _stream, entries in rows)
            pending = await read_group(client, "g", "c", streams, start="0", count=10)
            assert len(pending) == PARTITIONS  # not acknowledged: this consumer's own
            assert await read_group(client, "g", "c", streams, count=10, block_ms=50) == []
            assert await check_redis_keeps_keys(client) == "noeviction"
            version = await redis_version(client)  # the lowest of the primaries'
            assert version is not None and parse_release(version) is not None
            primaries = cast(AsyncRedisCluster, client).get_primaries()
            said = [
                (await client.info("server", target_nodes=n))["redis_version"] for n in primaries
            ]
            assert version in said
        finally:
            await client.aclose()

    asyncio.run(scenario())


def _a_replica_the_clients_see(clients: RedisClients, timeout_s: float = 20.0) -> int:
    """The port of a replica in the topology a new client reads (a replica just started is
    listed once it has joined its master)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with clients.sync() as client:
            nodes = client.get_nodes()  # type: ignore[no-untyped-call]
        replicas = [node.port for node in nodes if node.server_type == "replica"]
        if replicas:
            return int(replicas[0])
        assert time.monotonic() < deadline, f"no replica in the topology: {nodes}"
        time.sleep(0.2)


def test_one_evicting_node_that_is_not_the_default_is_refused_by_both_checks(
    cluster: RedisCluster,
) -> None:
    """A replica (never the node a plain CONFIG GET goes to) set to allkeys-lru: the
    coordinator's and the worker's checks each ask every node and refuse, naming that node by
    host:port (not the URL, which may hold a password)."""
    clients = RedisClients(cluster.url, cluster=True)
    replica = _a_replica_the_clients_see(clients)

    async def coordinator_check() -> str:
        client: Redis = clients.asyncio()
        try:
            return await check_redis_keeps_keys(client)
        finally:
            await client.aclose()

    with redis.Redis(port=replica) as node:
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            refusals = []
            for check in (lambda: asyncio.run(coordinator_check()),
                          lambda: worker_check(cluster.url, clients.sync)):  # fmt: skip
                with pytest.raises(EvictingRedisError) as refused:
                    check()
                refusals.append(str(refused.value))
        finally:
            node.config_set("maxmemory-policy", "noeviction")
    for said in refusals:
        assert "allkeys-lru" in said and f":{replica}" in said and "redis://" not in said
    assert worker_check(cluster.url, clients.sync) == "noeviction"


def test_a_transaction_stays_in_one_slot(cluster: RedisCluster) -> None:
    """A partition's MULTI (its streams, one hash tag) goes through; one that adds a key of no
    partition (the heartbeats) is refused before it is sent: the workers' publish is split."""

    async def scenario() -> None:
        client: Redis = RedisClients(cluster.url, cluster=True).asyncio()
        try:
            pipe = client.pipeline(transaction=True)
            pipe.xadd(keys.observations_stream(3), {"a": "1"})
            pipe.xadd(keys.outbox_stream(3), {"b": "2"})
            assert len(await pipe.execute()) == 2
            crossing = client.pipeline(transaction=True)
            crossing.xadd(keys.observations_stream(3), {"a": "1"})
            crossing.zadd(keys.heartbeats_key, {"x": 1.0})
            with pytest.raises(RedisClusterException, match="same slot"):
                await crossing.execute()
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_schedules_of_a_deployment_before_the_hash_tag_are_renamed() -> None:
    """A coordinator renames ``orga:schedules`` and the others under ``{schedules}``, once,
    never over a key of the new name."""

    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis()
        await client.hset("orga:schedules", "nightly", "{}")
        await client.zadd("orga:schedules:due", {"nightly": 1.0})
        await client.hset(keys.schedule_fires_key, "nightly", "new")
        await client.hset("orga:schedules:fired", "nightly", "old")
        assert await adopt_legacy_schedules(client) == 2
        assert await client.hget(keys.schedules_key, "nightly") == b"{}"
        assert await client.zscore(keys.schedules_due_key, "nightly") == 1.0
        assert await client.hget(keys.schedule_fires_key, "nightly") == b"new"
        assert await adopt_legacy_schedules(client) == 0

    asyncio.run(scenario())


def test_a_password_holding_a_comma_is_not_split_into_nodes() -> None:
    """The URL is split into nodes only where another node begins (a URL, or a bare
    host:port), never at a comma inside a password."""
    clients = RedisClients("redis://:se,cret@n1:7000/0,rediss://n2:7001/0, n3:7002", True)
    assert clients._nodes() == ("redis://:se,cret@n1:7000/0", [("n2", 7001), ("n3", 7002)])
    assert RedisClients("redis://:a,b:c@n1:7000/0", True)._nodes() == (
        "redis://:a,b:c@n1:7000/0",
        [],
    )
