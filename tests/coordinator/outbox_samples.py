"""Outbox entries for the relay's tests (``test_dispatch``, ``test_relay_sweep_bounds``,
``test_transport``, ``test_inline_dispatch``)."""

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


def both_queues() -> list[OutboxEntry]:
    """A reasoning and a tool dispatch, twice, each payload with non-ASCII text."""
    return [
        OutboxEntry(
            id=f"id-{n}-{queue}",
            task=task,
            queue=queue,
            argsrepr=f"(task=t{n} step=s iteration={n})",
            shadow=f"reason t{n} s #{n} act",
            payload=json.dumps({"fence": {"task_id": f"t{n}"}, "text": "é" * n}),
        )
        for n in (1, 2)
        for task, queue in (
            (keys.reason_task_name, keys.reasoning_queue),
            (keys.tool_task_name, keys.tools_queue),
        )
    ]
