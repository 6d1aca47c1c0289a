"""Partitions: a stable partition per task id, every partitioned key tagged, a mismatch refused."""

from __future__ import annotations

import re

import pytest

from shared import keys
from shared.errors import ConfigError
from shared.partitions import check_partitions


def test_partition_of_is_crc32_of_the_root_id_and_fixed() -> None:
    # Known values: a change of hash would move every stored task to another partition.
    assert [keys.partition_of(t, 16) for t in ("t1", "task-1", "0", "a.b.c")] == [7, 15, 1, 3]
    assert keys.partition_of("anything", 1) == 0
    assert keys.idempotency_partition("schedule:nightly:2026-01-01T00:00:00Z", 16) in range(16)


def test_a_delegation_tree_lives_in_its_roots_partition() -> None:
    for root in ("t1", "task-1", "f00d"):
        assert {keys.partition_of(f"{root}{c}", 16) for c in ("", ".1", ".1.2", ".3.4.5")} == {
            keys.partition_of(root, 16)
        }


def test_every_partitioned_key_carries_its_hash_tag() -> None:
    tag = re.compile(r"^orga:\{p:05\}:")
    streams = [
        keys.intake_stream, keys.rejected_stream, keys.observations_stream, keys.events_stream,
        keys.review_stream, keys.dead_letter_stream, keys.control_stream, keys.outbox_stream,
        keys.commit_outbox_stream,
        keys.task_index_key, keys.deadlines_key, keys.finished_tasks_key,
        keys.open_reviews_key, keys.status_counts_key,
    ]  # fmt: skip
    per_task = [
        keys.task_key, keys.journal_stream, keys.journal_sequence_key, keys.conversation_key,
        keys.lease_key, keys.idempotency_key, keys.review_claim_key,
    ]  # fmt: skip
    names = [s(5) for s in streams] + [k("t1.2", 5) for k in per_task]
    assert all(tag.match(n) for n in names), names
    assert len(set(names)) == len(names)
    assert keys.partition_tag(3) == "{p:03}"
    assert keys.intake_stream(3) == "orga:{p:03}:intake"


def test_another_partition_count_is_refused_naming_both() -> None:
    assert check_partitions(b"16", 16, "worker") == 16
    with pytest.raises(
        ConfigError, match=r"ORGA_PARTITIONS=4 .* created with 16 .*ORGA_PARTITIONS=16"
    ):
        check_partitions("16", 4, "coordinator")
    with pytest.raises(ConfigError, match="not a partition count"):
        check_partitions("x", 4, "client")
