"""The parity suite's fixtures: both drivers, and the servers their scenarios share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.fakes.opa_server import FakeOpaServer
from tests.integration.conftest import partitions, private_redis
from tests.integration.harness import Cluster
from tests.parity.drivers import DistributedLoop, InProcessLoop, LoopDriver

__all__ = ["cluster", "driver", "opa", "partitions", "private_redis", "reference"]


@pytest.fixture(scope="module")
def cluster(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One Celery worker process and one coordinator process for the whole suite."""
    running = Cluster(private_redis.url, tmp_path_factory.mktemp("cluster"))
    try:
        running.worker()
        running.coordinator()
        yield running
    finally:
        running.stop()


@pytest.fixture(
    params=[
        pytest.param("inprocess"),
        pytest.param("distributed", marks=[pytest.mark.integration, pytest.mark.redis]),
    ]
)
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> LoopDriver:
    """Each driver of the loop in turn (the distributed one starts the module's cluster)."""
    if request.param == "inprocess":
        return InProcessLoop(tmp_path / "inprocess")
    return DistributedLoop(request.getfixturevalue("cluster"))


@pytest.fixture
def reference(tmp_path: Path) -> LoopDriver:
    """The in-process driver, whose run every driver's run must equal."""
    return InProcessLoop(tmp_path / "reference")


@pytest.fixture(scope="module")
def opa() -> Iterator[FakeOpaServer]:
    """A local OPA server (127.0.0.1) that both drivers' gates query."""
    with FakeOpaServer() as server:
        yield server
