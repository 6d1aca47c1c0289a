"""Agent profiles: validation of a profile file and the merge of a profile under a task."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.agent_profile import (
    AgentProfile,
    AgentProfileError,
    apply_agent,
    load_agent_file,
    parse_agent,
    unknown_agent,
)
from shared.task_spec import parse_task

PROFILE = {
    "name": "fixer",
    "description": "fixes bugs",
    "provider": {"kind": "openai", "model": "gpt-4o-mini"},
    "system_prompt": "You fix bugs.",
    "tools": ["file_read", "file_write"],
    "policy": {"kind": "tool_filter", "allowed_tools": ["file_read", "file_write"]},
    "limits": {"max_iterations": 7, "tool_timeout": "10s"},
}


def test_a_typo_in_a_profile_is_refused_naming_the_field() -> None:
    """An unknown field is an error that names it, like in a task file."""
    with pytest.raises(AgentProfileError) as caught:
        parse_agent({**PROFILE, "sytem_prompt": "x"}, source="fixer.yaml")
    assert str(caught.value) == (
        "fixer.yaml: sytem_prompt: Extra inputs are not permitted (got 'x')"
    )


def test_a_bad_name_is_refused() -> None:
    """A name must be a short identifier, since tasks spell it."""
    with pytest.raises(AgentProfileError, match=r"fixer.yaml: name: String should match"):
        parse_agent({**PROFILE, "name": "has space"}, source="fixer.yaml")


def test_a_profile_must_be_a_mapping() -> None:
    """A list or a scalar is refused with what it got."""
    with pytest.raises(AgentProfileError, match="must be a mapping with at least 'name', got list"):
        parse_agent([PROFILE], source="x.yaml")


def test_task_defaults_hold_only_what_the_profile_set() -> None:
    """Defaults of the profile's models stay out, so a task's defaults are not overridden."""
    profile = parse_agent({"name": "tiny", "limits": {"max_iterations": 3}})
    assert profile.task_defaults() == {"agent_id": "tiny", "limits": {"max_iterations": 3}}


def test_the_stored_form_round_trips_without_defaults() -> None:
    """to_json keeps only set fields and reads back to the same defaults."""
    profile = parse_agent(PROFILE)
    again = AgentProfile.model_validate_json(profile.to_json())
    assert again == profile
    assert again.task_defaults() == profile.task_defaults()


def test_a_task_starts_from_the_profile_and_overrides_fields() -> None:
    """Mappings merge key by key with the task winning; lists are replaced."""
    task = {"goal": "g", "agent": "fixer", "limits": {"max_iterations": 2}, "tools": ["grep"]}
    spec = parse_task(apply_agent(task, parse_agent(PROFILE)))
    assert spec.agent == "fixer"
    assert spec.agent_id == "fixer"
    assert spec.provider.kind == "openai"
    assert spec.provider.model == "gpt-4o-mini"
    assert spec.system_prompt == "You fix bugs."
    assert spec.tools == ["grep"]
    assert spec.limits.max_iterations == 2
    assert spec.limits.tool_timeout.total_seconds() == 10
    assert spec.policy.kind == "tool_filter"


def test_a_section_of_another_kind_replaces_the_profiles() -> None:
    """A task policy of another kind does not inherit the profile's options of its kind."""
    task = {"goal": "g", "agent": "fixer", "policy": {"kind": "permissive"}}
    spec = parse_task(apply_agent(task, parse_agent(PROFILE)))
    assert spec.policy.kind == "permissive"
    assert spec.policy.allowed_tools is None


def test_a_task_may_set_its_own_agent_id() -> None:
    """agent_id defaults to the profile's name but the task's own wins."""
    merged = apply_agent({"goal": "g", "agent_id": "mine"}, parse_agent(PROFILE))
    assert merged["agent_id"] == "mine"


def test_a_profile_file_resolves_relative_paths(tmp_path: Path) -> None:
    """A scripted provider's script is taken from the profile file's folder."""
    (tmp_path / "agent.yaml").write_text(
        "name: scripted\nprovider: {kind: scripted, script: ./script.yaml}\n", encoding="utf-8"
    )
    profile = load_agent_file(tmp_path / "agent.yaml")
    assert profile.provider is not None
    assert profile.provider.script == str((tmp_path / "script.yaml").resolve())


def test_an_unreadable_or_malformed_file_says_so(tmp_path: Path) -> None:
    """A missing file and broken YAML are profile errors naming the file."""
    with pytest.raises(AgentProfileError, match="cannot read agent file"):
        load_agent_file(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(AgentProfileError, match=r"bad\.yaml: not valid YAML or JSON"):
        load_agent_file(tmp_path / "bad.yaml")


def test_an_unknown_agent_error_names_it_and_the_known_ones() -> None:
    """The intake message says which agent, which exist, and how to register one."""
    error = unknown_agent("intake entry 1-0", "fixr", ["reviewer", "fixer"])
    assert str(error) == (
        "intake entry 1-0: agent: 'fixr' is not a registered agent; known agents: 'fixer', "
        "'reviewer' (register it with `orga agents add FILE`, or fix the name)"
    )
    assert "known agents: none" in str(unknown_agent("s", "x", []))
