"""What one model call costs Redis, the coordinators and the workers, on one standalone Redis and
on a 3-master Redis Cluster with 1, 2 and 4 coordinators (issue 25, *Benchmark*); the figures
``docs/deploy.md`` (*Sizing*) extrapolates from.

The workload is the slow-model benchmark's (``bench/slow_model_bench.py``): ``--tasks`` runs of
``--iterations`` model calls each, submitted at once, against the fake OpenAI-wire model server
(``bench/fake_model_server.py``) answering after ``--latency`` ± 20 %. Each configuration runs
with fresh processes, all on 127.0.0.1:

- *standalone*: the state on one private ``redis-server``, 1 partition;
- *cluster-N*: the state on a Redis Cluster of 3 masters and 3 replicas
  (:mod:`tests.redis_cluster`), ``--partitions`` partitions, N ``orga coordinator`` processes.

Both have one ``orga worker`` (its default processes, measured as a whole tree) and Celery's
broker on a separate private standalone Redis (required on a cluster; used on the standalone run
too, so that "Redis CPU" is the state's Redis alone in both). The broker's CPU is printed apart.

Measured over the timed batch (after a warm-up task has gone through every process): model calls
answered (the model server's count), calls/s (those calls over the wall time from the first
submission to the last task seen terminal), and CPU per model call of each state Redis node
(``INFO cpu`` ``used_cpu_sys + used_cpu_user`` deltas, masters and replicas apart), of the
coordinators and of the worker tree (``psutil``: user + system of each process tree). Each
figure is gross (all the CPU spent over the batch, divided by its calls) and net of idle: an idle
window of ``--idle`` seconds before the batch measures what each process spends with nothing to
do (a coordinator polls every partition's streams, the workers heartbeat), and that rate times
the batch's duration is taken off. The gross figure is the upper bound the sizing uses.

Headline figures: ``RESULT scale_redis_cpu_ms_per_call`` (the busiest master, the cluster
configuration with the most calls/s), ``RESULT scale_cluster_calls_per_s`` (the best cluster
configuration), ``RESULT scale_standalone_redis_cpu_ms_per_call`` and
``RESULT scale_standalone_calls_per_s``, and per-call coordinator and worker CPU. Then a sizing
extrapolation for 10,000 and 100,000 agents at 5 s per model call (:func:`processes_needed`).

    python bench/scale_bench.py [--quick] [--tasks 200] [--iterations 5] [--latency 1]
        [--coordinators 1,2,4] [--no-standalone] [--keep]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis

from bench.slow_model_bench import (
    ModelServer,
    Plan,
    make_workspace,
    orga_command,
    task_spec,
    tree,
)
from coordinator.client import OrgaClient
from orga.embedded_redis import EmbeddedRedis
from orga.redis_client import RedisClients
from shared import keys
from tests.integration.harness import Process
from tests.redis_cluster import RedisCluster

__all__ = ["Cost", "cpu_ms_per_call", "main", "processes_needed", "redis_cpu_s"]

TERMINAL = frozenset({"completed", "failed", "aborted"})
READY_TIMEOUT_S = 180.0
POLL_EVERY_S = 0.2
MODEL_CALL_S = 5.0
"""The sizing's model latency: agents in flight / this = model calls per second."""
AGENTS = (10_000, 100_000)
UTILISATION = 0.5
"""The sizing keeps each process at half a core: headroom for bursts, failover and recovery."""


# -- pure helpers (tests/bench/test_scale_bench.py) -------------------------------------------


def redis_cpu_s(info: dict[str, Any]) -> float:
    """CPU seconds a Redis server has used, from its ``INFO cpu``: system + user, main thread
    and children (a fork for a snapshot counts)."""
    names = ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children")
    return sum(float(info.get(name, 0.0)) for name in names)


def cpu_ms_per_call(cpu_s: float, calls: int) -> float:
    """Milliseconds of CPU per model call (NaN without calls)."""
    return cpu_s * 1000.0 / calls if calls > 0 else math.nan


def processes_needed(
    calls_per_s: float, ms_per_call: float, utilisation: float = UTILISATION
) -> int:
    """Single-threaded processes (each at most ``utilisation`` of one core) for a load of
    ``calls_per_s`` model calls at ``ms_per_call`` CPU each: at least one."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    if math.isnan(ms_per_call) or ms_per_call < 0:
        raise ValueError(f"ms_per_call must be a measured figure >= 0, got {ms_per_call!r}")
    cores = calls_per_s * ms_per_call / 1000.0
    return max(1, math.ceil(cores / utilisation - 1e-9))


@dataclass(frozen=True)
class Cost:
    """What one configuration measured."""

    name: str
    calls: int
    seconds: float
    completed: int
    tasks: int
    redis_cpu_s: dict[str, float]
    """CPU seconds of each state Redis node, by ``master :port`` / ``replica :port``."""
    broker_cpu_s: float
    coordinator_cpu_s: float
    coordinators: int
    worker_cpu_s: float
    worker_peak_rss_mb: float
    coordinator_peak_rss_mb: float
    redis_used_mb: dict[str, float] = field(default_factory=dict)
    holdings: dict[str, str] = field(default_factory=dict)
    """What each master holds (partitions, the heartbeats key)."""
    idle_cpu_per_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds per second of each (node name, ``broker``, ``coordinators``, ``worker``)
    over an idle window before the batch: what they cost with nothing to do."""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else math.nan

    def ms(self, cpu_s: float) -> float:
        return cpu_ms_per_call(cpu_s, self.calls)

    def net_ms(self, name: str, cpu_s: float) -> float:
        """``ms(cpu_s)`` less what ``name`` spent idle over as long as the batch (the polling
        an idle process does anyway), at least 0."""
        idle = self.idle_cpu_per_s.get(name, 0.0) * self.seconds
        return self.ms(max(0.0, cpu_s - idle))

    @property
    def hottest_master(self) -> tuple[str, float]:
        """The master that spent the most CPU, and its ms per call."""
        masters = {n: s for n, s in self.redis_cpu_s.items() if n.startswith("master")}
        name = max(masters, key=lambda n: masters[n])
        return name, self.ms(masters[name])


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Config:
    """One configuration's processes."""

    name: str
    root: Path
    model_url: str
    coordinators: int
    cluster: bool
    partitions: int
    state: EmbeddedRedis | RedisCluster | None = None
    broker: EmbeddedRedis | None = None
    children: list[Process] = field(default_factory=list)

    def start(self) -> Config:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.cluster:
            self.state = RedisCluster(directory=self.root / "cluster").start()
        else:
            self.state = EmbeddedRedis(directory=self.root / "state").start()
        self.broker = EmbeddedRedis(directory=self.root / "broker").start()
        env = self.env()
        for n in range(self.coordinators):
            name = f"coordinator-{n + 1}"
            self.children.append(
                Process(name, orga_command("coordinator"), env, self.root / f"{name}.log").start()
            )
        self.children.append(
            Process("worker", orga_command("worker"), env, self.root / "worker.log").start()
        )
        return self

    @property
    def state_urls(self) -> str:
        assert self.state is not None
        return self.state.urls if isinstance(self.state, RedisCluster) else self.state.url

    def env(self) -> dict[str, str]:
        assert self.broker is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
        env.update(
            ORGA_REDIS_URL=self.state_urls,
            ORGA_BROKER_URL=self.broker.url,
            ORGA_PARTITIONS=str(self.partitions),
            ORGA_WORKSPACE_ROOT=str(self.root / "workspaces"),
            ORGA_PROVIDER="openai",
            ORGA_BASE_URL=self.model_url,
            ORGA_API_KEY="bench-key",
            ORGA_MODEL="fake-model",
        )
        if self.cluster:
            env["ORGA_REDIS_CLUSTER"] = "true"
        return env

    def client(self) -> OrgaClient:
        if self.cluster:
            sync = RedisClients(self.state_urls, cluster=True).sync(decode_responses=True)
            return OrgaClient(self.state_urls, partitions=self.partitions, client=sync)
        return OrgaClient(self.state_urls, partitions=self.partitions)

    def nodes(self) -> dict[str, int]:
        """Each state node's port, by ``master :port`` / ``replica :port``."""
        if isinstance(self.state, RedisCluster):
            masters = set(self.state.masters())
            return {
                f"{'master' if p in masters else 'replica'} :{p}": p
                for p in self.state.running_ports
            }
        assert isinstance(self.state, EmbeddedRedis)
        return {f"master :{self.state.port}": self.state.port}

    def holdings(self, nodes: dict[str, int]) -> dict[str, str]:
        """What each master holds: how many partitions, and whether ``orga:heartbeats`` (the
        busiest key of no partition: every model call's start and heartbeats)."""
        if not isinstance(self.state, RedisCluster):
            return dict.fromkeys(nodes, f"{self.partitions} partitions, every key")
        port = next(iter(nodes.values()))
        with redis.Redis(port=port, socket_timeout=5, decode_responses=True) as client:
            # unparsed on a plain client: [start, end, [host, port, id], replicas...] each
            ranges = client.execute_command("CLUSTER SLOTS")
            slots = {
                key: int(client.execute_command("CLUSTER KEYSLOT", key))
                for key in [keys.partition_tag(p) for p in range(self.partitions)]
                + [keys.heartbeats_key]
            }
        owner = {
            slot: int(primary[1])
            for start, end, primary, *_replicas in ranges
            for slot in slots.values()
            if int(start) <= slot <= int(end)
        }
        held = {}
        for name, node_port in nodes.items():
            if not name.startswith("master"):
                continue
            count = sum(
                1 for key, slot in slots.items() if key.startswith("{") and owner[slot] == node_port
            )
            beats = owner[slots[keys.heartbeats_key]] == node_port
            held[name] = f"{count} partitions" + (", orga:heartbeats" if beats else "")
        return held

    def coordinator_pids(self) -> list[int]:
        return [c.pid for c in self.children if c.name.startswith("coordinator")]

    def worker_pid(self) -> int:
        return next(c.pid for c in self.children if c.name == "worker")

    def check_alive(self) -> None:
        for child in self.children:
            if child.popen is not None and child.popen.poll() is not None:
                raise RuntimeError(f"{child.name} exited:\n{child.tail()}")

    def stop(self) -> None:
        """Stop every process started, their descendants too, then the Redis servers."""
        descendants = [
            p
            for c in self.children
            if c.popen is not None and c.popen.poll() is None
            for p in tree(c.pid)[1:]
        ]
        for child in reversed(self.children):
            child.stop()
        for process in descendants:
            if process.is_running():
                process.terminate()
        _, alive = psutil.wait_procs(descendants, timeout=10)
        for process in alive:
            process.kill()
        if self.broker is not None:
            self.broker.close()
        if self.state is not None:
            self.state.close()


def node_cpu(nodes: dict[str, int]) -> dict[str, float]:
    """``INFO cpu`` CPU seconds of each node."""
    seen = {}
    for name, port in nodes.items():
        with redis.Redis(port=port, socket_timeout=5) as client:
            seen[name] = redis_cpu_s(client.info("cpu"))
    return seen


def node_used_mb(nodes: dict[str, int]) -> dict[str, float]:
    seen = {}
    for name, port in nodes.items():
        with redis.Redis(port=port, socket_timeout=5) as client:
            seen[name] = int(client.info("memory")["used_memory"]) / 1024 / 1024
    return seen


def trees_cpu_s(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        for process in tree(pid):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


def trees_rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        for process in tree(pid):
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
    return total / 1024 / 1024


def wait_terminal(
    config: Config, client: OrgaClient, ids: Sequence[str], deadline: float, peaks: dict[str, float]
) -> dict[str, str]:
    """Poll every task's status until all are terminal or ``deadline`` passes, sampling the
    coordinators' and the worker tree's RSS."""
    statuses: dict[str, str] = {}
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        config.check_alive()
        pipe = client.redis.pipeline(transaction=False)
        for task_id in pending:
            pipe.hget(
                keys.task_key(task_id, keys.partition_of(task_id, config.partitions)), "status"
            )
        for task_id, status in zip(pending, pipe.execute(), strict=True):
            if status in TERMINAL:
                statuses[task_id] = str(status)
        pending = [i for i in pending if i not in statuses]
        sample_rss(config, peaks)
        if pending:
            time.sleep(POLL_EVERY_S)
    return statuses


def wait_calls(
    config: Config, server: ModelServer, calls: int, deadline: float, peaks: dict[str, float]
) -> None:
    """Until the model server has answered ``calls`` calls or ``deadline`` passes."""
    while time.monotonic() < deadline:
        config.check_alive()
        sample_rss(config, peaks)
        if int(server.stats()["calls"]) >= calls:
            return
        time.sleep(POLL_EVERY_S)


def sample_rss(config: Config, peaks: dict[str, float]) -> None:
    """The coordinators' and the worker tree's RSS, kept when a peak."""
    for name, pids in (
        ("worker", [config.worker_pid()]),
        ("coordinator", config.coordinator_pids()),
    ):
        peaks[name] = max(peaks.get(name, 0.0), trees_rss_mb(pids))


def reading(config: Config, nodes: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each state node, the broker, the coordinators and the worker."""
    assert config.broker is not None
    seen = node_cpu({**nodes, "broker": config.broker.port})
    seen["coordinators"] = trees_cpu_s(config.coordinator_pids())
    seen["worker"] = trees_cpu_s([config.worker_pid()])
    return seen


def spent(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU seconds each spent between two readings, divided by ``seconds``."""
    return {name: (after[name] - before[name]) / seconds for name in after}


def measure(
    config: Config,
    server: ModelServer,
    plan: Plan,
    workspace: Path,
    *,
    bound_s: float,
    idle_s: float,
) -> Cost:
    """One configuration: start, warm up, run the timed batch, read the costs, stop."""
    config.start()
    try:
        client = config.client()
        try:
            run = uuid.uuid4().hex[:8]
            warm = client.submit(task_spec(f"{run}-warmup", workspace))
            done = wait_terminal(config, client, [warm], time.monotonic() + READY_TIMEOUT_S, {})
            if done.get(warm) != "completed":
                raise RuntimeError(
                    f"{config.name}: the warm-up task ended {done.get(warm, 'not finished')!r}"
                )
            nodes = config.nodes()
            idle_from = time.monotonic()
            idle_before = reading(config, nodes)
            time.sleep(idle_s)  # nothing in flight: what the processes cost doing nothing
            before = reading(config, nodes)
            idle = spent(idle_before, before, time.monotonic() - idle_from)
            server.reset()
            specs = [task_spec(f"{run}-{n}", workspace) for n in range(plan.tasks)]
            started = time.monotonic()
            ids = [client.submit(spec) for spec in specs]
            peaks: dict[str, float] = {}
            # the model server's count first (no Redis reads: the bench's polling would be
            # Redis CPU too), then the statuses once every call was answered
            wait_calls(config, server, plan.tasks * plan.iterations, started + bound_s, peaks)
            statuses = wait_terminal(config, client, ids, started + bound_s, peaks)
            seconds = time.monotonic() - started
            batch = spent(before, reading(config, nodes), 1.0)
            cost = Cost(
                name=config.name,
                calls=int(server.stats()["calls"]),
                seconds=seconds,
                completed=sum(1 for s in statuses.values() if s == "completed"),
                tasks=len(ids),
                redis_cpu_s={n: batch[n] for n in nodes},
                broker_cpu_s=batch["broker"],
                coordinator_cpu_s=batch["coordinators"],
                coordinators=config.coordinators,
                worker_cpu_s=batch["worker"],
                idle_cpu_per_s=idle,
                holdings=config.holdings(nodes),
                worker_peak_rss_mb=peaks.get("worker", 0.0),
                coordinator_peak_rss_mb=peaks.get("coordinator", 0.0),
                redis_used_mb=node_used_mb(nodes),
            )
        finally:
            client.close()
    finally:
        config.stop()
    return cost


# -- report ------------------------------------------------------------------------------------


def describe(cost: Cost) -> list[str]:
    """A configuration's figures: gross CPU per call (everything over the batch) and net (less
    what the same process spent idle over as long)."""

    def figures(name: str, cpu_s: float) -> str:
        idle = cost.idle_cpu_per_s.get(name, 0.0)
        return (
            f"{cost.ms(cpu_s):.3f} ms CPU per call (net of idle {cost.net_ms(name, cpu_s):.3f}; "
            f"idle {1000 * idle:.0f} ms/s)"
        )

    lines = [
        f"== {cost.name}: {cost.completed}/{cost.tasks} tasks completed, {cost.calls} model calls "
        f"in {cost.seconds:.1f} s = {cost.calls_per_s:.1f} calls/s",
        f"   coordinators ({cost.coordinators}, in all): "
        f"{figures('coordinators', cost.coordinator_cpu_s)}, "
        f"peak RSS {cost.coordinator_peak_rss_mb:.0f} MiB",
        f"   worker tree: {figures('worker', cost.worker_cpu_s)}, "
        f"peak RSS {cost.worker_peak_rss_mb:.0f} MiB",
        f"   broker Redis: {figures('broker', cost.broker_cpu_s)}",
    ]
    for node, cpu_s in sorted(cost.redis_cpu_s.items()):
        used = cost.redis_used_mb.get(node, math.nan)
        held = f" [{cost.holdings[node]}]" if node in cost.holdings else ""
        lines.append(f"   state {node}{held}: {figures(node, cpu_s)}, used_memory {used:.1f} MiB")
    return lines


def sizing(cluster: Cost, standalone: Cost | None) -> list[str]:
    """The processes for ``AGENTS`` at ``MODEL_CALL_S`` per call, from the measured gross
    per-call costs (the idle polling included: an upper bound)."""
    _, master_ms = cluster.hottest_master
    coordinator_ms = cluster.ms(cluster.coordinator_cpu_s)
    worker_ms = cluster.ms(cluster.worker_cpu_s)
    masters_cpu = {n: s for n, s in cluster.redis_cpu_s.items() if n.startswith("master")}
    all_ms = cluster.ms(sum(masters_cpu.values()))
    lines = [
        f"sizing at {MODEL_CALL_S:g} s per model call, each process at most {UTILISATION:.0%} of "
        f"a core, from {cluster.name}'s gross per-call costs (hottest master {master_ms:.3f} ms, "
        f"all masters {all_ms:.3f} ms, coordinators {coordinator_ms:.2f} ms, worker tree "
        f"{worker_ms:.2f} ms):"
    ]
    for agents in AGENTS:
        rate = agents / MODEL_CALL_S
        # even: the masters' summed CPU spread evenly; skewed: the hottest master keeps its
        # measured load times the measured master count (as if its share never shrank)
        even = processes_needed(rate, all_ms)
        skewed = processes_needed(rate, master_ms * len(masters_cpu))
        lines.append(
            f"  {agents:>7,} agents = {rate:,.0f} calls/s: masters {even} (spread evenly) to "
            f"{skewed} (the hottest master's share kept), coordinator processes "
            f"{processes_needed(rate, coordinator_ms)}, worker trees like this one "
            f"{processes_needed(rate, worker_ms)}"
        )
    net_masters = sum(cluster.net_ms(n, s) for n, s in masters_cpu.items())
    net_coordinators = cluster.net_ms("coordinators", cluster.coordinator_cpu_s)
    net_worker = cluster.net_ms("worker", cluster.worker_cpu_s)
    lines.append(
        f"  net of idle (masters {net_masters:.3f} ms, coordinators {net_coordinators:.2f} ms, "
        f"worker tree {net_worker:.2f} ms; the idle polling comes on top, per coordinator and "
        "partition, and a short batch makes the gross figures mostly that polling):"
    )
    for agents in AGENTS:
        rate = agents / MODEL_CALL_S
        lines.append(
            f"  {agents:>7,} agents: masters {processes_needed(rate, net_masters)} (even), "
            f"coordinator processes {processes_needed(rate, net_coordinators)}, worker trees "
            f"{processes_needed(rate, net_worker)}"
        )
    if standalone is not None:
        ms = standalone.hottest_master[1]
        ceiling = 1000.0 * UTILISATION / ms if ms > 0 else math.inf
        lines.append(
            f"  one standalone Redis at {UTILISATION:.0%} of a core: about {ceiling:,.0f} calls/s "
            f"= {ceiling * MODEL_CALL_S:,.0f} agents ({ceiling * 2 * MODEL_CALL_S:,.0f} at a "
            "whole core)"
        )
    return lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="40 runs x 3 calls, 1 and 2 coordinators"
    )
    parser.add_argument("--tasks", type=int, default=None, help="runs per batch (200)")
    parser.add_argument("--iterations", type=int, default=None, help="model calls per run (5)")
    parser.add_argument("--latency", type=float, default=1.0, help="model latency, seconds")
    parser.add_argument("--coordinators", default=None, help="cluster configurations (1,2,4)")
    parser.add_argument("--partitions", type=int, default=16, help="partitions on the cluster")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds a batch may run")
    parser.add_argument(
        "--idle", type=float, default=5.0, help="seconds of the idle window before each batch"
    )
    parser.add_argument("--no-standalone", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args(argv)
    args.tasks = args.tasks or (40 if args.quick else 200)
    args.iterations = args.iterations or (3 if args.quick else 5)
    counts = args.coordinators or ("1,2" if args.quick else "1,2,4")
    args.coordinators = [int(c) for c in counts.split(",") if c]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    plan = Plan(tasks=args.tasks, iterations=args.iterations, latencies=(args.latency,))
    root = Path(tempfile.mkdtemp(prefix="orga-scale-"))
    load = os.getloadavg()
    print(
        f"scale bench: {plan.tasks} runs x {plan.iterations} calls at {args.latency:g} s; "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        flush=True,
    )
    workspace = make_workspace(root)
    configs = [] if args.no_standalone else [("standalone", 1, False, 1)]
    configs += [(f"cluster-{n}", n, True, args.partitions) for n in args.coordinators]
    costs: list[Cost] = []
    server = ModelServer.start(root, args.latency, plan.jitter, plan.iterations)
    try:
        for name, coordinators, cluster, partitions in configs:
            config = Config(name, root / name, server.url, coordinators, cluster, partitions)
            print(f"-- {name}: starting", flush=True)
            cost = measure(config, server, plan, workspace, bound_s=args.bound, idle_s=args.idle)
            costs.append(cost)
            print("\n".join(describe(cost)), flush=True)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"logs kept in {root}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    standalone = next((c for c in costs if c.name == "standalone"), None)
    clusters = [c for c in costs if c.name.startswith("cluster")]
    lines = []
    if clusters:
        best = max(clusters, key=lambda c: c.calls_per_s)
        print("\n".join(sizing(best, standalone)))
        lines += [
            f"RESULT scale_redis_cpu_ms_per_call {best.hottest_master[1]:.3f}",
            f"RESULT scale_cluster_calls_per_s {best.calls_per_s:.1f}",
            f"RESULT scale_cluster_coordinators {best.coordinators}",
            f"RESULT scale_coordinator_cpu_ms_per_call {best.ms(best.coordinator_cpu_s):.2f}",
            f"RESULT scale_worker_cpu_ms_per_call {best.ms(best.worker_cpu_s):.2f}",
            "RESULT scale_coordinator_cpu_ms_per_call_net "
            f"{best.net_ms('coordinators', best.coordinator_cpu_s):.2f}",
            "RESULT scale_worker_cpu_ms_per_call_net "
            f"{best.net_ms('worker', best.worker_cpu_s):.2f}",
        ]
        for cost in clusters:
            name, ms = cost.hottest_master
            lines.append(
                f"RESULT scale_{cost.name.replace('-', '_')}_calls_per_s {cost.calls_per_s:.1f}"
            )
            lines.append(
                f"RESULT scale_{cost.name.replace('-', '_')}_redis_cpu_ms_per_call {ms:.3f}"
            )
    if standalone is not None:
        lines += [
            f"RESULT scale_standalone_redis_cpu_ms_per_call {standalone.hottest_master[1]:.3f}",
            f"RESULT scale_standalone_calls_per_s {standalone.calls_per_s:.1f}",
            "RESULT scale_standalone_coordinator_cpu_ms_per_call "
            f"{standalone.ms(standalone.coordinator_cpu_s):.2f}",
            "RESULT scale_standalone_worker_cpu_ms_per_call "
            f"{standalone.ms(standalone.worker_cpu_s):.2f}",
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
