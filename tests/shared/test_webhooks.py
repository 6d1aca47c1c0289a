"""Webhook subscriptions (``ORGA_WEBHOOKS``) and their signatures: pure, no network."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from pydantic import ValidationError

from shared.settings import OrgaSettings
from shared.webhooks import (
    WEBHOOK_EVENTS,
    WebhookSubscription,
    sign,
    verify_signature,
    webhook_event,
)


def test_a_signature_is_hmac_sha256_of_the_timestamp_and_body() -> None:
    """The Stripe scheme with fixed values: ``sha256=`` and the hex HMAC of ``"{ts}.{body}"``."""
    expected = hmac.new(b"s3cret", b'1765000000.{"a":1}', hashlib.sha256).hexdigest()
    assert expected == "f54d269257fc57d4e645d2742512e7d2cca0c852f18441066c457b735c9b4e43"
    assert sign("s3cret", 1765000000, b'{"a":1}') == f"sha256={expected}"


def test_verify_refuses_another_secret_body_or_an_old_timestamp() -> None:
    """The right secret, body and a recent timestamp verify; any change, a timestamp past the
    tolerance or one that is not a number does not."""
    body = b'{"event":"task_finished"}'
    signature = sign("s3cret", 1000, body)
    assert verify_signature("s3cret", signature, "1000", body, now=1100)
    assert not verify_signature("other", signature, "1000", body, now=1100)
    assert not verify_signature("s3cret", signature, "1000", body + b" ", now=1100)
    assert not verify_signature("s3cret", signature, "1000", body, now=1000 + 301)
    assert not verify_signature("s3cret", signature, "1001", body, now=1100)
    assert not verify_signature("s3cret", signature, "-1000", body, now=1100)


def test_lifecycle_events_map_to_webhook_events() -> None:
    """escalated -> review_opened, completed -> task_finished, failed and aborted ->
    task_failed, budget_exhausted -> itself; the others are not posted."""
    assert webhook_event("escalated") == "review_opened"
    assert webhook_event("completed") == "task_finished"
    assert webhook_event("failed") == webhook_event("aborted") == "task_failed"
    assert webhook_event("budget_exhausted") == "budget_exhausted"
    assert webhook_event("step_started") is None


def test_orga_webhooks_is_read_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_WEBHOOKS: a JSON list; events default to all four; the secret is hidden in the
    settings' repr; an unknown event is refused naming it."""
    hooks = [{"url": "https://hooks.example/a", "secret": "s3cret"},
             {"url": "http://127.0.0.1:9/b", "events": ["task_failed"]}]  # fmt: skip
    monkeypatch.setenv("ORGA_WEBHOOKS", json.dumps(hooks))
    settings = OrgaSettings()
    assert settings.webhooks[0].events == WEBHOOK_EVENTS
    assert settings.webhooks[1].wants("task_failed")
    assert not settings.webhooks[1].wants("task_finished")
    assert "s3cret" not in repr(settings)
    with pytest.raises(ValidationError, match="task_started"):
        WebhookSubscription.model_validate({"url": "https://x.example", "events": ["task_started"]})


@pytest.mark.parametrize(
    "hook",
    [
        {"url": "ftp://u:pw-s3cret@h.example/in?token=tok-s3cret"},
        {"url": "https://u:pw-s3cret@h.example/in?token=tok-s3cret", "events": []},
        {
            "url": "https://u:pw-s3cret@h.example/in?token=tok-s3cret",
            "secret": "sig-s3cret",
            "x": 1,
        },
    ],
)
def test_an_invalid_subscription_is_refused_without_its_url_or_secret(
    monkeypatch: pytest.MonkeyPatch, hook: dict[str, object]
) -> None:
    """ORGA_WEBHOOKS with a bad entry: the error names the field, never the URL's password
    or token nor the secret (the process prints it at start)."""
    monkeypatch.setenv("ORGA_WEBHOOKS", json.dumps([hook]))
    with pytest.raises(ValidationError, match=r"webhooks\.0\.") as caught:
        OrgaSettings()
    assert "s3cret" not in str(caught.value)
