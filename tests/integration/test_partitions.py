"""Partitions with real processes: the bugfix example (and tasks beside it) on 1 and on 16
partitions, the deployment-wide views merging them, and a coordinator refusing another count
or a Redis still holding the layout before partitions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator.client import OrgaClient
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.integration.harness import (
    REPO,
    Cluster,
    _environment,
    run_orga,
    running_cluster,
    started_redis,
)

pytestmark = pytest.mark.integration

BUGFIX = REPO / "examples" / "bugfix" / "task.yaml"


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = started_redis(tmp_path / "redis")
    yield server
    server.close()


@pytest.mark.parametrize("partitions", [1, 16])
def test_the_bugfix_example_completes_on_every_partition_count(
    fresh_redis: EmbeddedRedis, tmp_path: Path, partitions: int
) -> None:
    env = {"ORGA_PARTITIONS": str(partitions)}
    with running_cluster(fresh_redis.url, tmp_path, env, env) as cluster:
        client = OrgaClient(fresh_redis.url, partitions=partitions)
        task_ids = [client.submit(BUGFIX, task_id=f"bugfix-{n}") for n in range(6)]
        for task_id in task_ids:
            result = client.wait(task_id, timeout_s=120)
            assert result["status"] == "completed", cluster.logs()
            assert result["milestones"] == ["step:reproduce", "step:fix", "step:verify"]
        used = {keys.partition_of(t, partitions) for t in task_ids}
        assert len(used) == min(partitions, 6) or (partitions == 16 and len(used) > 1)
        _assert_every_key_tagged(fresh_redis.url, used)
        listed = {row["task_id"]: row["status"] for row in client.list_tasks(limit=100)}
        assert {t: listed.get(t) for t in task_ids} == dict.fromkeys(task_ids, "completed")
        status = run_orga("status", env=_environment(fresh_redis.url, cluster.workspaces, env))
        assert status.returncode == 0, status.stderr
        assert all(t in status.stdout for t in task_ids), status.stdout
        events = {f["task_id"] for _i, f in client.events() if f.get("event") == "completed"}
        assert set(task_ids) <= events


def _assert_every_key_tagged(url: str, used: set[int]) -> None:
    """Every key of the tasks and of their commits is in a partition (no unpartitioned
    ``orga:task:...``, ``orga:intake`` or ``orga:tasks:active`` left), in the tasks' own."""
    with redis.Redis.from_url(url, decode_responses=True) as plain:
        names = list(plain.scan_iter("orga:*"))
    tag = re.compile(r"^orga:\{p:(\d+)\}:")
    tagged = {int(m.group(1)) for n in names if (m := tag.match(n))}
    assert used <= tagged
    for name in names:
        if name.startswith(("orga:task", "orga:journal", "orga:conversation", "orga:lease")):
            raise AssertionError(f"{name} carries no partition tag")
    assert not {"orga:intake", "orga:observations", "orga:tasks:active", "orga:outbox"} & set(names)


def test_a_coordinator_refuses_another_count_and_an_unpartitioned_redis(
    fresh_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    cluster = Cluster(fresh_redis.url, tmp_path)
    env = _environment(fresh_redis.url, cluster.workspaces, {"ORGA_PARTITIONS": "16"})
    with redis.Redis.from_url(fresh_redis.url) as plain:
        plain.set(keys.partitions_key, 4)
        refused = run_orga("coordinator", env=env, timeout_s=60)
        assert refused.returncode == 1, refused.stderr
        assert "ORGA_PARTITIONS=16" in refused.stderr
        assert "created with 4 partitions" in refused.stderr

        plain.delete(keys.partitions_key)
        plain.sadd(keys.legacy_active_tasks_key, "old-task")
        refused = run_orga("coordinator", env=env, timeout_s=60)
        assert refused.returncode == 1, refused.stderr
        assert "orga:tasks:active" in refused.stderr
        assert "drain" in refused.stderr.lower()
