"""Memory of the default deployment, process by process (issue 27: 200 runs in flight within
250 MB PSS, all processes).

Run: ``.venv/bin/python bench/memory_bench.py`` (``--tasks``, ``--iterations``, ``--latency``;
``--help``). The same workload as ``bench/slow_model_bench.py`` (its fake model server, its
``orga coordinator`` and default ``orga worker`` on a private Redis, its task), but memory only,
and by process: each process's PSS from ``/proc/PID/smaps_rollup`` (a page shared by forked
processes split between them, so the sum is what the deployment costs the machine), sampled
every 0.5 s. Printed: once the first task completed (idle), and at the peak of the sum while
``--tasks`` runs of ``--iterations`` model calls are in flight, with each process's own peak.

Headline figures are ``RESULT`` lines: ``memory_idle_pss_mb``, ``memory_peak_pss_mb``,
``memory_peak_inflight`` and one ``memory_peak_pss_mb_<role>`` per process role.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.slow_model_bench import (
    Plan,
    make_workspace,
    model_server,
    orga_stack,
    process_role,
    task_spec,
    tree,
    wait_ready,
    wait_terminal,
)
from coordinator.client import OrgaClient

SAMPLE_EVERY_S = 0.5


def pss_mb(pid: int) -> float | None:
    """A process's PSS in MiB (``/proc/PID/smaps_rollup``), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return None


def role_of(group: str, process: psutil.Process) -> str:
    """The benchmark's role names, with the ``orga worker`` supervisor named as such."""
    role = process_role(group, process)
    if role == "workers":
        return "supervisor"
    return role.removeprefix("worker ")


@dataclass
class Snapshot:
    """PSS by (role, pid) at one moment."""

    pss: dict[tuple[str, int], float]

    @property
    def total(self) -> float:
        return sum(self.pss.values())


def snapshot(groups: dict[str, list[int]]) -> Snapshot:
    seen: dict[tuple[str, int], float] = {}
    for group, pids in groups.items():
        for pid in pids:
            for process in tree(pid):
                mb = pss_mb(process.pid)
                if mb is not None:
                    seen[(role_of(group, process), process.pid)] = mb
    return Snapshot(seen)


@dataclass
class Peaks:
    """The snapshot of the largest sum, and each process's own peak."""

    at_peak: Snapshot = field(default_factory=lambda: Snapshot({}))
    each: dict[tuple[str, int], float] = field(default_factory=dict)

    def add(self, shot: Snapshot) -> None:
        if shot.total > self.at_peak.total:
            self.at_peak = shot
        for key, mb in shot.pss.items():
            self.each[key] = max(self.each.get(key, 0.0), mb)


def by_role(values: dict[tuple[str, int], float]) -> dict[str, list[float]]:
    roles: dict[str, list[float]] = {}
    for (role, _), mb in sorted(values.items()):
        roles.setdefault(role, []).append(mb)
    return roles


def report(idle: Snapshot, peaks: Peaks) -> list[str]:
    idle_roles, peak_roles, own_roles = (
        by_role(idle.pss),
        by_role(peaks.at_peak.pss),
        by_role(peaks.each),
    )
    lines = ["| process | idle PSS | PSS at the peak of the sum | own peak |", "|---|---|---|---|"]
    for role in sorted(set(idle_roles) | set(peak_roles)):

        def cell(values: Sequence[float]) -> str:
            return " + ".join(f"{v:.1f}" for v in values) or "–"

        lines.append(
            f"| {role} | {cell(idle_roles.get(role, []))} | {cell(peak_roles.get(role, []))} "
            f"| {cell(own_roles.get(role, []))} |"
        )
    lines.append(
        f"| **all ({len(peaks.at_peak.pss)} processes)** | {idle.total:.1f} | "
        f"{peaks.at_peak.total:.1f} | |"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="runs submitted at once (200)")
    parser.add_argument("--iterations", type=int, default=5, help="model calls per run (5)")
    parser.add_argument("--latency", type=float, default=1.0, help="model latency in s (1)")
    args = parser.parse_args(argv)
    plan = Plan(tasks=args.tasks, iterations=args.iterations, latencies=(args.latency,))
    root = Path(tempfile.mkdtemp(prefix="orga-memory-bench-"))
    workspace = make_workspace(root)
    run = uuid.uuid4().hex[:8]
    print(f"load average {os.getloadavg()}", flush=True)
    with (
        model_server(root, plan, args.latency, plan.iterations) as server,
        orga_stack(root / "orga", server) as stack,
    ):
        client = OrgaClient(stack.url)
        try:
            wait_ready(stack, client, workspace, run)
            groups = stack.pids()
            time.sleep(2.0)  # the warm-up's last events settle
            idle = snapshot(groups)
            server.reset()
            peaks = Peaks()
            last = 0.0

            def tick() -> None:
                nonlocal last
                if time.monotonic() - last >= SAMPLE_EVERY_S:
                    last = time.monotonic()
                    peaks.add(snapshot(groups))

            markers = [f"{run}-{n}" for n in range(plan.tasks)]
            ids = [client.submit(task_spec(marker, workspace)) for marker in markers]
            bound = time.monotonic() + plan.bound_s(args.latency, plan.iterations)
            statuses = wait_terminal(client, ids, bound, tick)
            peaks.add(snapshot(groups))
            stats = server.stats()
        finally:
            client.close()
    completed = sum(1 for s in statuses.values() if s == "completed")
    print(f"{completed} of {plan.tasks} runs completed; load average {os.getloadavg()}")
    print("\n".join(report(idle, peaks)))
    print(f"RESULT memory_idle_pss_mb {idle.total:.0f}")
    print(f"RESULT memory_peak_pss_mb {peaks.at_peak.total:.0f}")
    print(f"RESULT memory_peak_inflight {int(stats['peak_inflight'])}")
    for role, values in by_role(peaks.each).items():
        name = role.replace(" (pool process)", "_pool").replace("orga.", "").replace(" ", "_")
        print(f"RESULT memory_peak_pss_mb_{name} {sum(values):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
