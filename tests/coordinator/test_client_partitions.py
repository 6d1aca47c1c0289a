"""OrgaClient on several partitions (a real Redis): a submission goes to its task's partition's
intake, an idempotency key keeps its retries in one partition, another count is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from coordinator.client import OrgaClient
from shared import keys
from shared.errors import ConfigError

TASK = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        client.flushdb()
        yield client


def _intake_ids(plain: redis.Redis, partition: int) -> list[str]:
    return [f["task_id"] for _i, f in plain.xrange(keys.intake_stream(partition))]


def test_a_submission_goes_to_its_tasks_partitions_intake(
    plain: redis.Redis, redis_url: str
) -> None:
    client = OrgaClient(redis_url, partitions=16)
    ids = [client.submit(TASK, task_id=f"t{n}") for n in range(20)]
    for task_id in ids:
        assert task_id in _intake_ids(plain, keys.partition_of(task_id, 16))
    assert plain.get(keys.partitions_key) == "16"
    assert len({keys.partition_of(t, 16) for t in ids}) > 1


def test_retries_with_one_idempotency_key_land_in_the_keys_partition(
    plain: redis.Redis, redis_url: str
) -> None:
    """The key is checked with the task created by one script: every id the client draws for
    it is in the key's partition, and an id given in another partition is refused."""
    client = OrgaClient(redis_url, partitions=16)
    task = {**TASK, "idempotency_key": "order-42"}
    home = keys.idempotency_partition("order-42", 16)
    drawn = [client.submit(json.dumps(task)) for _ in range(5)]
    assert {keys.partition_of(t, 16) for t in drawn} == {home}
    assert set(_intake_ids(plain, home)) == set(drawn)
    elsewhere = next(f"x{n}" for n in range(100) if keys.partition_of(f"x{n}", 16) != home)
    with pytest.raises(ConfigError, match=r"idempotency key 'order-42' in partition"):
        client.submit(task, task_id=elsewhere)


def test_a_client_with_another_partition_count_is_refused(
    plain: redis.Redis, redis_url: str
) -> None:
    plain.set(keys.partitions_key, 16)
    with pytest.raises(ConfigError, match=r"ORGA_PARTITIONS=4 .* created with 16"):
        OrgaClient(redis_url, partitions=4).submit(TASK)
    assert OrgaClient(redis_url).partition_count == 16  # none given: the stored one


@pytest.mark.parametrize(
    "text",
    ['{"goal": "g", "x": ' + "[" * 100_000, "goal: [unclosed", "goal: !!timestamp nope\n"],
)
def test_bad_text_is_submitted_for_the_coordinator_to_refuse(
    plain: redis.Redis, redis_url: str, text: str
) -> None:
    """Looking for an idempotency key on several partitions parses the text as the intake
    does: text nested 100,000 deep, broken or badly tagged is sent as is (the coordinator
    rejects it, naming why), never a RecursionError in the client."""
    client = OrgaClient(redis_url, partitions=16)
    task_id = client.submit(text)
    assert task_id in _intake_ids(plain, keys.partition_of(task_id, 16))


def test_following_events_skips_no_partitions_event(redis_url: str, plain: redis.Redis) -> None:
    """Partition 1's events stamped below partition 0's last one (another master's clock, or
    cut by a page's count): one id for every partition skips them; follow_events' cursor, one
    position per partition, gets each event once."""
    client = OrgaClient(redis_url, partitions=2)
    plain.xadd(keys.events_stream(0), {"event": "a"}, id="5-0")
    plain.xadd(keys.events_stream(0), {"event": "f"}, id="6-0")
    plain.xadd(keys.events_stream(1), {"event": "b"}, id="1-0")
    seen: list[str] = []
    rows, cursor = client.follow_events(count=2)  # 1-0 (p1) and 5-0 (p0); 6-0 waits
    seen += [f["event"] for _i, f in rows]
    assert cursor == "5-0,1-0"
    plain.xadd(keys.events_stream(1), {"event": "d"}, id="4-0")  # below the last id seen
    plain.xadd(keys.events_stream(1), {"event": "c"}, id="7-0")
    plain.xadd(keys.events_stream(0), {"event": "e"}, id="9-0")
    while True:
        rows, cursor = client.follow_events(cursor, count=2)
        if not rows:
            break
        seen += [f["event"] for _i, f in rows]
    assert seen == ["b", "a", "d", "f", "c", "e"]
    assert cursor == "9-0,7-0"
    assert [f["event"] for _i, f in client.events(after="5-0")] == ["f", "c", "e"]  # d skipped
    with pytest.raises(ConfigError, match="names 3 partitions"):
        client.follow_events("1-0,2-0,3-0")
    plain.flushdb()  # one partition: the cursor is a plain stream id
    plain.xadd(keys.events_stream(0), {"event": "a"}, id="5-0")
    single = OrgaClient(redis_url, partitions=1)
    assert single.follow_events("4-0") == ([("5-0", {"event": "a"})], "5-0")
