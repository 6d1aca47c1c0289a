"""The agent registry in Redis (fakeredis) and the resolution of ``agent: NAME`` at intake."""

from __future__ import annotations

import asyncio
import json

import fakeredis
import pytest

from coordinator.agents import AgentExistsError, AgentRegistry, resolve_task_text
from shared import keys
from shared.agent_profile import parse_agent
from shared.task_spec import TaskSpec, TaskSpecError
from tests.conftest import FakeRedisFactory

FIXER = parse_agent(
    {"name": "fixer", "provider": {"kind": "scripted", "replies": ["done"]},
     "limits": {"max_iterations": 4}, "system_prompt": "You fix bugs."}
)  # fmt: skip


def _registry() -> AgentRegistry:
    return AgentRegistry(fakeredis.FakeRedis(decode_responses=True))


def test_add_list_show_remove() -> None:
    """A profile added is listed and read back whole; removed, it is gone."""
    registry = _registry()
    registry.add(FIXER)
    registry.add(parse_agent({"name": "auditor"}))
    assert registry.names() == ["auditor", "fixer"]
    assert [p.name for p in registry.profiles()] == ["auditor", "fixer"]
    assert registry.require("fixer") == FIXER
    assert registry.remove("fixer")
    assert not registry.remove("fixer")
    assert registry.get("fixer") is None


def test_adding_a_taken_name_is_refused_unless_replacing() -> None:
    """A second add of a name says how to overwrite it; --replace does."""
    registry = _registry()
    registry.add(FIXER)
    changed = parse_agent({"name": "fixer", "system_prompt": "other"})
    with pytest.raises(AgentExistsError, match="'fixer' is already registered; use `orga agents"):
        registry.add(changed)
    registry.add(changed, replace=True)
    assert registry.require("fixer").system_prompt == "other"


def test_require_names_the_known_agents() -> None:
    """An unknown name lists the registered ones."""
    registry = _registry()
    registry.add(FIXER)
    with pytest.raises(LookupError, match=r"no agent 'fixr'; known agents: 'fixer'"):
        registry.require("fixr")


def _resolve(fake_redis: FakeRedisFactory, text: str, *profiles: str) -> TaskSpec:
    async def run() -> TaskSpec:
        async with fake_redis() as client:
            for raw in profiles:
                await client.hset(keys.agents_key, json.loads(raw)["name"], raw)
            return await resolve_task_text(client, text, "intake entry 1-0")

    return asyncio.run(run())


def test_a_task_naming_an_agent_is_merged_before_validation(fake_redis: FakeRedisFactory) -> None:
    """The profile fills what the task leaves out; the task's own fields win."""
    text = json.dumps({"goal": "g", "agent": "fixer", "limits": {"tool_timeout": "5s"}})
    spec = _resolve(fake_redis, text, FIXER.to_json())
    assert spec.agent == "fixer"
    assert spec.provider.kind == "scripted"
    assert spec.system_prompt == "You fix bugs."
    assert spec.limits.max_iterations == 4
    assert spec.limits.tool_timeout.total_seconds() == 5


def test_a_task_naming_an_unknown_agent_is_rejected(fake_redis: FakeRedisFactory) -> None:
    """The intake error names the agent and the known ones."""
    text = json.dumps({"goal": "g", "agent": "fixr"})
    with pytest.raises(TaskSpecError) as caught:
        _resolve(fake_redis, text, FIXER.to_json())
    assert "agent: 'fixr' is not a registered agent; known agents: 'fixer'" in str(caught.value)


def test_a_merged_task_is_validated_as_a_whole(fake_redis: FakeRedisFactory) -> None:
    """An override that breaks the merged task is refused with the field at fault."""
    text = json.dumps({"goal": "g", "agent": "fixer", "limits": {"max_iterations": 0}})
    with pytest.raises(TaskSpecError, match=r"limits.max_iterations: Input should be greater"):
        _resolve(fake_redis, text, FIXER.to_json())


def test_a_task_without_an_agent_is_parsed_as_before(fake_redis: FakeRedisFactory) -> None:
    """No ``agent``: the registry is not involved and typos are still refused."""
    assert _resolve(fake_redis, "goal: plain").goal == "plain"
    with pytest.raises(TaskSpecError, match="gaol"):
        _resolve(fake_redis, "goal: g\ngaol: typo")


def test_a_stored_profile_that_no_longer_validates_is_reported(
    fake_redis: FakeRedisFactory,
) -> None:
    """A stale profile in Redis rejects the task with how to re-register it."""
    text = json.dumps({"goal": "g", "agent": "old"})
    with pytest.raises(TaskSpecError, match=r"agent 'old' is no longer a valid profile"):
        _resolve(fake_redis, text, json.dumps({"name": "old", "retired_field": 1}))


def test_a_step_s_critic_is_resolved_from_the_registry(fake_redis: FakeRedisFactory) -> None:
    """The critic agent's provider and system prompt are filled in at intake, under the
    critic's own overrides; the task's own agent is resolved beside it."""
    critic = parse_agent(
        {
            "name": "rev",
            "provider": {"kind": "openai", "model": "gpt-4o"},
            "system_prompt": "be hard",
        }
    )
    step = {
        "id": "s",
        "instruction": "do it",
        "critic": {"agent": "rev", "rubric": "good", "provider": {"model": "gpt-4o-mini"}},
    }
    text = json.dumps({"goal": "g", "agent": "fixer", "steps": [step]})
    spec = _resolve(fake_redis, text, FIXER.to_json(), critic.to_json())
    resolved = spec.steps[0].critic
    assert resolved is not None
    assert (resolved.provider.kind, resolved.provider.model) == ("openai", "gpt-4o-mini")  # type: ignore[union-attr]
    assert resolved.system_prompt == "be hard"
    assert spec.provider.kind == "scripted"  # the task's agent, not the critic's


def test_a_critic_naming_an_unknown_agent_is_rejected(fake_redis: FakeRedisFactory) -> None:
    """The intake error names the step's critic, the agent and the known agents."""
    step = {"id": "s", "instruction": "x", "critic": {"agent": "revv", "rubric": "good"}}
    with pytest.raises(TaskSpecError) as caught:
        _resolve(fake_redis, json.dumps({"goal": "g", "steps": [step]}), FIXER.to_json())
    assert str(caught.value) == (
        "intake entry 1-0: steps.0.critic: agent: 'revv' is not a registered agent; known "
        "agents: 'fixer' (register it with `orga agents add FILE`, or fix the name)"
    )
