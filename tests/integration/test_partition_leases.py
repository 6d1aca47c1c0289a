"""Partition leases with real coordinator processes on 16 partitions: two, then three
coordinators share them fairly; one SIGKILLed mid-run has its partitions taken over, and its
in-flight tasks complete with nothing applied twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import OrgaClient
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.integration.harness import (
    Cluster,
    Process,
    _environment,
    assert_journal_is_clean,
    run_orga,
    started_redis,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

P = 16
LEASE_TTL_S = 2.0
ENV = {"ORGA_PARTITIONS": str(P), "ORGA_PARTITION_LEASE_TTL_S": str(LEASE_TTL_S)}


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = started_redis(tmp_path / "redis")
    yield server
    server.close()


def _task(index: int, iterations: int = 4) -> dict[str, Any]:
    """``iterations`` tool calls of 0.3 s each, then the answer ``finished-<index>``."""
    replies: list[Any] = [
        {"tool_calls": [{"name": "run_command",
                         "arguments": {"command": f"sleep 0.3; echo step-{i}"}}]}
        for i in range(iterations)
    ]  # fmt: skip
    return {
        "goal": f"leases task {index}",
        "provider": {"kind": "scripted", "replies": [*replies, f"finished-{index}"]},
        "steps": [{"id": "work", "instruction": "run the commands"}],
        "limits": {"max_iterations": iterations + 5},
        "stagnation": {"enabled": False},
    }


def _held(client: OrgaClient) -> dict[str, list[int]]:
    holders = client.partition_holders()
    return dict(holders["held"])


def _name_of(process: Process, held: dict[str, list[int]]) -> str:
    """A coordinator's name (``host-pid-suffix``) among the holders."""
    return next(name for name in held if f"-{process.pid}-" in name)


def _balanced(client: OrgaClient, count: int) -> bool:
    held = _held(client)
    shares = sorted(len(ps) for ps in held.values())
    fair = sorted([P // count + (1 if i < P % count else 0) for i in range(count)])
    return len(held) == count and shares == fair


def test_coordinators_share_16_partitions_and_take_over_a_killed_ones(
    fresh_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """1 -> 16 partitions; 2 -> 8/8; 3 -> 6/5/5, with `orga status` naming
    the holders. SIGKILL one while 24 tasks run: the survivors hold all 16 within the lease
    TTL (plus a heartbeat), every task completes once, with a gapless journal and no
    iteration applied twice."""
    cluster = Cluster(fresh_redis.url, tmp_path)
    client = OrgaClient(fresh_redis.url, partitions=P)
    try:
        cluster.worker(concurrency=4, **ENV)
        first = cluster.coordinator("c1", **ENV)
        wait_until(lambda: _balanced(client, 1), 20, "one coordinator holding all 16")
        second = cluster.coordinator("c2", **ENV)
        wait_until(lambda: _balanced(client, 2), 30, "8/8 with two coordinators")
        third = cluster.coordinator("c3", **ENV)
        wait_until(lambda: _balanced(client, 3), 30, "6/5/5 with three coordinators")
        status = run_orga("status", env=_environment(fresh_redis.url, cluster.workspaces, ENV))
        assert status.returncode == 0, status.stderr
        shown = next(line for line in status.stdout.splitlines() if line.startswith("partitions:"))
        for process in (first, second, third):
            assert f"-{process.pid}-" in shown, shown

        task_ids = [client.submit(_task(n), task_id=f"lease-{n}") for n in range(24)]
        victim = third
        victim_name = _name_of(victim, _held(client))
        victim_partitions = set(_held(client)[victim_name])
        hit = [t for t in task_ids if keys.partition_of(t, P) in victim_partitions]
        assert hit, "no task landed in the victim's partitions"
        wait_until(
            lambda: any(_status(client, t) == "running" for t in hit), 30, "the victim's tasks"
        )
        victim.kill()
        killed_at = time.monotonic()
        wait_until(lambda: _balanced(client, 2), 30, "the survivors holding all 16")
        takeover_s = time.monotonic() - killed_at
        print(f"RESULT partition_takeover_s_ttl_{LEASE_TTL_S:g} {takeover_s:.2f}")
        assert takeover_s < LEASE_TTL_S * 2 + 2, takeover_s

        for task_id in task_ids:
            result = client.wait(task_id, timeout_s=120)
            assert result["status"] == "completed", cluster.logs()
            assert_journal_is_clean(client.journal(task_id))
            started = [e for e in client.journal(task_id) if e.event.type == "Started"]
            assert len(started) == 1, task_id
        accepted = [f["task_id"] for _i, f in client.events() if f.get("event") == "accepted"]
        assert sorted(accepted) == sorted(task_ids)  # each task created and started once
    finally:
        cluster.stop()
        client.close()


def _status(client: OrgaClient, task_id: str) -> str | None:
    try:
        return str(client.status(task_id)["status"])
    except Exception:  # still on the intake
        return None
