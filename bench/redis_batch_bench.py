"""CPU per model call of a reasoning worker's start and breaker check: own pipelines vs one.

Run: ``.venv/bin/python bench/redis_batch_bench.py`` (``--pairs 6 --calls 200``). Starts a
private ``redis-server`` and one :class:`workers.runtime.ProcessServices` (its loop thread,
its Redis pool), then, alternating, runs the same fake calls with each pipeline runner:

* ``own``: each call's start and its tool's breaker check a pipeline of their own
  (:class:`workers.redis_batch.OwnPipeline`, the check an ``EVALSHA`` of its own: the code
  before the change);
* ``coalesced``: :class:`workers.redis_batch.CoalescedPipeline`, what a worker uses now.

A fake call is what a reasoning turn does in Redis before and around its tool, without the
model: ``started`` (heartbeat, queue count, deadline, the one conversation message it lacks,
the rate-limit hold), a sleep standing for the model's answer, the ``file_read`` breaker check
of its task, the deferred success. Two arrival patterns: ``burst`` (all ``--calls`` at once,
as a batch of deliveries arrives) and ``paced`` (``--calls`` per second, spread evenly: the
fewest calls per loop turn). Printed: CPU ms per call (``time.process_time`` of the whole
process, so the loop thread's work and redis-py's both count; Redis's own CPU does not), and
pipelines sent per call for the coalesced runner.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.conversation import Conversation, ConversationMessage
from shared.loop_types import LoopConfig
from shared.protocol import ConversationRef, Fence, ReasonRequest
from shared.settings import OrgaSettings
from shared.task_spec import ProviderSpec
from workers.providers.settings import ProviderSettings
from workers.redis_batch import CoalescedPipeline, OwnPipeline
from workers.runtime import ProcessServices

MODEL_S = 0.05
"""The stand-in for the model's answer between the start and the tool (seconds)."""


def _spin(cpu_ms: float) -> None:
    """Burn ``cpu_ms`` of CPU on the loop: the rest of a call's work (parsing, the gate, the
    tool), which keeps the loop busy and so decides how many events one loop turn collects."""
    end = time.process_time() + cpu_ms / 1000
    while time.process_time() < end:
        pass


def _requests(count: int, round_: int) -> list[ReasonRequest]:
    ref = ConversationRef(length=1, epoch=round_, created_at=1.0)
    return [
        ReasonRequest(
            fence=Fence(task_id=f"t{i}", step_id="s", iteration=round_, attempt=1),
            agent_id="a",
            conversation=Conversation(),
            config=LoopConfig(),
            provider=ProviderSpec(),
            workspace="/tmp/ws",
            conversation_ref=ref,
        )
        for i in range(count)
    ]


def _use(services: ProcessServices, kind: str) -> CoalescedPipeline | None:
    """Switch the services' runner (the breaker store's too); the coalesced one, or None."""
    runner = CoalescedPipeline(services.redis) if kind == "coalesced" else None
    services.pipelines = runner or OwnPipeline(services.redis)  # type: ignore[assignment]
    services.breaker_store._pipelines = runner  # the check's HMGET on its own, as before
    return runner


async def _call(
    services: ProcessServices, request: ReasonRequest, delay_s: float, work_ms: float
) -> None:
    await asyncio.sleep(delay_s)
    fences = [request.fence]
    await services.started(request, fences, keys.reasoning_queue)
    try:
        await asyncio.sleep(MODEL_S)
        _spin(work_ms)
        breaker = services.executor.breakers.breaker("file_read", request.fence.task_id)
        await breaker.check()
        await breaker.record_success()
    finally:
        services.liveness.finished(fences)


async def _round(
    services: ProcessServices, requests: list[ReasonRequest], paced: bool, work_ms: float
) -> None:
    step = 1.0 / len(requests) if paced else 0.0
    await asyncio.gather(*(_call(services, r, i * step, work_ms) for i, r in enumerate(requests)))


def _measure(
    services: ProcessServices, kind: str, round_: int, *, calls: int, paced: bool, work_ms: float
) -> tuple[float, float]:
    runner = _use(services, kind)
    requests = _requests(calls, round_)
    services.run(_round(services, requests, paced, work_ms))  # warm: scripts, connections
    if runner is not None:
        runner.batches_sent = 0
    requests = _requests(calls, round_ + 1)
    before = time.process_time()
    services.run(_round(services, requests, paced, work_ms))
    cpu_ms = (time.process_time() - before) * 1000 / calls - work_ms
    sent = runner.batches_sent / (2 * calls) if runner is not None else 1.0
    return cpu_ms, sent


def _compare(services: ProcessServices, pattern: str, args: argparse.Namespace) -> None:
    """Alternate own and coalesced ``args.pairs`` times; print CPU ms per call of each."""
    figures: dict[str, list[float]] = {"own": [], "coalesced": []}
    shares: list[float] = []
    for pair in range(args.pairs):
        order = ("own", "coalesced") if pair % 2 == 0 else ("coalesced", "own")
        for kind in order:
            round_ = 10 * pair + (0 if kind == "own" else 5)
            cpu, sent = _measure(
                services,
                kind,
                round_,
                calls=args.calls,
                paced=pattern == "paced",
                work_ms=args.work_ms,
            )
            figures[kind].append(cpu)
            if kind == "coalesced":
                shares.append(sent)
    for kind, values in figures.items():
        shown = " ".join(f"{v:.3f}" for v in values)
        mean = statistics.mean(values)
        print(f"{pattern:5} {kind:9} CPU ms/call: {shown}  mean {mean:.3f}")
    print(f"{pattern:5} coalesced: pipelines per pipeline asked {statistics.mean(shares):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument(
        "--work-ms", type=float, default=0.0, help="other CPU per call, spun on the loop"
    )
    parser.add_argument("--pattern", choices=["burst", "paced", "both"], default="both")
    args = parser.parse_args()
    patterns = ("burst", "paced") if args.pattern == "both" else (args.pattern,)
    with EmbeddedRedis() as server:
        plain = redis.Redis.from_url(server.url)
        message = ConversationMessage.user("hello").model_dump_json()
        for i in range(args.calls):
            plain.rpush(keys.conversation_key(f"t{i}", 0), message)
        provider = ProviderSettings(provider="openai", api_key="sk-x", base_url="http://m.test/v1")
        services = ProcessServices(OrgaSettings(redis_url=server.url), provider, server.url)
        try:
            for pattern in patterns:
                _compare(services, pattern, args)
        finally:
            services.close()
            plain.close()


if __name__ == "__main__":
    main()
