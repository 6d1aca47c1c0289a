"""The outbox relay's publish alone: CPU per dispatch of ``CeleryPublisher.publish`` against the
``Celery.send_task`` loop it replaced, alternating, on a private ``redis-server``.

``CeleryPublisher.publish`` (``coordinator/relay.py``) builds each message with Celery's
``app.amqp.create_task_message`` and ``send_task_message``, the route of each (task, queue)
worked out once; until 2026-12-06 it called ``Celery.send_task`` for each entry, which routes
the task, looks it up in the app's registry, reads the configuration and builds an
``AsyncResult`` on every dispatch. Both send the same message
(``tests/coordinator/test_transport.py``). This measures both, ``--rounds`` times each in
alternation (``time.process_time``, ``--entries`` reasoning dispatches of a 1.5 KB payload per
round, 8 per publish as the relay sends them on its loop), the queue emptied between rounds.

Run: ``.venv/bin/python bench/relay_publish_bench.py``. Prints ``RESULT
relay_publish_ms_per_dispatch_send_task <median>`` and ``RESULT
relay_publish_ms_per_dispatch <median>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from coordinator.relay import CeleryPublisher
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.outbox import OutboxEntry
from shared.settings import OrgaSettings

CHUNK = 8
"""Entries per publish: the relay's ``loop_chunk``."""


def send_task_loop(publisher: CeleryPublisher, entries: Sequence[OutboxEntry]) -> None:
    """What ``CeleryPublisher.publish`` did until 2026-12-06: ``send_task`` per entry."""
    app = publisher.app
    with app.producer_or_acquire() as producer:
        for entry in entries:
            app.send_task(
                entry.task,
                args=[entry.payload],
                queue=entry.queue,
                task_id=entry.id,
                shadow=entry.shadow,
                argsrepr=entry.argsrepr,
                kwargsrepr="{}",
                producer=producer,
                declare=[],
            )


def dispatches(n: int) -> list[OutboxEntry]:
    payload = '{"fence": {"task_id": "t"}, "pad": "' + "p" * 1500 + '"}'
    return [
        OutboxEntry(
            id=str(uuid.uuid4()),
            task=keys.reason_task_name,
            queue=keys.reasoning_queue,
            argsrepr="(task=t step=s iteration=1 attempt=1 purpose=act)",
            shadow="reason t s #1 act",
            payload=payload,
        )
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each, alternating")
    parser.add_argument("--entries", type=int, default=1000, help="dispatches per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orga-relaypub-") as root:
        server = EmbeddedRedis(directory=Path(root) / "redis")
        server.start()
        publisher = CeleryPublisher.from_settings(
            OrgaSettings(redis_url=server.url, workspace_root=root)
        )
        client = redis.Redis.from_url(server.url)
        try:
            send_task_loop(publisher, dispatches(CHUNK))  # warm both paths up
            publisher.publish(dispatches(CHUNK))
            spent: dict[str, list[float]] = {"send_task": [], "publish": []}
            for n in range(args.rounds):
                order = ("send_task", "publish") if n % 2 == 0 else ("publish", "send_task")
                for side in order:
                    entries = dispatches(args.entries)
                    began = time.process_time()
                    for start in range(0, len(entries), CHUNK):
                        chunk = entries[start : start + CHUNK]
                        if side == "send_task":
                            send_task_loop(publisher, chunk)
                        else:
                            publisher.publish(chunk)
                    spent[side].append(1000 * (time.process_time() - began) / args.entries)
                    client.delete(keys.reasoning_queue)
        finally:
            client.close()
            publisher.close()
            server.close()
    for side, label in (("send_task", "send_task loop"), ("publish", "CeleryPublisher.publish")):
        runs = " ".join(f"{v:.3f}" for v in spent[side])
        print(f"{label}: CPU ms per dispatch, each round: {runs}")
    before, after = statistics.median(spent["send_task"]), statistics.median(spent["publish"])
    print(f"RESULT relay_publish_ms_per_dispatch_send_task {before:.3f}")
    print(f"RESULT relay_publish_ms_per_dispatch {after:.3f}")


if __name__ == "__main__":
    main()
