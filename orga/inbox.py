"""``orga inbox``: serve the inbox with uvicorn, against a deployment or the embedded runtime.

Against ``ORGA_REDIS_URL`` the inbox only talks to Redis (the deployment's coordinators apply the
decisions). Without it, the inbox holds the embedded runtime in ``ORGA_HOME`` while it serves
(its Redis, workers and coordinator), so a decision resumes the task as ``orga review decide``
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import uvicorn

from coordinator.client import OrgaClient
from coordinator.inbox.app import create_app
from coordinator.inbox.auth import ReviewerAuth
from orga.embedded import EmbeddedRuntime
from orga.redis_client import RedisClients
from shared.settings import OrgaSettings

__all__ = ["SignalledServer", "run_inbox", "serve_announced"]


def run_inbox(
    settings: OrgaSettings,
    home: Path,
    host: str,
    port: int,
    announce: Callable[[str], None],
    *,
    key_fds: list[int] | None = None,
) -> None:
    """Serve until interrupted; InboxConfigError, before anything starts, without credentials.
    ``key_fds``: the embedded runtime's model key sockets (:class:`EmbeddedRuntime`)."""
    auth = ReviewerAuth.from_settings(settings)
    secret = settings.inbox_secret.get_secret_value() if settings.inbox_secret else None

    async def serve(redis_url: str, where: str) -> None:
        # The deployment's Redis may be a cluster (ORGA_REDIS_CLUSTER); the embedded one is not.
        embedded_url = redis_url != settings.redis_url
        clients = RedisClients(redis_url) if embedded_url else RedisClients.from_settings(settings)
        client = OrgaClient(redis_url, client=clients.sync(decode_responses=True))
        try:
            app = create_app(client, auth, secret, secure_cookies=settings.inbox_secure_cookies)
            config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                    access_log=False, lifespan="off")  # fmt: skip
            await serve_announced(SignalledServer(config), where, announce)
        finally:
            client.close()

    async def embedded() -> None:
        async with EmbeddedRuntime(settings, home, key_fds=key_fds) as runtime:
            await serve(runtime.url, f"the embedded runtime in {home}")

    if settings.redis_url:
        asyncio.run(serve(settings.redis_url, "ORGA_REDIS_URL"))
    else:
        asyncio.run(embedded())


class SignalledServer(uvicorn.Server):
    """uvicorn's server, but SIGINT and SIGTERM end :func:`run_inbox` normally (uvicorn re-raises
    the signal after its shutdown, which would kill the process before the embedded runtime
    stops its workers and its Redis)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


async def serve_announced(
    server: uvicorn.Server,
    where: str,
    announce: Callable[[str], None],
    what: str = "review inbox",
    path: str = "/",
) -> None:
    """Serve, and say where once the socket is bound (the actual port when 0 was asked)."""
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        announce(f"{what} on http://{server.config.host}:{port}{path} (tasks of {where})")
    await serving
