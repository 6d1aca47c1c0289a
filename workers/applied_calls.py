"""Calls applied once: a writing tool's result kept under the call's idempotency key.

A tool call can be delivered more than once (a Celery redelivery, a re-dispatch at the
deadline, a reasoning re-sent after its worker died). A tool that declares ``applies_once``
(``file_write``) runs once per idempotency key: a later delivery of the same call gets the kept
result, marked ``metadata["replayed"] = "true"``, and changes nothing, so a late duplicate can
never overwrite what the task wrote after it. The key is the call's place in its task (the fence
without its attempt and nonce, which change on re-dispatch) plus the tool and a digest of its
arguments (a re-sent reasoning may propose other calls under the same call id).

The result is kept after the call succeeded: a worker killed between the write and the record
lets the call run again (the same content written again, harmless before the task moved on).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from redis.asyncio import Redis

from shared import keys
from workers.result_cache import arguments_digest
from workers.tools.base import ToolOutput

__all__ = [
    "AppliedCalls",
    "InMemoryAppliedCalls",
    "RedisAppliedCalls",
    "applies_once",
    "call_key",
]


def applies_once(tool: object) -> bool:
    """Whether ``tool`` declares ``applies_once = True`` (its effect must not repeat)."""
    return getattr(tool, "applies_once", False) is True


def call_key(base: str, tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The idempotency key of one call: ``{base}:{tool}:{arguments digest}``."""
    return f"{base}:{tool_name}:{arguments_digest(arguments)}"


class AppliedCalls(Protocol):
    """Results of calls already applied, by idempotency key."""

    async def get(self, key: str) -> ToolOutput | None:
        """The result kept for ``key``, or None when the call was never applied."""
        ...

    async def put(self, key: str, output: ToolOutput) -> None:
        """Keep the result of the call applied under ``key``."""
        ...


class InMemoryAppliedCalls:
    """For one process (the in-process runner, tests): the last ``max_keys`` calls."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._kept: OrderedDict[str, ToolOutput] = OrderedDict()
        self._max_keys = max_keys

    async def get(self, key: str) -> ToolOutput | None:
        """The kept result."""
        return self._kept.get(key)

    async def put(self, key: str, output: ToolOutput) -> None:
        """Keep it, dropping the oldest beyond ``max_keys``."""
        self._kept[key] = output
        while len(self._kept) > self._max_keys:
            self._kept.popitem(last=False)


class RedisAppliedCalls:
    """Shared by every tool worker: ``orga:applied:{sha256 of the key}`` with a TTL."""

    def __init__(self, client: Redis, *, ttl_s: float = keys.applied_call_ttl_s) -> None:
        self._client = client
        self._ttl_ms = math.ceil(ttl_s * 1000)

    async def get(self, key: str) -> ToolOutput | None:
        """The kept result."""
        raw = await self._client.get(_redis_key(key))
        return None if raw is None else ToolOutput.model_validate_json(raw)

    async def put(self, key: str, output: ToolOutput) -> None:
        """Keep it for ``ttl_s``; the first result stays (a racing duplicate does not replace
        it)."""
        await self._client.set(_redis_key(key), output.model_dump_json(), px=self._ttl_ms, nx=True)


def _redis_key(key: str) -> str:
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()
    return keys.applied_call_key(digest)
