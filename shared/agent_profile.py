"""Named agent profiles: the model, tools, policy, system prompt and limits a task can start from.

An operator registers a profile with ``orga agents add FILE`` (YAML or JSON; unknown fields are
errors, as in a task file). A task names one with ``agent: NAME`` and may override any field:
the coordinator merges the profile under the task at intake, then validates the merged task
(:func:`apply_agent`). Mappings merge key by key (the task wins), lists and scalars are replaced,
and a mapping whose ``kind`` differs from the profile's (``provider``, ``policy``) replaces it
whole, so options of another kind never leak in. This module is pure: the registry itself is
:mod:`coordinator.agents`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.delegation import WorkspaceMode
from shared.errors import OrgaError
from shared.mcp import McpServerSpec, check_no_credentials, check_unique_names
from shared.policy import PolicySpec
from shared.task_spec import (
    AGENT_NAME_PATTERN,
    ProviderSpec,
    TaskLimits,
    TaskSpec,
    TaskSpecError,
    decode_task_text,
    describe_validation_error,
    parse_task,
)
from shared.tool_profile import ToolProfile

__all__ = [
    "AgentProfile",
    "AgentProfileError",
    "apply_agent",
    "load_agent_file",
    "named_agents",
    "parse_agent",
    "resolve_agent",
    "resolve_critics",
    "unknown_agent",
]


class AgentProfileError(OrgaError, ValueError):
    """An agent file is not a valid profile; the message names the field and the fix."""


class AgentProfile(BaseModel):
    """A registered agent: every field but ``name`` and ``description`` is a task default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=AGENT_NAME_PATTERN)
    description: str | None = None
    provider: ProviderSpec | None = None
    system_prompt: str | None = None
    tools: list[str] | None = None
    tool_profile: ToolProfile | None = None
    mcp_servers: list[McpServerSpec] | None = None
    """The profile's MCP servers; a task that declares ``mcp_servers`` replaces them."""
    policy: PolicySpec | None = None
    limits: TaskLimits | None = None
    delegated_workspace: WorkspaceMode | None = None
    """As a sub-agent: ``subfolder`` (the default) of the parent's workspace, or a ``copy``."""

    @field_validator("mcp_servers")
    @classmethod
    def _unique_mcp_servers(cls, servers: list[McpServerSpec] | None) -> list[McpServerSpec] | None:
        check_unique_names(servers or [], "mcp_servers")
        check_no_credentials(servers or [], "mcp_servers")
        return servers

    def task_defaults(self) -> dict[str, Any]:
        """The task fields this profile sets, as JSON data (what a task's fields override).

        The knowledge of a task started from a profile is the agent's own (``agent_id`` is the
        profile's name unless the task sets it).
        """
        data = self.model_dump(
            mode="json", exclude_unset=True, exclude_none=True, exclude={"name", "description"}
        )
        return {"agent_id": self.name, **data}

    def to_json(self) -> str:
        """The stored form: only the fields the file set, so defaults stay the task's."""
        return self.model_dump_json(exclude_unset=True)


def parse_agent(data: Any, source: str = "agent") -> AgentProfile:
    """Validate decoded profile data; AgentProfileError naming every field at fault."""
    if not isinstance(data, dict):
        raise AgentProfileError(
            f"{source}: an agent profile must be a mapping with at least 'name', "
            f"got {type(data).__name__}"
        )
    try:
        return AgentProfile.model_validate(data)
    except ValidationError as exc:
        raise AgentProfileError(f"{source}: {describe_validation_error(exc)}") from exc


def load_agent_file(path: str | Path) -> AgentProfile:
    """Read a YAML or JSON profile; relative paths (a script, policy files) are taken from the
    file's folder, as in a task file."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise AgentProfileError(f"cannot read agent file {str(file)!r}: {exc.strerror}") from exc
    try:
        data = decode_task_text(raw, str(file))
    except TaskSpecError as exc:
        raise AgentProfileError(str(exc).replace("the task", "the profile")) from exc
    return _resolve_paths(parse_agent(data, str(file)), file.parent)


def _resolve_paths(profile: AgentProfile, base: Path) -> AgentProfile:
    update: dict[str, Any] = {}
    provider = profile.provider
    if provider is not None and provider.script and not Path(provider.script).is_absolute():
        update["provider"] = provider.model_copy(
            update={"script": str((base / provider.script).resolve())}
        )
    policy = profile.policy
    if policy is not None and policy.policy_files:
        files = [str((base / f).resolve()) for f in policy.policy_files]
        update["policy"] = policy.model_copy(update={"policy_files": files})
    return profile.model_copy(update=update) if update else profile


def apply_agent(task: dict[str, Any], profile: AgentProfile) -> dict[str, Any]:
    """The task's data with the profile's fields under it (the task's own values win)."""
    return _merge(profile.task_defaults(), task)


def resolve_agent(
    data: Any,
    profiles: Mapping[str, AgentProfile],
    source: str,
    known: Sequence[str] | None = None,
) -> TaskSpec:
    """Validate decoded task data merged first with the profile it names, if any, from
    ``profiles``, its steps' agent critics resolved (:func:`resolve_critics`); TaskSpecError
    naming the agent and the known ones (``known``, else every name in ``profiles``) when one
    is not there."""
    names = list(profiles) if known is None else list(known)
    name = data.get("agent") if isinstance(data, dict) else None
    if not isinstance(name, str):
        return resolve_critics(parse_task(data, source), profiles, source, names)
    profile = profiles.get(name)
    if profile is None:
        raise unknown_agent(source, name, names)
    return resolve_critics(parse_task(apply_agent(data, profile), source), profiles, source, names)


def named_agents(data: Any) -> list[str]:
    """The agents decoded task data names: its own ``agent`` and its steps' critics'
    (what the intake reads from the registry)."""
    if not isinstance(data, dict):
        return []
    names = [data["agent"]] if isinstance(data.get("agent"), str) else []
    steps = data.get("steps")
    for step in steps if isinstance(steps, list) else []:
        critic = step.get("critic") if isinstance(step, dict) else None
        if isinstance(critic, dict) and isinstance(critic.get("agent"), str):
            names.append(critic["agent"])
    return list(dict.fromkeys(names))


def resolve_critics(
    spec: TaskSpec,
    profiles: Mapping[str, AgentProfile],
    source: str,
    known: Sequence[str] | None = None,
) -> TaskSpec:
    """Each step's agent critic with its registered profile's provider and system prompt under
    the critic's own overrides; TaskSpecError naming the step and the known agents for a
    critic naming an agent the deployment does not know."""
    steps = []
    for index, step in enumerate(spec.steps):
        critic = step.critic
        if critic is None or critic.agent is None:
            steps.append(step)
            continue
        profile = profiles.get(critic.agent)
        if profile is None:
            names = list(profiles) if known is None else list(known)
            raise unknown_agent(f"{source}: steps.{index}.critic", critic.agent, names)
        below = (
            profile.provider.model_dump(mode="json", exclude_unset=True)
            if (profile.provider is not None)
            else {}
        )
        over = (
            critic.provider.model_dump(mode="json", exclude_unset=True)
            if (critic.provider is not None)
            else {}
        )
        resolved = critic.model_copy(
            update={
                "provider": ProviderSpec.model_validate(_merge(below, over)),
                "system_prompt": critic.system_prompt or profile.system_prompt,
            }
        )
        steps.append(step.model_copy(update={"critic": resolved}))
    return spec.model_copy(update={"steps": steps}) if spec.steps else spec


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict) and _same_kind(below, value):
            merged[key] = _merge(below, value)
        else:
            merged[key] = value
    return merged


def _same_kind(below: dict[str, Any], over: dict[str, Any]) -> bool:
    return "kind" not in over or "kind" not in below or below["kind"] == over["kind"]


def unknown_agent(source: str, name: str, known: list[str]) -> TaskSpecError:
    """The intake error of a task naming an agent the deployment does not know."""
    listed = ", ".join(repr(n) for n in sorted(known)) or "none"
    return TaskSpecError(
        f"{source}: agent: {name!r} is not a registered agent; known agents: {listed} "
        "(register it with `orga agents add FILE`, or fix the name)"
    )
