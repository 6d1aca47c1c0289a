"""What the outbox hop costs: commit to message in the broker, and the relay's CPU per dispatch.

Run: ``.venv/bin/python bench/outbox_bench.py`` (``--dispatches 300 --load 2000 --rate 1000``).
Starts a private ``redis-server`` and, per relay batch size (1: no batching; the default,
:data:`shared.keys.outbox_batch`) and where the send runs (on the event loop, the default; in
the relay's thread), a relay process built as a coordinator builds it
(:class:`coordinator.relay.OutboxRelay` on :class:`coordinator.relay.CeleryPublisher`). What
the coordinator's commit script does is stood for by one
``XADD`` of an outbox entry with a 2 KB payload; the time it returns is the commit's. Before
the outbox, the commit itself pushed the message: the whole hop is added latency.

* ``single``: one dispatch at a time, the next once the last is in the queue (``BRPOP`` by
  this process): the hop when nothing else is going on.
* ``load``: ``--load`` dispatches at ``--rate`` per second, each its own ``XADD``; a consumer
  process records when each message reaches the queue (``BRPOP``). Batches form here.

Printed per batch size and pattern: added latency p50 / p95 / max (ms), and the relay
process's CPU per dispatch (``getrusage`` of that process over the run: reading the outbox,
``send_task``, the removal). ``RESULT scale_outbox_added_ms_p50`` is the ``single`` p50 with
the default batch and the send on the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import statistics
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.outbox import OutboxEntry

PAYLOAD = json.dumps({"conversation_ref": "x" * 2000})


def _entry(n: int) -> OutboxEntry:
    return OutboxEntry(
        id=f"bench-{n}",
        task=keys.reason_task_name,
        queue=keys.reasoning_queue,
        argsrepr=f"(bench {n})",
        shadow=f"reason bench {n}",
        payload=PAYLOAD,
    )


def _relay_process(
    url: str, relay_config: tuple[int, bool], ready: Event, stop: Event, out: Connection
) -> None:
    """A relay as a coordinator runs it; sends its CPU seconds once ``stop`` is set."""
    from redis.asyncio import Redis

    from coordinator.relay import CeleryPublisher, OutboxRelay
    from shared.settings import OrgaSettings

    batch, in_thread = relay_config

    async def main() -> float:
        client = Redis.from_url(url)
        publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url=url))
        relay = OutboxRelay(
            client, publisher, "bench", batch=batch, block_ms=100, in_thread=in_thread
        )
        stopping = asyncio.Event()
        task = asyncio.create_task(relay.run(stopping))
        await asyncio.sleep(0.2)  # imports and the first connection out of the measured CPU
        ready.set()
        start = _cpu_s()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        used = _cpu_s() - start
        stopping.set()
        await task
        await client.aclose()
        return used

    out.send(asyncio.run(main()))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _consumer_process(url: str, count: int, out: Connection) -> None:
    """Pop ``count`` messages; send each one's task id and arrival time."""
    arrivals: dict[str, float] = {}
    with redis.Redis.from_url(url) as client:
        while len(arrivals) < count:
            popped = client.brpop([keys.reasoning_queue], timeout=30)
            if popped is None:
                break
            arrivals[json.loads(popped[1])["headers"]["id"]] = time.time()
    out.send(arrivals)


def _single(client: redis.Redis, count: int) -> list[float]:
    added = []
    for n in range(count):
        client.xadd(keys.outbox_stream(0), _entry(n).fields())  # type: ignore[arg-type]
        committed = time.perf_counter()
        client.brpop([keys.reasoning_queue], timeout=30)
        added.append((time.perf_counter() - committed) * 1000)
    return added


def _load(url: str, client: redis.Redis, count: int, rate: float) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    consumer = ctx.Process(target=_consumer_process, args=(url, count, theirs))
    consumer.start()
    committed: dict[str, float] = {}
    start = time.perf_counter()
    for n in range(count):
        due = start + n / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(due - now, 0.001))
        entry = _entry(n)
        client.xadd(keys.outbox_stream(0), entry.fields())  # type: ignore[arg-type]
        committed[entry.id] = time.time()
    arrivals: dict[str, float] = mine.recv()
    consumer.join()
    return [(arrivals[i] - t) * 1000 for i, t in committed.items() if i in arrivals]


def _measure(
    url: str, relay_config: tuple[int, bool], pattern: str, count: int, rate: float
) -> tuple[list[float], float]:
    """Added latencies (ms) and the relay's CPU ms per dispatch."""
    with redis.Redis.from_url(url) as client:
        client.flushdb()
        ctx = multiprocessing.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        mine, theirs = ctx.Pipe()
        relay = ctx.Process(target=_relay_process, args=(url, relay_config, ready, stop, theirs))
        relay.start()
        if not ready.wait(60):
            raise RuntimeError("the relay process did not start within 60 s")
        added = _single(client, count) if pattern == "single" else _load(url, client, count, rate)
        stop.set()
        cpu_s: float = mine.recv()
        relay.join()
        if client.xlen(keys.outbox_stream(0)):
            raise RuntimeError("entries left on the outbox: the relay did not remove them")
    return added, cpu_s * 1000 / count


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    """Both patterns for both batch sizes; a table, then the RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatches", type=int, default=300, help="single: how many")
    parser.add_argument("--load", type=int, default=2000, help="load: how many")
    parser.add_argument("--rate", type=float, default=1000.0, help="load: dispatches per second")
    args = parser.parse_args()
    server = EmbeddedRedis().start()
    rows = []
    try:
        for batch, in_thread in ((1, False), (keys.outbox_batch, False), (keys.outbox_batch, True)):
            for pattern, count in (("single", args.dispatches), ("load", args.load)):
                added, cpu_ms = _measure(server.url, (batch, in_thread), pattern, count, args.rate)
                where = "thread" if in_thread else "loop"
                rows.append((batch, where, pattern, len(added), added, cpu_ms))
    finally:
        server.stop()
    print(
        "| relay batch | sent on | pattern | dispatches | added p50 / p95 / max ms | CPU ms each |"
    )
    print("|---|---|---|---|---|---|")
    for batch, where, pattern, n, added, cpu_ms in rows:
        label = pattern if pattern == "single" else f"load {args.rate:.0f}/s"
        print(
            f"| {batch} | {where} | {label} | {n} | {_pct(added, 50):.2f} / "
            f"{_pct(added, 95):.2f} / {max(added):.2f} | {cpu_ms:.3f} |"
        )
    default = [r for r in rows if r[0] == keys.outbox_batch and r[1] == "loop"]
    single, loaded = (next(r for r in default if r[2] == p) for p in ("single", "load"))
    print(f"RESULT scale_outbox_added_ms_p50 {_pct(single[4], 50):.3f}")
    print(f"RESULT scale_outbox_added_ms_p95 {_pct(single[4], 95):.3f}")
    print(f"RESULT scale_outbox_load_added_ms_p50 {_pct(loaded[4], 50):.3f}")
    print(f"RESULT scale_outbox_relay_cpu_ms_per_dispatch {loaded[5]:.3f}")


if __name__ == "__main__":
    main()
