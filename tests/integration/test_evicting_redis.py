"""`orga coordinator` and `orga worker`, started on a real Redis that evicts keys, refuse to run:
they exit non-zero saying the policy, the setting and the fix, before serving anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.harness import (
    clean_env,
    run_orga,
)
from tests.redis_server import RedisServer


@pytest.mark.parametrize(
    "command",
    [("coordinator",), ("worker", "--role", "tools", "-c", "1")],
    ids=["coordinator", "worker"],
)
def test_a_process_started_on_an_evicting_redis_exits_naming_the_fix(
    redis_server_factory: Callable[..., RedisServer], tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Under allkeys-lru the process exits 1 with the refusal (the value, the setting, the fix)."""
    server = redis_server_factory(options=("--maxmemory-policy", "allkeys-lru"))
    env = clean_env()
    env.update(ORGA_REDIS_URL=server.url, ORGA_WORKSPACE_ROOT=str(tmp_path))
    ran = run_orga(*command, env=env, timeout_s=60)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 1, output
    assert f"the Redis at 127.0.0.1:{server.port}/0 has maxmemory-policy allkeys-lru" in output
    assert "set `maxmemory-policy noeviction` on that Redis" in output
