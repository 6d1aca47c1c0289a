"""Partition leases: the balance 1, 2 and 4 coordinators reach on 16 partitions, how long a
newcomer waits for its share, and how long the partitions of a coordinator stopped with SIGKILL
(and with SIGTERM) stay unserved.

Real ``orga coordinator`` processes on a private ``redis-server``; no worker is needed (the
leases do not depend on the work). The lease TTL is the production default
(``ORGA_PARTITION_LEASE_TTL_S``, 10 s) unless ``--ttl`` says otherwise. Prints the shares and

    RESULT partition_balance_<n>_coordinators <max share - min share>
    RESULT partition_rebalance_s_<n>_coordinators <seconds from the n-th start to its fair share>
    RESULT partition_takeover_after_sigkill_s <seconds from SIGKILL to every partition held again>
    RESULT partition_handover_after_sigterm_s <seconds from SIGTERM to every partition held again>

Run: ``python bench/partition_leases_bench.py [--partitions 16] [--ttl 10] [--kills 3]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.integration.harness import Process


def _holders(client: redis.Redis, partitions: int) -> dict[str, list[int]]:
    owners = client.mget([keys.partition_lease_key(p) for p in range(partitions)])
    held: dict[str, list[int]] = {}
    for p, owner in enumerate(owners):
        if owner is not None:
            held.setdefault(str(owner), []).append(p)
    return held


def _fair(partitions: int, count: int) -> list[int]:
    return sorted(partitions // count + (1 if i < partitions % count else 0) for i in range(count))


def _wait_fair(client: redis.Redis, partitions: int, count: int, timeout_s: float) -> float:
    """Seconds until ``count`` coordinators hold the fair shares of every partition."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        held = _holders(client, partitions)
        if len(held) == count and sorted(len(p) for p in held.values()) == _fair(partitions, count):
            return time.monotonic() - started
        time.sleep(0.02)
    raise SystemExit(
        f"no fair balance of {count} within {timeout_s}s: {_holders(client, partitions)}"
    )


class Bench:
    def __init__(self, root: Path, partitions: int, ttl_s: float) -> None:
        self.root, self.partitions, self.ttl_s = root, partitions, ttl_s
        self.processes: list[Process] = []
        self.count = 0

    def start_redis(self) -> None:
        self.redis = EmbeddedRedis(directory=self.root / "redis").start()
        self.client = redis.Redis.from_url(self.redis.url, decode_responses=True)

    def coordinator(self) -> Process:
        self.count += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            ORGA_REDIS_URL=self.redis.url,
            ORGA_PARTITIONS=str(self.partitions),
            ORGA_PARTITION_LEASE_TTL_S=str(self.ttl_s),
            ORGA_WORKSPACE_ROOT=str(self.root / "workspaces"),
        )
        name = f"c{self.count}"
        command = [sys.executable, "-m", "orga.cli", "coordinator"]
        process = Process(name, command, env, self.root / f"{name}.log").start()
        process.wait_for_log("coordinator ")
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
        self.processes.clear()
        self.client.close()
        self.redis.stop()


def balance(bench: Bench, counts: list[int]) -> None:
    """Start coordinators one by one; after each of ``counts``, the shares and the time."""
    for count in range(1, max(counts) + 1):
        bench.coordinator()
        took = _wait_fair(bench.client, bench.partitions, count, bench.ttl_s * 4)
        if count in counts:
            shares = sorted(len(p) for p in _holders(bench.client, bench.partitions).values())
            print(f"{count} coordinator(s): shares {shares}, fair after {took:.2f} s")
            print(f"RESULT partition_balance_{count}_coordinators {max(shares) - min(shares)}")
            print(f"RESULT partition_rebalance_s_{count}_coordinators {took:.2f}")


def stopped(bench: Bench, how: signal.Signals, rounds: int) -> list[float]:
    """With 4 coordinators, stop one with ``how`` ``rounds`` times (a new one started after
    each): seconds until the 3 survivors hold every partition again."""
    took: list[float] = []
    for _ in range(rounds):
        victim = bench.processes.pop(0)
        time.sleep(bench.ttl_s / 3 * (len(took) % 3) / 3)  # land at various renewal phases
        os.kill(victim.pid, how)
        took.append(_wait_fair(bench.client, bench.partitions, 3, bench.ttl_s * 4))
        assert victim.popen is not None
        victim.popen.wait(20)
        bench.coordinator()
        _wait_fair(bench.client, bench.partitions, 4, bench.ttl_s * 4)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--ttl", type=float, default=float(keys.partition_lease_ttl_s))
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orga-leases-") as tmp:
        bench = Bench(Path(tmp), args.partitions, args.ttl)
        bench.start_redis()
        try:
            print(f"{args.partitions} partitions, lease TTL {args.ttl:g} s")
            balance(bench, [1, 2, 4])
            kills = stopped(bench, signal.SIGKILL, args.kills)
            print(f"SIGKILL: every partition held again after {[round(t, 2) for t in kills]} s")
            print(f"RESULT partition_takeover_after_sigkill_s {statistics.median(kills):.2f}")
            terms = stopped(bench, signal.SIGTERM, args.kills)
            print(f"SIGTERM: every partition held again after {[round(t, 2) for t in terms]} s")
            print(f"RESULT partition_handover_after_sigterm_s {statistics.median(terms):.2f}")
        finally:
            bench.stop()


if __name__ == "__main__":
    main()
