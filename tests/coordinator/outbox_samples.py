"""Outbox entries for the relay's tests (``test_dispatch``, ``test_relay_sweep_bounds``)."""

from __future__ import annotations

import json

from shared import keys
from shared.outbox import OutboxEntry


def sample_entry(n: int) -> OutboxEntry:
    """A reasoning dispatch numbered ``n`` (its payload ``{"n": n}``)."""
    return OutboxEntry(
        id=f"id-{n}",
        task=keys.reason_task_name,
        queue=keys.reasoning_queue,
        argsrepr=f"(entry {n})",
        shadow=f"reason {n}",
        payload=json.dumps({"n": n}),
    )
