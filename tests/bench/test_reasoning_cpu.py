"""``bench/reasoning_cpu.py`` reads the requests the coordinator pushes onto the reasoning queue:
the single argument of each Celery message, as the worker's pool finds it."""

from __future__ import annotations

from bench.reasoning_cpu import payloads
from coordinator.relay import CeleryPublisher
from shared.settings import OrgaSettings
from tests.coordinator.outbox_samples import both_queues


def test_the_payload_of_each_inline_message_is_read_back() -> None:
    publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url="redis://127.0.0.1:1/0"))
    try:
        entries = both_queues()
        messages = publisher.inline_messages(entries)
    finally:
        publisher.close()
    assert payloads([message for _queue, message in messages]) == [e.payload for e in entries]
