"""Webhooks: who is told what (``ORGA_WEBHOOKS``), and how a post is signed.

A subscription names a URL and the kinds of event it wants; each post is JSON, signed with
HMAC-SHA256 when the subscription has a secret (the Stripe scheme, so receivers know it)::

    X-Orga-Timestamp: 1765000000
    X-Orga-Signature: sha256=<hex of HMAC-SHA256(secret, "{timestamp}.{body}")>
    X-Orga-Delivery: <events stream id>:<subscription index>   (the same on every retry)

A receiver checks it with :func:`verify_signature` (constant-time, and refusing a timestamp
older than its tolerance, so a captured post cannot be replayed later).

Pure: no network and no Redis here (the delivery loop is :mod:`coordinator.webhooks`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, SecretStr, field_validator

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WEBHOOK_EVENTS",
    "WebhookEvent",
    "WebhookSubscription",
    "sign",
    "verify_signature",
    "webhook_event",
]

WebhookEvent = Literal["review_opened", "task_finished", "task_failed", "budget_exhausted"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = (
    "review_opened",
    "task_finished",
    "task_failed",
    "budget_exhausted",
)

_LIFECYCLE: dict[str, WebhookEvent] = {
    "escalated": "review_opened",
    "completed": "task_finished",
    "failed": "task_failed",
    "aborted": "task_failed",
    "budget_exhausted": "budget_exhausted",
}
"""The lifecycle events (``orga:P:events``, field ``event``) each webhook event stands for:
a review opened (any source), a task completed, a task failed or aborted, a step that used up
its attempts' budgets (``budget_exhausted``, written with ``StepLimitReached``)."""

SIGNATURE_HEADER = "X-Orga-Signature"
TIMESTAMP_HEADER = "X-Orga-Timestamp"


class WebhookSubscription(BaseModel):
    """One entry of ``ORGA_WEBHOOKS``: ``{"url": ..., "events": [...], "secret": ...}``.

    A validation error names the field and what is wrong, never the value given (its URL may
    carry a password or a token, its secret is one)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: HttpUrl
    events: tuple[WebhookEvent, ...] = Field(default=WEBHOOK_EVENTS, min_length=1)
    secret: SecretStr | None = None
    """Signs each post (HMAC-SHA256); never logged, never in a dead letter."""

    @field_validator("events", mode="before")
    @classmethod
    def _known_events(cls, value: object) -> object:
        """An unknown event is named in the error (the model hides every input value)."""
        if isinstance(value, list | tuple):
            unknown = [e for e in value if e not in WEBHOOK_EVENTS]
            if unknown:
                raise ValueError(
                    f"unknown webhook event(s) {', '.join(map(repr, unknown))}; the events "
                    f"are {', '.join(WEBHOOK_EVENTS)}"
                )
        return value

    def wants(self, event: WebhookEvent) -> bool:
        """True when this subscription asked for ``event``."""
        return event in self.events


def webhook_event(lifecycle_event: str) -> WebhookEvent | None:
    """The webhook event a lifecycle event (its ``event`` field) is, or None."""
    return _LIFECYCLE.get(lifecycle_event)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``"{timestamp}.{body}"`` with ``secret``."""
    message = f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    signature: str,
    timestamp: str,
    body: bytes,
    *,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """True when ``signature`` (the ``X-Orga-Signature`` header) signs ``body`` at
    ``timestamp`` (``X-Orga-Timestamp``) with ``secret``, and the timestamp is within
    ``tolerance_s`` of ``now``; compared in constant time."""
    if not timestamp.isdigit():
        return False
    at = int(timestamp)
    if abs((time.time() if now is None else now) - at) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, at, body), signature)
