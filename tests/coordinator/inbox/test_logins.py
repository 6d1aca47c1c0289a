"""The inbox's logins and login throttle on a real Redis: what they keep, and for how long."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis

from coordinator.inbox.sessions import ReviewerSessions
from coordinator.inbox.throttle import LoginThrottle
from shared import keys


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture
def store(redis_url: str) -> Iterator[redis.Redis]:
    """A client on a flushed real Redis, answering strings."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


def test_failures_are_counted_in_a_fixed_window_per_address_and_per_name(
    store: redis.Redis,
) -> None:
    """Each failure counts for its address and its name; the window starts at the first failure
    and a later one does not extend it; Retry-After is what is left of the window."""
    throttle = LoginThrottle(store, max_failures=2, window_s=60)
    throttle.failed("10.0.0.1", "ann")
    keys_now = sorted(store.scan_iter(f"{keys.inbox_login_failures_key_prefix}*"))
    assert len(keys_now) == 2 and all(0 < store.ttl(k) <= 60 for k in keys_now)
    assert throttle.retry_after_s("10.0.0.1", "ann") is None
    for key in keys_now:
        store.expire(key, 5)  # most of the window gone
    throttle.failed("10.0.0.2", "ann")
    assert store.get(keys.inbox_login_failures_key("user", _sha256("ann"))) == "2"
    assert 0 < (throttle.retry_after_s("10.0.0.3", "ann") or 0) <= 5  # not restarted at 60
    assert throttle.retry_after_s("10.0.0.1", "ben") is None  # one failure from that address


def test_a_login_is_kept_hashed_for_its_lifetime_and_ended_by_logout(store: redis.Redis) -> None:
    """A login is stored under a hash of its id (the id is in no key), for 14 days; ending it
    deletes it, and an empty or unknown id opens nothing."""
    sessions = ReviewerSessions(store)
    session_id = sessions.start("jane.doe")
    [key] = store.scan_iter(f"{keys.inbox_session_key_prefix}*")
    assert session_id not in key
    assert store.get(key) == "jane.doe"
    assert keys.inbox_session_ttl_s - 5 < store.ttl(key) <= keys.inbox_session_ttl_s
    assert sessions.reviewer(session_id) == "jane.doe"
    assert sessions.reviewer("") is None and sessions.reviewer("forged") is None
    sessions.end(session_id)
    assert sessions.reviewer(session_id) is None
    assert not list(store.scan_iter(f"{keys.inbox_session_key_prefix}*"))
