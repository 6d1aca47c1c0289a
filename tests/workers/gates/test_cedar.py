"""The Cedar gate over cedarpy, with real policy files from tests/fixtures/cedar."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.actions import Allow, Ask, Deny
from shared.errors import ConfigError
from tests.workers.gates.actions import context, decide, delegate, respond, terminate, tool
from workers.gates.cedar import CedarGate, cedar_request

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cedar"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "policies" / "orga.cedar"


@pytest.fixture(scope="module")
def gate() -> CedarGate:
    """Policies from two files: tools.cedar, then finish.cedar."""
    return CedarGate([FIXTURES / "tools.cedar", FIXTURES / "finish.cedar"])


def reason_of(decision: object) -> str:
    """The reason of a Deny (fails the test for anything else)."""
    assert isinstance(decision, Deny), decision
    return decision.reason


def test_permitted_tool_allowed(gate: CedarGate) -> None:
    """A tool named in a permit policy is allowed."""
    assert isinstance(decide(gate, tool("file_read", {"path": "a.py"})), Allow)


def test_permit_by_principal(gate: CedarGate) -> None:
    """run_command is permitted for Agent::"builder" only."""
    action = tool("run_command", {"command": "make"})
    assert isinstance(
        decide(gate, action, context().model_copy(update={"agent_id": "builder"})), Allow
    )
    assert reason_of(decide(gate, action)) == (
        'Cedar denied Action::"tool_call" on Tool::"run_command" for Agent::"agent-1": '
        "no permit policy matched"
    )


def test_forbid_by_argument_in_context(gate: CedarGate) -> None:
    """A forbid reading context.arguments wins over the permit, and is named by its @id."""
    ctx = context().model_copy(update={"agent_id": "builder"})
    decision = decide(gate, tool("run_command", {"command": "rm -rf build"}), ctx)
    assert reason_of(decision) == (
        'Cedar denied Action::"tool_call" on Tool::"run_command" for Agent::"builder": '
        "forbidden by 'no-recursive-rm' (tools.cedar)"
    )


def test_unnamed_policy_labelled_by_position(gate: CedarGate) -> None:
    """A policy without @id is named by its position in its file."""
    decision = decide(gate, tool("grep", {"pattern": "x"}), context(task_id="locked-task"))
    assert reason_of(decision).endswith("forbidden by policy #4 (tools.cedar)")


def test_default_deny(gate: CedarGate) -> None:
    """A tool no policy permits is denied."""
    decision = decide(gate, tool("web_fetch", {"url": "https://x"}))
    assert reason_of(decision).endswith(": no permit policy matched")


def test_policies_from_the_second_file(gate: CedarGate) -> None:
    """Respond and terminate are permitted by finish.cedar."""
    assert isinstance(decide(gate, respond()), Allow)
    assert isinstance(decide(gate, terminate()), Allow)


def test_delegation_resource_and_context(gate: CedarGate) -> None:
    """A delegation is Action::"delegate" on Agent::"<target>" with delegation_depth."""
    assert isinstance(decide(gate, delegate("reviewer")), Allow)
    assert isinstance(decide(gate, delegate("reviewer"), context(delegation_depth=2)), Deny)
    assert reason_of(decide(gate, delegate("stranger"))).startswith(
        'Cedar denied Action::"delegate" on Agent::"stranger" for Agent::"agent-1"'
    )


def test_evaluation_error_fails_closed() -> None:
    """A policy that errors (no `has` guard) denies, even though Cedar itself would allow."""
    gate = CedarGate(FIXTURES / "unguarded.cedar")
    decision = decide(gate, tool("file_read", {"path": "a"}))
    assert reason_of(decision) == (
        'Cedar evaluation error for Action::"tool_call" on Tool::"file_read" for '
        'Agent::"agent-1" (failing closed); errors: error while evaluating policy '
        "`'unguarded-command-check' (unguarded.cedar)`: record does not have the attribute "
        "`command`"
    )
    assert isinstance(decide(gate, tool("run_command", {"command": "ls"})), Allow)


def test_missing_policy_file() -> None:
    """A missing file is a ConfigError naming it."""
    missing = FIXTURES / "nope.cedar"
    with pytest.raises(ConfigError, match=f"Cedar policy file {missing} does not exist"):
        CedarGate([FIXTURES / "tools.cedar", missing])


def test_unparsable_policy_file() -> None:
    """A policy that does not parse is a ConfigError naming the file and the parse error."""
    with pytest.raises(ConfigError) as caught:
        CedarGate(FIXTURES / "broken.cedar")
    message = str(caught.value)
    assert message.startswith(f"Cedar policy file {FIXTURES / 'broken.cedar'} does not parse: ")
    assert "unexpected token" in message


def test_no_policy_files() -> None:
    """At least one file is needed."""
    with pytest.raises(ConfigError, match="at least one policy file"):
        CedarGate([])


def test_request_shape() -> None:
    """Principal, action, resource and context as documented; nulls dropped, floats as text."""
    action = tool("run_command", {"command": "ls", "timeout_s": 2.5, "env": None, "n": 2**70})
    request = cedar_request(action, context(task_id="t1", attributes={"tier": "dev"}))
    assert request == {
        "principal": {"type": "Agent", "id": "agent-1"},
        "action": {"type": "Action", "id": "tool_call"},
        "resource": {"type": "Tool", "id": "run_command"},
        "context": {
            "call_id": "call-1",
            "arguments": {"command": "ls", "timeout_s": "2.5", "n": str(2**70)},
            "task_id": "t1",
            "iteration": 0,
            "delegation_depth": 0,
            "attributes": {"tier": "dev"},
        },
    }


def test_respond_and_terminate_requests() -> None:
    """Respond and terminate carry lengths and the reason, on Response resources."""
    assert cedar_request(respond("hello"), context())["context"]["content_length"] == 5
    request = cedar_request(terminate("stuck"), context())
    assert request["resource"] == {"type": "Response", "id": "terminate"}
    assert request["context"]["reason"] == "stuck"


def test_entity_escape_in_arguments_denied(gate: CedarGate) -> None:
    """An argument key Cedar would read as an entity reference is refused, not passed."""
    action = tool("file_read", {"path": {"__entity": {"type": "Agent", "id": "admin"}}})
    assert reason_of(decide(gate, action)) == (
        "Cedar request could not be built: key '__entity' is reserved by Cedar's JSON format "
        "and cannot be passed"
    )


def test_odd_names_are_safe(gate: CedarGate) -> None:
    """Tool and agent names with quotes or newlines do not break the request."""
    decision = decide(gate, tool('we"ird\nname'), context().model_copy(update={"agent_id": 'a"b'}))
    assert reason_of(decision).endswith("no permit policy matched")


def test_example_policy_file() -> None:
    """examples/policies/orga.cedar loads and does what its comments say."""
    gate = CedarGate(EXAMPLE)
    assert isinstance(decide(gate, tool("run_command", {"command": "pytest"})), Allow)
    assert isinstance(decide(gate, tool("run_command", {"command": "rm -rf x"})), Deny)
    assert isinstance(decide(gate, tool("run_command", {"command": "git push origin x"})), Ask)
    assert isinstance(decide(gate, tool("web_fetch", {"url": "https://x"})), Deny)
    assert isinstance(decide(gate, respond()), Allow)
    assert isinstance(decide(gate, delegate(), context(delegation_depth=1)), Allow)
    assert isinstance(decide(gate, delegate(), context(delegation_depth=2)), Deny)
