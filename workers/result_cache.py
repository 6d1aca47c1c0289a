"""The last successful result of each tool call, for the CachedResult recovery strategy.

A call is identified by the tool name, its *scope* and its *canonical* arguments (JSON with
sorted keys and no spaces, hashed with SHA-256), so ``{"a": 1, "b": 2}`` and ``{"b":2,"a":1}``
are one call. The scope (:func:`call_scope`) is the task id and the workspace of the call: the
same ``file_read`` in another task or another workspace is another call, and never gets this
one's result. The executor stores every successful result; CachedResult answers with one no
older than its ``max_staleness``. An empty scope (the default of ``get`` and ``put``) is the
unscoped call of a caller that has no task.

Two implementations of :class:`ResultCache`: :class:`InMemoryResultCache` (bounded, least
recently stored evicted first, injectable clock) and :class:`RedisResultCache` (one string per
call under ``keys.result_cache_key``, expiring after ``keys.result_cache_ttl_s``). In Redis the
age of an entry is its TTL minus its remaining ``PTTL``: only the server's clock counts, and the
TTL also bounds the staleness any reader can get.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from redis.asyncio import Redis

from shared import keys

__all__ = [
    "CachedToolResult",
    "InMemoryResultCache",
    "RedisResultCache",
    "ResultCache",
    "arguments_digest",
    "call_digest",
    "call_scope",
    "canonical_arguments",
]


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """The arguments as canonical JSON: sorted keys, no spaces, unicode kept."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of the canonical arguments."""
    return hashlib.sha256(canonical_arguments(arguments).encode()).hexdigest()


def call_scope(task_id: str | None, workspace: Path | str) -> str:
    """The scope of a call: its task and workspace, as canonical JSON."""
    return canonical_arguments({"task_id": task_id, "workspace": str(workspace)})


def call_digest(arguments: Mapping[str, Any], scope: str = "") -> str:
    """SHA-256 hex digest of a call: the arguments alone when unscoped, else scope and
    arguments together."""
    if not scope:
        return arguments_digest(arguments)
    text = canonical_arguments({"arguments": arguments, "scope": scope})
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CachedToolResult:
    """A stored successful result and how old it is."""

    content: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    age_s: float = 0.0


@runtime_checkable
class ResultCache(Protocol):
    """Stores successful tool results and returns them while they are fresh enough."""

    async def get(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        max_staleness_s: float,
        *,
        scope: str = "",
    ) -> CachedToolResult | None:
        """The last result of this call in ``scope`` if at most ``max_staleness_s`` old."""
        ...

    async def put(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        content: str,
        metadata: Mapping[str, str],
        *,
        scope: str = "",
    ) -> None:
        """Remember a successful result of this call in ``scope`` (replacing the previous)."""
        ...


class InMemoryResultCache:
    """Results of one process, at most ``max_entries`` (the least recently stored go first)."""

    def __init__(
        self, *, max_entries: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, str, dict[str, str]]] = (
            OrderedDict()
        )

    async def get(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        max_staleness_s: float,
        *,
        scope: str = "",
    ) -> CachedToolResult | None:
        """The last result of this call if fresh enough."""
        entry = self._entries.get((tool_name, call_digest(arguments, scope)))
        if entry is None:
            return None
        stored_at, content, metadata = entry
        age_s = max(0.0, self._clock() - stored_at)
        if age_s > max_staleness_s:
            return None
        return CachedToolResult(content, dict(metadata), age_s)

    async def put(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        content: str,
        metadata: Mapping[str, str],
        *,
        scope: str = "",
    ) -> None:
        """Remember a successful result; evicts the oldest entry when full."""
        key = (tool_name, call_digest(arguments, scope))
        self._entries.pop(key, None)
        self._entries[key] = (self._clock(), content, dict(metadata))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


class RedisResultCache:
    """Results in Redis strings with a TTL, shared by every worker.

    Works with any ``redis.asyncio.Redis`` client, ``decode_responses`` on or off.
    """

    def __init__(self, client: Redis, *, ttl_s: float = keys.result_cache_ttl_s) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._client = client
        self._ttl_ms = math.ceil(ttl_s * 1000)

    async def get(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        max_staleness_s: float,
        *,
        scope: str = "",
    ) -> CachedToolResult | None:
        """The last result of this call if fresh enough (age measured by the server)."""
        key = keys.result_cache_key(tool_name, call_digest(arguments, scope))
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            raw, remaining_ms = await pipe.execute()
        if raw is None or remaining_ms is None or int(remaining_ms) < 0:
            return None
        payload = json.loads(raw)
        age_s = max(0, int(payload["ttl_ms"]) - int(remaining_ms)) / 1000
        if age_s > max_staleness_s:
            return None
        return CachedToolResult(payload["content"], dict(payload["metadata"]), age_s)

    async def put(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        content: str,
        metadata: Mapping[str, str],
        *,
        scope: str = "",
    ) -> None:
        """Remember a successful result for ``ttl_s``."""
        key = keys.result_cache_key(tool_name, call_digest(arguments, scope))
        payload = {"content": content, "metadata": dict(metadata), "ttl_ms": self._ttl_ms}
        await self._client.set(key, json.dumps(payload), px=self._ttl_ms)
