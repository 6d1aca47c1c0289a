"""What the ``orga agents`` and ``orga schedule`` commands share: a Redis connection (the
deployment's, or the embedded runtime's without a worker), literal output and exit codes.

Exit codes follow ``orga``'s: 1 an error (an unknown name), 2 invalid input.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis
import typer
from rich.console import Console
from rich.text import Text

from orga.embedded import EmbeddedRuntime, EmbeddedRuntimeError
from orga.redis_client import RedisClients
from shared import aio
from shared.settings import OrgaSettings

__all__ = ["err", "fail", "out", "say", "with_redis"]

T = TypeVar("T")

out = Console()
err = Console(stderr=True)


def say(*parts: str | tuple[str, str], console: Console = out) -> None:
    """Print text literally (never read as Rich markup), unwrapped."""
    console.print(Text.assemble(*parts), soft_wrap=True)


def fail(prefix: str, message: object, code: int) -> typer.Exit:
    """Print ``prefix message`` on stderr; the exit to raise."""
    say((prefix, "red"), " ", str(message), console=err)
    return typer.Exit(code)


def with_redis(body: Callable[[redis.Redis], T]) -> T:
    """Run ``body`` on ORGA_REDIS_URL, or on the embedded runtime's Redis in ORGA_HOME (its
    coordinator runs meanwhile, no worker)."""
    settings = OrgaSettings()
    if settings.redis_url:
        return _on(RedisClients.from_settings(settings), body)
    home = Path(os.environ.get("ORGA_HOME", ".orga")).resolve()

    async def embedded() -> T:
        async with EmbeddedRuntime(settings, home, start_worker=False) as runtime:
            return await asyncio.to_thread(_on, RedisClients(runtime.url), body)

    try:
        return aio.run(embedded())
    except EmbeddedRuntimeError as exc:
        raise fail("error:", exc, 1) from exc


def _on(clients: RedisClients, body: Callable[[redis.Redis], T]) -> T:
    client = clients.sync(decode_responses=True)
    try:
        return body(client)
    finally:
        client.close()
