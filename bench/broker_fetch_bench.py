"""CPU per message of the reasoning worker's consumer: kombu's Redis transport as
``workers.broker`` subclasses it, taking a burst one message per ``BRPOP`` or with up to
``FETCH_MORE`` more per fetch.

Publishes bursts of Celery-format messages with kombu, then drains them with the transport in
a loop (the callback only keeps the message; acks come after the clock stops), and reports the
consumer's process CPU time per message and the Redis server's. Runs alternate between the
variants, several rounds, on a private Redis.

    .venv/bin/python bench/broker_fetch_bench.py                 # 16 vs 0 (one per BRPOP)
    .venv/bin/python bench/broker_fetch_bench.py --more 0,4,16 --rounds 6 --messages 4000
    # --transport-module M: also run another module's Transport (e.g. the previous broker.py)
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
import uuid
from typing import Any

import psutil
from kombu import Connection, Exchange, Producer, Queue

from orga.embedded_redis import EmbeddedRedis
from workers import broker


def _publish(url: str, queue: str, count: int, burst: int) -> None:
    with Connection(url) as connection:
        producer = Producer(connection.default_channel, exchange=Exchange(queue), routing_key=queue)
        for start in range(0, count, burst):
            for _ in range(min(burst, count - start)):
                task_id = str(uuid.uuid4())
                body = [
                    [json.dumps({"run": task_id, "goal": "x" * 600})],
                    {},
                    {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
                ]
                headers = {"lang": "py", "task": "orga.reason", "id": task_id, "shadow": None,
                           "eta": None, "expires": None, "group": None, "group_index": None,
                           "retries": 0, "timelimit": [None, None], "root_id": task_id,
                           "parent_id": None, "argsrepr": "('...',)", "kwargsrepr": "{}",
                           "origin": "gen1@host", "ignore_result": True, "stamped_headers": None,
                           "stamps": {}}  # fmt: skip
                producer.publish(body, headers=headers, serializer="json")


def _consume(url: str, queue: str, count: int, transport: str) -> float:
    """CPU seconds of this process to drain ``count`` messages."""
    received: list[Any] = []
    with Connection(url, transport=transport) as connection:
        channel = connection.default_channel
        Queue(queue, Exchange(queue), routing_key=queue)(channel).declare()
        channel.basic_consume(queue, False, received.append, "bench")
        start = time.process_time()
        while len(received) < count:
            connection.drain_events(timeout=5)
        cpu = time.process_time() - start
        for message in received:
            message.ack()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--more", default="16,0", help="FETCH_MORE values, comma-separated")
    parser.add_argument("--transport-module", default="", help="another module's Transport")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    variants: list[tuple[str, str, int]] = [
        (f"fetch {more}", "workers.broker:Transport", int(more)) for more in args.more.split(",")
    ]
    if args.transport_module:
        importlib.import_module(args.transport_module)
        variants.append((args.transport_module, f"{args.transport_module}:Transport", 0))
    server = EmbeddedRedis().start()
    redis_process = psutil.Process(server.pid)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in variants}
    try:
        for _ in range(args.rounds):
            for name, transport, more in variants:
                broker.FETCH_MORE = more
                queue = f"bench-{uuid.uuid4().hex}"
                Queue(queue, Exchange(queue), routing_key=queue)(
                    Connection(server.url).default_channel
                ).declare()
                _publish(server.url, queue, args.messages, args.burst)
                before = sum(redis_process.cpu_times()[:2])
                cpu = _consume(server.url, queue, args.messages, transport)
                redis_cpu = sum(redis_process.cpu_times()[:2]) - before
                results[name].append((cpu, redis_cpu))
    finally:
        server.close()
    print(f"{args.messages} messages in bursts of {args.burst}, {args.rounds} rounds alternating")
    for name, runs in results.items():
        per = [cpu / args.messages * 1e6 for cpu, _ in runs]
        redis_per = [r / args.messages * 1e6 for _, r in runs]
        print(
            f"{name:>16}: consumer {statistics.median(per):6.1f} µs/message "
            f"(runs {', '.join(f'{p:.1f}' for p in per)}); "
            f"redis-server {statistics.median(redis_per):5.1f} µs/message (incl. acks)"
        )


if __name__ == "__main__":
    main()
