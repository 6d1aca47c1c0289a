"""Retry-After parsing and the backoff of ``RetryPolicy``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.providers import RetryPolicy, parse_retry_after
from workers.providers.retry import is_retryable_status

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"RETRY-AFTER": " 0 "}, 0.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "inf"}, None),
    ],
)
def test_retry_after_seconds(headers: dict[str, str], expected: float | None) -> None:
    """Integer or fractional seconds, ms first, case-insensitive; nonsense is no hint."""
    assert parse_retry_after(headers, NOW) == expected


def test_retry_after_http_dates() -> None:
    """An HTTP date counts from now; a date in the past means no wait."""
    future = format_datetime(NOW + timedelta(seconds=42), usegmt=True)
    past = format_datetime(NOW - timedelta(seconds=42), usegmt=True)
    assert parse_retry_after({"Retry-After": future}, NOW) == 42.0
    assert parse_retry_after({"Retry-After": past}, NOW) == 0.0


def test_a_missing_header_gives_the_backoff_and_a_present_one_is_capped() -> None:
    """retry_delay: backoff without a hint, the hint capped with one."""
    policy = RetryPolicy(backoff_base_s=0.5, jitter_s=0, retry_after_cap_s=60)
    assert policy.retry_delay({}, attempt=2, rand=0.9) == 2.0
    assert policy.retry_delay({"retry-after": "1000"}, attempt=0, rand=0.0) == 60.0
    assert policy.retry_delay({"retry-after": "4"}, attempt=5, rand=0.9) == 4.0


def test_backoff_doubles_up_to_its_maximum() -> None:
    """0.5, 1, 2, 4, 8, then stays at backoff_max_s."""
    policy = RetryPolicy(jitter_s=0)
    assert [policy.backoff_delay(a, 0.0) for a in range(7)] == [0.5, 1, 2, 4, 8, 8, 8]


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
    hint=st.one_of(st.none(), st.integers(min_value=0, max_value=10**9).map(str)),
)
def test_every_wait_is_bounded(attempt: int, rand: float, hint: str | None) -> None:
    """No attempt number or header value ever gives a wait beyond the configured bounds."""
    policy = RetryPolicy()
    headers = {"retry-after": hint} if hint is not None else {}
    delay = policy.retry_delay(headers, attempt, rand)
    bound = max(policy.backoff_max_s + policy.jitter_s, policy.retry_after_cap_s)
    assert 0 <= delay <= bound


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (429, True),
        (500, True),
        (529, True),
        (599, True),
        (400, False),
        (404, False),
        (408, False),
        (200, False),
    ],
)
def test_only_429_and_5xx_are_retryable(status: int, retryable: bool) -> None:
    """The retried statuses are exactly 429 and 5xx."""
    assert is_retryable_status(status) is retryable


def test_the_policy_rejects_negative_values() -> None:
    """Negative retries or waits are a validation error naming the field."""
    with pytest.raises(ValidationError, match="max_retries"):
        RetryPolicy(max_retries=-1)
