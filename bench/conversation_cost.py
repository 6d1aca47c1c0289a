"""What a long conversation costs: coordinator CPU per iteration and Redis bytes per task.

Issue 11's target: with 20 KB tool outputs and compaction off, the coordinator's CPU per
iteration at 200 iterations is at most 1.3 times its value at 10 iterations (it grew 2.75 ms,
7.4 ms, 26 ms at 10, 50, 200 before the conversation was stored append-only and sent by
reference). The stack is runtime_bench's: a private Redis, the benchmark worker (the production
worker plus the ``noop`` tool, here padded to 20 KB), and a real coordinator process; the CPU
is read from /proc for each process.

    .venv/bin/python bench/conversation_cost.py            # the issue's sizes
    .venv/bin/python bench/conversation_cost.py --quick    # a smoke run

Prints a table and ``RESULT coordinator_cpu_growth_200_vs_10 <ratio>``,
``RESULT redis_bytes_per_task_{1,10,50}x20kb <bytes>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runtime_bench import Cpu, Stack, raw_client, running_stack, wait_all, wait_ready
from coordinator.client import OrgaClient
from shared import keys

OUTPUT_BYTES = 20_000


def long_task(iterations: int) -> dict[str, Any]:
    """One step of ``iterations`` iterations, each a 20 KB tool output; compaction off (the
    budget holds the whole conversation)."""
    replies: list[Any] = [
        {"tool_calls": [{"name": "noop", "arguments": {"n": n, "bytes": OUTPUT_BYTES}}]}
        for n in range(iterations - 1)
    ]
    replies.append("done")
    return {
        "goal": "benchmark a long conversation",
        "provider": {"kind": "scripted", "replies": replies},
        "steps": [{"id": "bench", "instruction": "call noop until told otherwise"}],
        "stagnation": {"enabled": False},
        "limits": {"max_iterations": iterations, "context_token_budget": 10_000_000,
                   "max_total_tokens": 1_000_000_000},
    }  # fmt: skip


def coordinator_ms_per_iteration(
    stack: Stack, client: OrgaClient, iterations: int, tasks: int
) -> float:
    """Coordinator CPU per iteration over ``tasks`` tasks of ``iterations`` run at once."""
    before = Cpu.now(stack)
    ids = [client.submit(long_task(iterations)) for _ in range(tasks)]
    statuses = wait_all(client, ids, timeout_s=1800)
    spent = Cpu.now(stack) - before
    bad = {i: s for i, s in statuses.items() if s != "completed"}
    if bad:
        raise RuntimeError(f"tasks did not complete: {bad}")
    return 1000 * spent.coordinator / (iterations * tasks)


def redis_bytes_of_task(client: OrgaClient, task_id: str) -> int:
    """Bytes Redis holds for one finished task (MEMORY USAGE of each of its keys), plus what
    it left in the observations stream."""
    task_keys = [
        keys.task_key(task_id, 0),
        keys.journal_stream(task_id, 0),
        keys.conversation_key(task_id, 0),
    ]
    used = sum(int(client.redis.memory_usage(k, samples=0) or 0) for k in task_keys)
    return used + int(client.redis.memory_usage(keys.observations_stream(0), samples=0) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    short, long = (10, 50) if args.quick else (10, 200)
    tasks = 2 if args.quick else 4
    with running_stack(concurrency=2) as stack:
        client = OrgaClient(stack.url)
        wait_ready(stack, raw_client(stack.url), client)
        cpu = {n: coordinator_ms_per_iteration(stack, client, n, tasks) for n in (short, long)}
        sizes: dict[int, int] = {}
        for n in (1, 10, 50):
            task_id = client.submit(long_task(n))
            client.wait(task_id, timeout_s=600)
            time.sleep(0.5)  # the last commit's stream trim
            sizes[n] = redis_bytes_of_task(client, task_id)
    growth = cpu[long] / cpu[short]
    print(f"coordinator CPU per iteration, {OUTPUT_BYTES // 1000} KB outputs, compaction off:")
    for n, ms in cpu.items():
        print(f"  {n:>4} iterations: {ms:.2f} ms")
    print("Redis bytes per finished task:")
    for n, size in sizes.items():
        print(f"  {n:>4} iterations of {OUTPUT_BYTES // 1000} KB: {size} bytes")
    print(f"RESULT coordinator_cpu_growth_{long}_vs_{short} {growth:.2f}")
    for n, size in sizes.items():
        print(f"RESULT redis_bytes_per_task_{n}x20kb {size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
