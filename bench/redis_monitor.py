"""Every Redis command the runtime sends for a few tasks, by process and command (``MONITOR``).

Run: ``.venv/bin/python bench/redis_monitor.py`` (``--tasks N``, ``--iterations N``,
``--latency S``, ``--commands``: each command's arguments too, ``--keep``: keep the logs).

The slow-model benchmark's workload and stack (``bench/slow_model_bench.py``: the fake model
server, a private Redis, ``orga coordinator`` and ``orga worker`` with their defaults): one
warm-up task, then ``MONITOR`` on that Redis while ``--tasks`` tasks of ``--iterations``
model calls run, then as long again with nothing submitted (what the processes send when
idle: Celery's ``BRPOP`` loops, the coordinator's tick, ...). Each command is attributed to
the process whose connection sent it (its local port, ``psutil``); a command a Lua script runs
(``[0 lua]``) to the process that ran the script, named ``lua:COMMAND``. Printed: the commands
per model call by process and command, busy minus idle, and ``RESULT`` lines.

``INFO commandstats`` (what ``bench/slow_model_bench.py`` counts) sees the same commands but
not who sent them; ``MONITOR`` itself costs Redis CPU, so this measures counts, never time.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.slow_model_bench import (
    ModelServer,
    make_workspace,
    orga_stack,
    process_role,
    task_spec,
    tree,
    wait_ready,
    wait_terminal,
)
from coordinator.client import OrgaClient


@dataclass
class Monitor:
    """``MONITOR`` on a raw socket, in a thread: every line it prints, until stopped."""

    port: int
    lines: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Monitor:
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"MONITOR on 127.0.0.1:{self.port} did not answer +OK in 10 s")
        return self

    def _run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(b"MONITOR\r\n")
            sock.settimeout(0.2)
            buffer = b""
            while not self._stop.is_set():
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                buffer += chunk
                *complete, buffer = buffer.split(b"\r\n")
                for raw in complete:
                    line = raw.decode(errors="replace")
                    if line == "+OK":
                        self._ready.set()
                    elif line.startswith("+"):
                        self.lines.append(line[1:])

    def take(self) -> list[str]:
        """The lines so far, forgotten here."""
        taken, self.lines = self.lines, []
        return taken

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def port_owners(groups: dict[str, list[int]], redis_port: int) -> dict[int, str]:
    """Local port of each connection to Redis -> the role of the process holding it."""
    owners: dict[int, str] = {}
    for group, pids in groups.items():
        for pid in pids:
            for process in tree(pid):
                try:
                    connections = process.net_connections(kind="tcp")
                except psutil.Error:
                    continue
                role = process_role(group, process)
                for conn in connections:
                    if conn.raddr and conn.raddr.port == redis_port:
                        owners[conn.laddr.port] = role
    return owners


def attribute(
    lines: list[str], owners: dict[int, str]
) -> tuple[Counter[tuple[str, str]], list[tuple[str, str]]]:
    """Count ``(role, command)`` over MONITOR lines; a Lua line goes to the last caller's role."""
    counts: Counter[tuple[str, str]] = Counter()
    listed: list[tuple[str, str]] = []
    last_role = "?"
    for line in lines:
        try:
            _ts, rest = line.split(" ", 1)
            client, command = rest.split("] ", 1)
            words = shlex.split(command)
        except ValueError:
            continue
        if not words:
            continue
        name = words[0].lower()
        where = client.lstrip("[").split(" ", 1)[1]
        if where == "lua":
            role, name = last_role, f"lua:{name}"
        else:
            port = int(where.rsplit(":", 1)[1]) if ":" in where else -1
            role = owners.get(port, f"other ({where})")
            last_role = role
        counts[(role, name)] += 1
        listed.append((role, command[:300]))
    return counts, listed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--commands", action="store_true", help="print every busy command")
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="orga-monitor-")
    root = Path(folder)
    print(f"logs in {root}", flush=True)
    server = ModelServer.start(root, args.latency, 0.2, args.iterations)
    try:
        workspace = make_workspace(root)
        with orga_stack(root / "orga", server) as stack:
            client = OrgaClient(stack.url)
            try:
                run = uuid.uuid4().hex[:8]
                wait_ready(stack, client, workspace, run)
                time.sleep(2.0)  # the warm-up's last writes
                port = stack.redis_server.port
                groups = {k: v for k, v in stack.pids().items() if k != "redis"}
                monitor = Monitor(port).start()
                server.reset()
                started = time.monotonic()
                ids = [client.submit(task_spec(f"{run}-{n}", workspace)) for n in range(args.tasks)]
                statuses = wait_terminal(client, ids, time.monotonic() + 120, lambda: None)
                time.sleep(1.0)  # the last acknowledgements
                busy_s = time.monotonic() - started
                owners = port_owners(groups, port)
                owners.update(dict.fromkeys(_own_ports(port), "benchmark (polls)"))
                busy = monitor.take()
                time.sleep(busy_s)
                owners.update(port_owners(groups, port))
                idle = monitor.take()
                monitor.stop()
                calls = int(server.stats()["calls"])
            finally:
                client.close()
    finally:
        server.stop()
    done = sum(1 for s in statuses.values() if s == "completed")
    print(f"{done} of {len(ids)} tasks completed; {calls} model calls; busy window {busy_s:.1f} s")
    busy_counts, listed = attribute(busy, owners)
    idle_counts, _ = attribute(idle, owners)
    roles = sorted({r for r, _ in busy_counts} | {r for r, _ in idle_counts})
    total = 0.0
    for role in roles:
        names = sorted(
            {n for r, n in busy_counts if r == role} | {n for r, n in idle_counts if r == role}
        )
        rows = [(n, busy_counts[(role, n)], idle_counts[(role, n)]) for n in names]
        net = sum(b - i for _, b, i in rows)
        if not role.startswith("benchmark"):
            total += net
        print(f"\n{role}: {net / max(calls, 1):.2f} per model call (busy minus idle)")
        for name, b, i in rows:
            print(f"  {name:28s} busy {b:5d}  idle {i:5d}  per call {(b - i) / max(calls, 1):6.2f}")
        print(
            f"RESULT redis_commands_per_call[{role}] {net / max(calls, 1):.2f}",
        )
    print(f"RESULT redis_commands_per_call {total / max(calls, 1):.2f} (the runtime's processes)")
    if args.commands:
        print("\nbusy commands, in order:")
        for role, command in listed:
            print(f"  [{role}] {command}")
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


def _own_ports(redis_port: int) -> list[int]:
    """This process's connections to Redis (the benchmark's status polls)."""
    mine = psutil.Process().net_connections(kind="tcp")
    return [c.laddr.port for c in mine if c.raddr and c.raddr.port == redis_port]


if __name__ == "__main__":
    raise SystemExit(main())
