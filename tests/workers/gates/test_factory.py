"""build_gate from a task file's policy spec, and one contract suite run over every gate kind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.actions import Allow, Deny
from shared.errors import ConfigError
from shared.policy import DEFAULT_GATE_RULES, PolicySpec
from tests.fakes.opa_server import FakeOpaServer
from tests.workers.gates.actions import ALL_KINDS, context, decide, respond, terminate, tool
from workers.gates import build_gate
from workers.gates.base import ReasoningPolicyGate
from workers.gates.cedar import CedarGate
from workers.gates.composite import CompositeGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.opa import OpaGate
from workers.gates.permissive import PermissiveGate
from workers.gates.tool_filter import ToolFilterGate

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_CEDAR = REPO / "examples" / "policies" / "orga.cedar"


@pytest.fixture(scope="module")
def opa() -> Iterator[FakeOpaServer]:
    """A fake OPA allowing everything but web_fetch."""
    with FakeOpaServer() as server:
        server.set_decision("orga/allow", lambda doc: doc.get("tool_name") != "web_fetch")
        yield server


def test_default_kind_is_the_default_gate() -> None:
    """An empty policy block gives the default gate."""
    assert isinstance(build_gate(PolicySpec()), DefaultPolicyGate)


def test_each_kind_builds_its_gate(opa: FakeOpaServer) -> None:
    """Each kind maps to its gate class."""
    assert isinstance(build_gate(PolicySpec(kind="permissive")), PermissiveGate)
    assert isinstance(
        build_gate(PolicySpec(kind="tool_filter", allowed_tools=["grep"])), ToolFilterGate
    )
    cedar = build_gate(PolicySpec(kind="cedar", policy_files=[str(EXAMPLE_CEDAR)]))
    assert isinstance(cedar, CedarGate)
    gate = build_gate(PolicySpec(kind="opa", opa_url=opa.url, opa_path="orga.allow", timeout_s=1))
    assert isinstance(gate, OpaGate)
    assert gate.endpoint == f"{opa.url}/v1/data/orga/allow"


def test_default_options_reach_the_gate() -> None:
    """deny_patterns and disabled_rules configure the default gate."""
    spec = PolicySpec(deny_patterns=[r"\bnpm publish\b"], disabled_rules=["rm-workspace-wipe"])
    gate = build_gate(spec)
    assert isinstance(gate, DefaultPolicyGate)
    names = [rule.name for rule in gate.command_rules]
    assert "custom-1" in names
    assert "rm-workspace-wipe" not in names
    assert isinstance(decide(gate, tool("run_command", {"command": "npm publish"})), Deny)


def test_allowed_tools_put_a_filter_in_front() -> None:
    """allowed_tools with another kind composes a tool filter before that gate."""
    gate = build_gate(PolicySpec(kind="default", allowed_tools=["grep"]))
    assert isinstance(gate, CompositeGate)
    assert decide(gate, tool("file_read", {"path": "a"})) == Deny(
        reason="Tool 'file_read' not in allowed list"
    )
    assert isinstance(decide(gate, tool("grep", {"pattern": "a"})), Allow)


def test_relative_policy_files_from_base_dir() -> None:
    """Relative Cedar files are read from the task file's directory."""
    spec = PolicySpec(kind="cedar", policy_files=["policies/orga.cedar"])
    gate = build_gate(spec, base_dir=REPO / "examples")
    assert isinstance(gate, CedarGate)
    assert gate.policy_files == (REPO / "examples" / "policies" / "orga.cedar",)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "tool_filter"}, "needs allowed_tools"),
        ({"kind": "cedar"}, "needs policy_files"),
        ({"kind": "opa"}, "needs opa_url"),
        ({"kind": "default", "policy_files": ["x.cedar"]}, r"does not use \['policy_files'\]"),
        ({"kind": "cedar", "policy_files": ["x.cedar"], "opa_url": "http://o"}, r"\['opa_url'\]"),
        ({"kind": "permissive", "deny_patterns": ["x"]}, r"\['deny_patterns'\]"),
    ],
)
def test_options_that_do_not_fit_the_kind_are_refused_by_the_spec(
    fields: dict[str, object], message: str
) -> None:
    """Missing or stray options are refused when the task is validated, before any worker."""
    with pytest.raises(ValidationError, match=message):
        PolicySpec.model_validate(fields)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(unclosed", "it is not valid RE2 syntax"), (r"(\w+) \1", "it has a backreference")],
)
def test_deny_patterns_that_re2_refuses_fail_the_spec(pattern: str, why: str) -> None:
    """A deny pattern RE2 cannot take fails validation, naming its index, the pattern and why."""
    with pytest.raises(ValidationError, match=rf"deny pattern 1: the pattern .* {why}"):
        PolicySpec(deny_patterns=["npm publish", pattern])


@pytest.mark.timeout(10)
def test_catastrophic_deny_pattern_runs_in_linear_time(tmp_path: Path) -> None:
    """A task's ``(a+)+$`` deny pattern (issue 12, item 1) lets 34 a's and a '!' pass at once."""
    gate = build_gate(PolicySpec(deny_patterns=["(a+)+$"]))
    command = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"
    started = time.monotonic()
    allowed = decide(gate, tool("run_command", {"command": command}), context(tmp_path))
    assert isinstance(allowed, Allow)
    assert time.monotonic() - started < 2
    denied = decide(gate, tool("run_command", {"command": "echo aaaa"}), context(tmp_path))
    assert isinstance(denied, Deny)
    assert denied.reason.startswith("rule 'custom-1'")


def test_a_spec_that_went_over_the_wire_still_builds() -> None:
    """A spec re-validated from its full JSON (every field present) builds the same gate."""
    spec = PolicySpec.model_validate_json(PolicySpec().model_dump_json())
    assert isinstance(build_gate(spec), DefaultPolicyGate)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (PolicySpec(kind="cedar", policy_files=["/nonexistent/x.cedar"]), "does not exist"),
        (PolicySpec(kind="opa", opa_url="opa:8181"), "must be http"),
        # the spec refuses it first (test_unknown_disabled_rule_is_refused_by_the_spec)
        (PolicySpec.model_construct(disabled_rules=["nope"]), "unknown rule name"),
    ],
)
def test_bad_specs_are_config_errors(spec: PolicySpec, message: str) -> None:
    """Invalid files, URLs and rule names are reported at build time."""
    with pytest.raises(ConfigError, match=message):
        build_gate(spec)


def test_task_file_shape_parses() -> None:
    """The YAML-ish dict of a task file validates into a spec; unknown keys are refused."""
    spec = PolicySpec.model_validate({"kind": "cedar", "policy_files": ["a.cedar"]})
    assert spec.kind == "cedar"
    with pytest.raises(ValidationError):
        PolicySpec.model_validate({"kind": "cedar", "policy_file": ["a.cedar"]})


# -- one contract, every implementation ------------------------------------------------------

KINDS = ["permissive", "default", "tool_filter", "cedar", "opa"]


def _built(kind: str, opa: FakeOpaServer) -> ReasoningPolicyGate:
    specs = {
        "permissive": PolicySpec(kind="permissive"),
        "default": PolicySpec(),
        "tool_filter": PolicySpec(kind="tool_filter", allowed_tools=["search"]),
        "cedar": PolicySpec(kind="cedar", policy_files=[str(EXAMPLE_CEDAR)]),
        "opa": PolicySpec(kind="opa", opa_url=opa.url),
    }
    return build_gate(specs[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_contract_every_action_gets_a_decision(kind: str, opa: FakeOpaServer) -> None:
    """Every gate answers every kind of action with Allow, Deny or Modify, never raising."""
    gate = _built(kind, opa)
    assert isinstance(gate, ReasoningPolicyGate)
    for action in ALL_KINDS:
        decision = decide(gate, action, context(task_id="t", step_id="s"))
        assert decision.decision in ("allow", "deny", "modify")


@pytest.mark.parametrize("kind", KINDS)
def test_contract_respond_and_terminate_allowed(kind: str, opa: FakeOpaServer) -> None:
    """With these configurations every gate lets the agent answer and stop."""
    gate = _built(kind, opa)
    assert isinstance(decide(gate, respond()), Allow)
    assert isinstance(decide(gate, terminate()), Allow)


@pytest.mark.parametrize("kind", ["default", "tool_filter", "cedar", "opa"])
def test_contract_denials_carry_a_reason(kind: str, opa: FakeOpaServer) -> None:
    """A denial always says why (web_fetch of a non-https URL is refused by all four)."""
    gate = _built(kind, opa)
    ctx = context(allowed_tools=frozenset({"search"}))
    decision = decide(gate, tool("web_fetch", {"url": "http://x"}), ctx)
    assert isinstance(decision, Deny)
    assert decision.reason.strip()


def test_policy_spec_knows_every_default_gate_rule() -> None:
    """The rule names a policy may disable are exactly the default gate's rules."""
    gate = DefaultPolicyGate()
    names = {rule.name for rule in gate.command_rules}
    names |= {"workspace-paths", "network-upload", "command-workspace-escape", "delegation-depth"}
    assert set(DEFAULT_GATE_RULES) == names
    for name in DEFAULT_GATE_RULES:
        DefaultPolicyGate(disabled_rules=[name])  # each is accepted by the gate too


def test_unknown_disabled_rule_is_refused_by_the_spec() -> None:
    """A misspelt rule (network_upload) is refused when the task is validated, naming the known."""
    with pytest.raises(ValidationError, match=r"unknown rule name\(s\) \['network_upload'\]"):
        PolicySpec(kind="default", disabled_rules=["network_upload"])
