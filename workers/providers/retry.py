"""When and how long the HTTP providers wait before trying a request again.

The rule: 429 and 5xx answers (and connections that fail before any answer) are retried up to
``max_retries`` times. The wait is the server's ``Retry-After`` when it sends one (integer or
fractional seconds, or an HTTP date; OpenAI's ``retry-after-ms`` first), capped at
``retry_after_cap_s``; without the header it is the exponential backoff
``min(backoff_base_s * 2**attempt, backoff_max_s)`` plus a random jitter in ``[0, jitter_s)``.
A missing header therefore never means a long wait (Symbiont's default turned it into 1,000 s).

With ``deadline_s`` above 0 (a worker's ``ORGA_PROVIDER_RETRY_DEADLINE_S``), the count no longer
applies: 429, 5xx, unreachable servers and timeouts are retried for as long as the next try
starts within ``deadline_s`` of the first, so a burst of rate limiting is waited out instead of
failing the step's attempt.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RetryPolicy", "SleepFn", "is_retryable_status", "parse_retry_after"]

SleepFn = Callable[[float], Awaitable[None]]
"""How the providers wait: ``asyncio.sleep`` in production, a recorder in tests."""


def is_retryable_status(status: int) -> bool:
    """True for the HTTP statuses worth another try: 429 and every 5xx."""
    return status == 429 or 500 <= status <= 599


class RetryPolicy(BaseModel):
    """How many times to retry a 429/5xx answer, and how long to wait in between."""

    model_config = ConfigDict(frozen=True)

    max_retries: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.5, ge=0)
    backoff_max_s: float = Field(default=8.0, ge=0)
    jitter_s: float = Field(default=0.5, ge=0)
    retry_after_cap_s: float = Field(default=60.0, ge=0)
    deadline_s: float = Field(default=0.0, ge=0)
    """Retry transient failures (timeouts included) until this many seconds after the first
    try, whatever their number; 0: ``max_retries`` retries of 429/5xx, timeouts not retried."""

    def allows(self, attempt: int, elapsed_s: float, delay_s: float) -> bool:
        """Whether failed try ``attempt`` (0-based), ``elapsed_s`` after the first began, may
        be followed by another after ``delay_s``."""
        if self.deadline_s > 0:
            return elapsed_s + delay_s <= self.deadline_s
        return attempt < self.max_retries

    def backoff_delay(self, attempt: int, rand: float) -> float:
        """The wait after failed attempt ``attempt`` (0-based) with no Retry-After header.

        ``rand`` is a number in ``[0, 1)`` that scales the jitter.
        """
        exponential = self.backoff_base_s * math.pow(2, min(attempt, 62))
        return min(exponential, self.backoff_max_s) + rand * self.jitter_s

    def retry_delay(
        self, headers: Mapping[str, str], attempt: int, rand: float, now: datetime | None = None
    ) -> float:
        """The server's Retry-After (capped) when it sent a usable one, else the backoff."""
        hinted = parse_retry_after(headers, now)
        if hinted is None:
            return self.backoff_delay(attempt, rand)
        return min(hinted, self.retry_after_cap_s)


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds to wait as the headers ask, or None when they do not say (or say nonsense).

    ``retry-after-ms`` (milliseconds, sent by OpenAI) wins over ``retry-after``, which may be
    seconds or an HTTP date. Header names are matched without regard to case.
    """
    lowered = {name.lower(): value.strip() for name, value in headers.items()}
    milliseconds = _parse_seconds(lowered.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _parse_seconds(value)
    return seconds if seconds is not None else _parse_http_date(value, now)


def _parse_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _parse_http_date(value: str, now: datetime | None) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max((when - current).total_seconds(), 0.0)
