"""Review of branch ``actset`` (the deadline index as the active tasks): defects found, each
stated as a test that fails on the branch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]


def test_the_no_active_set_test_holds_after_an_earlier_tests_sadd(
    redis_url: str, redis_client: Any
) -> None:
    """``test_store.py::test_a_commit_writes_no_active_set_and_the_start_deletes_no_conversation``
    asserts ``cmdstat_sadd`` / ``cmdstat_srem`` are 0 without resetting the stats (and without
    a before/after delta, as the test it replaced did). The real-Redis fixtures share one
    server per session and only ``FLUSHDB`` it, which does not reset ``INFO commandstats``: any
    ``SADD`` or ``SREM`` run earlier in the session fails it. ``make test`` runs
    ``tests/coordinator/test_dispatch.py`` (``SADD orga:tasks:active``) and others before it:
    ``pytest tests/coordinator/test_[a-s]*.py`` fails it with ``(2, 0) == (0, 0)``. Here, one
    ``SADD`` of an unrelated key stands for that earlier test."""
    from tests.coordinator import test_store

    with redis.Redis.from_url(redis_url) as client:
        client.sadd("some-other-test:set", "x")  # an earlier test's write, in the same session
    test_store.test_a_commit_writes_no_active_set_and_the_start_deletes_no_conversation(
        redis_url, redis_client
    )


def test_the_docs_name_only_coordinator_tests_that_exist() -> None:
    """docs/performance.md cites
    ``tests/coordinator/test_store.py::test_the_active_set_is_written_only_when_the_status_changes``
    twice (the section on the active set's ``SADD``, and the observations' deletion's tests);
    the branch renamed that test, so both citations name a test that no longer exists (on
    ``main`` every ``tests/coordinator/...::test_...`` the docs cite exists)."""
    missing = []
    for md in sorted((ROOT / "docs").glob("*.md")):
        for found in re.finditer(r"(tests/coordinator/[\w/]+\.py)::(\w+)", md.read_text()):
            path, name = ROOT / found.group(1), found.group(2)
            if not path.exists() or not re.search(rf"def {name}\b", path.read_text()):
                missing.append(f"{md.name}: {found.group(0)}")
    assert missing == []
