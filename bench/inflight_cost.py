"""The runtime's cost per second a model call is in flight (issue 27).

Starts the slow-model benchmark's stack (a private Redis, ``orga coordinator``, ``orga worker``
with their defaults, the fake model server at ``--latency`` seconds), runs the warm-up task,
then measures two windows of ``--window`` seconds each, with nothing polled by this script
during either:

- **idle**: no task in the runtime;
- **in flight**: ``--tasks`` tasks submitted at once, measured once the model server holds
  every one of their first calls (so only waiting calls are in flight).

For each it prints every process's CPU per second (``/proc``, user + system) and Redis's
commands per second by command (``INFO commandstats``, this script's ``INFO`` calls left out),
then the difference divided by the calls in flight: what one call costs per second it waits.
The window must end before the model answers (``--latency`` well above ``--window`` plus the
submission's spread).

    PYTHONPATH=$PWD .venv/bin/python bench/inflight_cost.py --latency 40 --tasks 200 --window 15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.slow_model_bench import (
    Plan,
    cpu_by_process,
    cpu_spent,
    make_workspace,
    model_server,
    orga_stack,
    task_spec,
    wait_ready,
    wait_terminal,
)
from coordinator.client import OrgaClient


def commandstats(redis: Any) -> dict[str, int]:
    """Calls by command so far, ``INFO`` left out."""
    stats: dict[str, Any] = redis.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): int(v["calls"])
        for k, v in stats.items()
        if not k.startswith("cmdstat_info")
    }


def window(
    groups: dict[str, list[int]], redis: Any, seconds: float
) -> tuple[dict[str, float], dict[str, int], float]:
    """CPU seconds by role and commands by name over ``seconds`` of wall time."""
    cpu_before = cpu_by_process(groups)
    cmd_before = commandstats(redis)
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu = cpu_spent(cpu_before, cpu_by_process(groups))
    cmd_after = commandstats(redis)
    commands = {k: v - cmd_before.get(k, 0) for k, v in cmd_after.items()}
    return cpu, {k: v for k, v in commands.items() if v}, elapsed


def report(label: str, cpu: dict[str, float], commands: dict[str, int], elapsed: float) -> None:
    print(f"-- {label} ({elapsed:.1f} s)")
    for role, seconds in sorted(cpu.items()):
        print(f"   cpu {role:<40} {1000 * seconds / elapsed:8.2f} ms/s")
    print(f"   cpu {'all':<40} {1000 * sum(cpu.values()) / elapsed:8.2f} ms/s")
    for name, calls in sorted(commands.items(), key=lambda kv: -kv[1]):
        print(f"   redis {name:<38} {calls / elapsed:8.1f} /s")
    print(f"   redis {'all':<38} {sum(commands.values()) / elapsed:8.1f} /s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=40.0, help="model latency, seconds")
    parser.add_argument("--tasks", type=int, default=200, help="calls in flight")
    parser.add_argument("--window", type=float, default=15.0, help="seconds measured")
    args = parser.parse_args(argv)
    if args.window + 10 > args.latency:
        parser.error(f"--window {args.window:g} needs --latency above {args.window + 10:g}")
    plan = Plan(tasks=args.tasks, iterations=1, jitter=0.0)
    with tempfile.TemporaryDirectory(prefix="orga-inflight-") as tmp:
        root = Path(tmp)
        workspace = make_workspace(root)
        with (
            model_server(root, plan, args.latency, 1) as server,
            orga_stack(root / "orga", server) as stack,
        ):
            client = OrgaClient(stack.url)
            try:
                print(f"-- warm-up: one task at {args.latency:g} s", flush=True)
                wait_ready(stack, client, workspace, "warm")
                groups = stack.pids()
                time.sleep(2.0)
                idle = window(groups, client.redis, args.window)
                report("idle", *idle)
                ids = [client.submit(task_spec(f"f-{n}", workspace)) for n in range(args.tasks)]
                deadline = time.monotonic() + args.latency - args.window - 2
                while server.stats()["inflight"] < args.tasks:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"only {server.stats()['inflight']} of {args.tasks} calls reached "
                            f"the model in time: raise --latency ({args.latency:g})"
                        )
                    time.sleep(0.1)
                time.sleep(1.0)
                busy = window(groups, client.redis, args.window)
                inflight = server.stats()["inflight"]
                report(f"{inflight} calls in flight", *busy)
                if inflight < args.tasks:
                    print(f"   (only {inflight} still in flight at the end: shorten --window)")
                print(f"-- per call in flight, per second (idle subtracted, {args.tasks} calls)")
                roles = sorted(set(idle[0]) | set(busy[0]))
                total = 0.0
                for role in roles:
                    extra = busy[0].get(role, 0.0) / busy[2] - idle[0].get(role, 0.0) / idle[2]
                    total += extra
                    print(f"   cpu {role:<40} {1000 * extra / args.tasks:8.3f} ms")
                print(f"   cpu {'all':<40} {1000 * total / args.tasks:8.3f} ms")
                names = set(idle[1]) | set(busy[1])
                extra_cmds = {
                    n: busy[1].get(n, 0) / busy[2] - idle[1].get(n, 0) / idle[2] for n in names
                }
                for name, rate in sorted(extra_cmds.items(), key=lambda kv: -kv[1]):
                    if abs(rate) / args.tasks >= 0.005:
                        print(f"   redis {name:<38} {rate / args.tasks:8.3f}")
                print(f"   redis {'all':<38} {sum(extra_cmds.values()) / args.tasks:8.3f}")
                wait_terminal(client, ids, time.monotonic() + args.latency + 60, lambda: None)
            finally:
                client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
