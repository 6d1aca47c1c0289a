"""A worker stores the deployment's partition count or refuses another one (real Redis)."""

from __future__ import annotations

import pytest
import redis

from shared import keys
from shared.errors import ConfigError
from workers.redis_policy import check_worker_partitions


def test_a_worker_stores_the_count_then_refuses_another(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as plain:
        plain.flushdb()
        assert check_worker_partitions(redis_url, 8) == 8
        assert plain.get(keys.partitions_key) == b"8"
        assert check_worker_partitions(redis_url, 8) == 8
        with pytest.raises(ConfigError, match=r"this worker .*ORGA_PARTITIONS=2 .* created with 8"):
            check_worker_partitions(redis_url, 2)
        assert plain.get(keys.partitions_key) == b"8"
