"""The inbox's logins and login throttle on a real Redis: what they keep, and for how long."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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
    and a later one does not extend it; Retry-After is what is left of the window; a right
    credential is not counted."""
    throttle = LoginThrottle(store, max_failures=2, window_s=60)
    assert throttle.attempt("10.0.0.1", "ann", failed=True) is None
    keys_now = sorted(store.scan_iter(f"{keys.inbox_login_failures_key_prefix}*"))
    assert len(keys_now) == 2 and all(0 < store.ttl(k) <= 60 for k in keys_now)
    assert throttle.attempt("10.0.0.1", "ann", failed=False) is None
    for key in keys_now:
        store.expire(key, 5)  # most of the window gone
    assert throttle.attempt("10.0.0.2", "ann", failed=True) is None
    assert store.get(keys.inbox_login_failures_key("user", _sha256("ann"))) == "2"
    assert 0 < (throttle.attempt("10.0.0.3", "ann", failed=False) or 0) <= 5  # not restarted
    assert throttle.attempt("10.0.0.1", "ben", failed=False) is None  # one failure from there
    assert store.get(keys.inbox_login_failures_key("addr", _sha256("10.0.0.3"))) is None


def test_a_bearer_tokens_failures_count_for_the_address_only(store: redis.Redis) -> None:
    """A bearer token names nobody: its failures are not counted under a shared name, so one
    address guessing does not lock out the bearer clients elsewhere."""
    throttle = LoginThrottle(store, max_failures=2, window_s=60)
    for _ in range(2):
        assert throttle.attempt("10.0.0.1", None, failed=True) is None
    [key] = store.scan_iter(f"{keys.inbox_login_failures_key_prefix}*")
    assert key == keys.inbox_login_failures_key("addr", _sha256("10.0.0.1"))
    assert (throttle.attempt("10.0.0.1", None, failed=False) or 0) > 0
    assert throttle.attempt("10.0.0.2", None, failed=False) is None


def test_concurrent_failures_get_at_most_the_limit_of_answers(store: redis.Redis) -> None:
    """50 wrong credentials from one address, at once: exactly 10 are counted and answered; the
    other 40 are refused at the limit (the check and the count are one atomic script)."""
    throttle = LoginThrottle(store, max_failures=10, window_s=60)
    start = threading.Barrier(50)

    def guess(number: int) -> int | None:
        start.wait()
        return throttle.attempt("10.0.0.1", f"eve{number}", failed=True)

    with ThreadPoolExecutor(max_workers=50) as pool:
        waits = list(pool.map(guess, range(50)))
    assert waits.count(None) == 10
    assert all(0 < wait <= 60 for wait in waits if wait is not None)
    assert store.get(keys.inbox_login_failures_key("addr", _sha256("10.0.0.1"))) == "10"


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
