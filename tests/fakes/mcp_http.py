"""The fake MCP server (:mod:`tests.fakes.mcp_server`) as processes the tests start: over
streamable HTTP (uvicorn on a private port of 127.0.0.1) and its stdio command line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["SERVER_SCRIPT", "HttpMcpServer", "free_port", "stdio_command"]

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")


def stdio_command(*extra: str) -> list[str]:
    """The argv of the fake server over stdio (this interpreter, which has the SDK)."""
    return [sys.executable, str(SERVER_SCRIPT), *extra]


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on (right now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class HttpMcpServer:
    """The fake server over streamable HTTP in a subprocess, at :attr:`url` once started."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start it and wait until its port accepts connections."""
        with self._log.open("ab") as handle:
            self._process = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), "--http", str(self.port)],
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise AssertionError(f"the MCP server exited: {self._log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the MCP server did not listen within {timeout_s}s")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL)."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
