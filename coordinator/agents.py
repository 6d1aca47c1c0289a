"""The agent registry in Redis, and the resolution of ``agent: NAME`` at intake.

Profiles live in one hash, ``orga:agents`` (name -> profile JSON, :mod:`shared.keys`). The CLI
manages them through :class:`AgentRegistry` (synchronous, like :class:`OrgaClient`); the
coordinator's intake calls :func:`resolve_task_text`, which merges the named profile under the
task before the merged task is validated, and refuses a task naming an unknown agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis
from pydantic import ValidationError
from redis.asyncio import Redis as AsyncRedis

from shared import keys
from shared.agent_profile import AgentProfile, named_agents, resolve_agent
from shared.errors import OrgaError
from shared.task_spec import (
    TaskSpec,
    TaskSpecError,
    decode_task_text,
    describe_validation_error,
    parse_task,
)

__all__ = ["AgentExistsError", "AgentRegistry", "resolve_task_text"]


class AgentExistsError(OrgaError):
    """An agent of that name is already registered (``--replace`` overwrites it)."""


@dataclass
class AgentRegistry:
    """Add, read and remove agent profiles (the ``orga agents`` commands)."""

    redis: redis.Redis

    def add(self, profile: AgentProfile, replace: bool = False) -> None:
        """Register a profile; AgentExistsError when the name is taken and not ``replace``."""
        if replace:
            self.redis.hset(keys.agents_key, profile.name, profile.to_json())
        elif not self.redis.hsetnx(keys.agents_key, profile.name, profile.to_json()):
            raise AgentExistsError(
                f"agent {profile.name!r} is already registered; use `orga agents add FILE "
                f"--replace` to overwrite it, or `orga agents remove {profile.name}` first"
            )

    def get(self, name: str) -> AgentProfile | None:
        """The profile registered under ``name``, or None."""
        raw = self.redis.hget(keys.agents_key, name)
        return None if raw is None else AgentProfile.model_validate_json(raw)

    def require(self, name: str) -> AgentProfile:
        """The profile registered under ``name``; LookupError naming the known ones."""
        profile = self.get(name)
        if profile is None:
            known = ", ".join(repr(n) for n in self.names()) or "none"
            raise LookupError(f"no agent {name!r}; known agents: {known}")
        return profile

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(_text(n) for n in cast("list[Any]", self.redis.hkeys(keys.agents_key)))

    def profiles(self) -> list[AgentProfile]:
        """Every registered profile, by name."""
        raw = cast("dict[Any, Any]", self.redis.hgetall(keys.agents_key))
        found = [AgentProfile.model_validate_json(v) for v in raw.values()]
        return sorted(found, key=lambda p: p.name)

    def remove(self, name: str) -> bool:
        """Unregister ``name``; False when it was not registered. Tasks already accepted keep
        the fields they were merged with."""
        return bool(self.redis.hdel(keys.agents_key, name))


async def resolve_task_text(redis_client: AsyncRedis, text: str | bytes, source: str) -> TaskSpec:
    """Validate a submitted task, merged first with the agent profile it names, if any, its
    steps' agent critics resolved to their profiles' provider and system prompt.

    TaskSpecError (the intake rejects the task with it) for text that is not UTF-8 (naming the
    byte offset), an invalid task or merged task,
    and for an agent (the task's or a critic's) the registry does not know, naming the known
    ones.
    """
    data = decode_task_text(text, source)
    names = named_agents(data)
    if not names:
        return parse_task(data, source)
    found = await redis_client.hmget(keys.agents_key, names)
    profiles = {
        name: _profile(name, raw, source) for name, raw in zip(names, found, strict=True) if raw
    }
    known = None
    if len(profiles) < len(names):
        known = [_text(n) for n in await redis_client.hkeys(keys.agents_key)]
    return resolve_agent(data, profiles, source, known=known)


def _profile(name: str, raw: Any, source: str) -> AgentProfile:
    try:
        return AgentProfile.model_validate_json(raw)
    except ValidationError as exc:
        raise TaskSpecError(
            f"{source}: the registered agent {name!r} is no longer a valid profile "
            f"({describe_validation_error(exc)}); re-register it with `orga agents add FILE "
            "--replace`"
        ) from exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
