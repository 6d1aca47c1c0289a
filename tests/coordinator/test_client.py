"""OrgaClient's review claim on a real Redis (its claim is a Lua script): one decision is sent
per review, however many reviewers decide it. No coordinator runs, so nothing is applied: what
is checked is what reaches the control stream, and what each reviewer is told."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from coordinator.client import OrgaClient, ReviewDecidedError, WaitTimeoutError
from coordinator.state import ReviewItem
from shared import keys


@pytest.fixture
def orga(redis_url: str) -> Iterator[OrgaClient]:
    """An OrgaClient on a flushed real Redis holding one open review, r1 of task t1."""
    with redis.Redis.from_url(redis_url) as plain:
        plain.flushdb()
    client = OrgaClient(redis_url, poll_interval_s=0.01)
    now = time.time()
    review = ReviewItem(
        review_id="r1", task_id="t1", step_id="s", source="detector", reason="stuck",
        created_at=now, deadline=now + 3600, default_decision="abort",
    )  # fmt: skip
    client.redis.hset(keys.open_reviews_key(0), "r1", review.model_dump_json())
    try:
        yield client
    finally:
        client.close()


def test_a_second_decision_on_a_claimed_review_is_refused_and_not_sent(orga: OrgaClient) -> None:
    """Ann's decision is sent (no coordinator applies it: her wait times out); Ben's, for the
    same review, is refused at once naming Ann's, and the control stream holds Ann's alone."""
    with pytest.raises(WaitTimeoutError):
        orga.decide("r1", "abort", by="ann", timeout_s=0.05)
    with pytest.raises(ReviewDecidedError, match=r"already decided by 'ann' \(abort\)"):
        orga.decide("r1", "skip", by="ben", timeout_s=2.0)  # not applied either: a wait would
        # end in WaitTimeoutError, so only the claim's refusal passes here
    entries = orga.redis.xrange(keys.control_stream(0))
    assert [(f["by"], f["decision"]) for _id, f in entries] == [("ann", "abort")]
    claim = orga.redis.get(keys.review_claim_key("r1", 0))
    assert claim is not None and '"by":"ann"' in claim.replace(" ", "")
