"""The embedded default: a private Redis, a Celery worker and a coordinator in one process tree.

``orga run`` without ``ORGA_REDIS_URL`` uses this. It runs exactly the deployment code path (the
same coordinator, a reasoning and a tool ``celery worker`` subprocess as ``orga worker`` starts
them, real Redis Streams), only all on this machine. State lives in ``ORGA_HOME`` (default
``./.orga``) with AOF on, so a later command, say ``orga review decide``, finds the tasks where
the last one left them. One command at a time uses a home: a lock file says which process
holds it. The private Redis requires a password, random at each start, which the workers get
through a socket each (:mod:`workers.key_handoff`), never in an environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from redis.asyncio import Redis

from coordinator.partition_leases import forget_holders
from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator
from coordinator.webhooks import WebhookDeliverer
from orga import topology
from orga.coordinator_main import coordinator_settings, webhook_deliverer
from orga.embedded_redis import EmbeddedRedis
from orga.topology import Role, worker_commands
from shared.errors import OrgaError
from shared.redaction import redact_url
from shared.settings import OrgaSettings

__all__ = ["EmbeddedRuntime", "EmbeddedRuntimeError", "coordinator_settings", "webhook_deliverer"]


class EmbeddedRuntimeError(OrgaError):
    """The embedded runtime could not start."""


@dataclass
class EmbeddedRuntime:
    """Start with ``async with EmbeddedRuntime(settings, home) as runtime:``."""

    settings: OrgaSettings
    home: Path
    worker_concurrency: int | None = None
    """Overrides both workers' defaults (ORGA_REASONING_CONCURRENCY, ORGA_TOOL_CONCURRENCY)."""
    start_worker: bool = True
    key_fds: list[int] | None = None
    """The model key sockets of the reasoning workers, one each (:mod:`workers.key_handoff`);
    None: made from the keys in this process's environment, if any."""
    redis: EmbeddedRedis | None = field(default=None, init=False)
    _lock: IO[str] | None = field(default=None, init=False, repr=False)
    _workers: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False, repr=False)
    _coordinator: Coordinator | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _client: Redis | None = field(default=None, init=False, repr=False)
    _webhooks: WebhookDeliverer | None = field(default=None, init=False, repr=False)
    _webhooks_task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """The private Redis URL."""
        assert self.redis is not None
        return self.redis.url

    @property
    def runtime_settings(self) -> OrgaSettings:
        """The settings with the private Redis filled in."""
        return self.settings.model_copy(update={"redis_url": self.url})

    async def __aenter__(self) -> EmbeddedRuntime:
        self.home.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        data = self.home / "redis"
        data.mkdir(exist_ok=True)
        # A password of its own for each start: a command of an agent can reach 127.0.0.1, and
        # without it could forge observations or approve its own held call. It lives in this
        # process's memory and in each worker's, handed through a socket (worker_commands).
        password = secrets.token_hex(32)
        self.redis = EmbeddedRedis(appendonly=True, directory=data, password=password).start()
        if self.start_worker:
            self._workers = self._spawn_workers()
        self._client = Redis.from_url(self.url)
        settings = self.runtime_settings
        # This process holds the home's lock: it is the only coordinator of this Redis, and a
        # partition lease found there is a killed predecessor's (kept by the AOF).
        await forget_holders(self._client, settings.partitions)
        self._coordinator = Coordinator(
            self._client,
            settings=coordinator_settings(settings),
            publisher=CeleryPublisher.from_settings(settings),
        )
        self._task = asyncio.create_task(self._coordinator.run())
        self._webhooks = webhook_deliverer(settings, self._client)
        if self._webhooks is not None:
            self._webhooks_task = asyncio.create_task(self._webhooks.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._webhooks is not None and self._webhooks_task is not None:
            self._webhooks.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._webhooks_task, 5)
        if self._coordinator is not None and self._task is not None:
            self._coordinator.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)
        self._stop_worker()
        if self._client is not None:
            await self._client.aclose()
        if self.redis is not None:
            self.redis.stop()
        self._release_lock()

    def _take_lock(self) -> None:
        lock = (self.home / "lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise EmbeddedRuntimeError(
                f"the embedded runtime in {self.home} is in use by pid {holder}; wait for that "
                "command to finish, use another ORGA_HOME, or set ORGA_REDIS_URL"
            ) from exc
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _spawn_workers(self) -> list[subprocess.Popen[bytes]]:
        """The reasoning workers and a tool worker, as ``orga worker`` runs them: no worker's
        environment holds a model key, the reasoning workers read it from a socket
        (:mod:`orga.topology`)."""
        # The URLs go to each worker through a socket, not its environment (worker_commands);
        # ORGA_BROKER_URL is in the settings only, this command handed it to itself.
        environ = {**os.environ, "ORGA_REDIS_URL": self.url}
        if self.settings.broker_url:
            environ["ORGA_BROKER_URL"] = self.settings.broker_url
        # One person watches an embedded run: its answers stream unless they said otherwise.
        environ.setdefault("ORGA_STREAM_TOKENS", "true")
        settings = self.runtime_settings
        if self.worker_concurrency is not None:
            settings = settings.model_copy(update={"worker_concurrency": self.worker_concurrency})
        extra = ["--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"]  # fmt: skip
        key_fds, self.key_fds = self.key_fds, None  # each socket is read by one worker, once
        commands = worker_commands(
            Role.ALL, settings, environ, extra, prefix="embedded-", key_fds=key_fds
        )
        with (self.home / "worker.log").open("ab") as log:
            return topology.start(commands, output=log.fileno())

    def _stop_worker(self) -> None:
        workers, self._workers = self._workers, []
        topology.stop(workers)

    def worker_alive(self) -> bool:
        """False when a worker subprocess has exited."""
        return bool(self._workers) and all(w.poll() is None for w in self._workers)

    def describe(self) -> dict[str, Any]:
        """Where things are, for the CLI's first lines."""
        return {
            "home": str(self.home),
            "redis": redact_url(self.url),
            "worker_log": str(self.home / "worker.log"),
        }
