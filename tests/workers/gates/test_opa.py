"""The OPA gate against a local fake of OPA's data API; an OPA that cannot be asked is an
outage (PolicyUnavailableError), not a denial."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.actions import Allow, Deny, Modify, ToolCallAction
from shared.errors import ConfigError, PolicyUnavailableError
from tests.fakes.opa_server import FakeOpaServer, QueuedAnswer, closed_opa_url
from tests.workers.gates.actions import context, decide, delegate, respond, terminate, tool
from workers.gates.opa import OpaGate, normalise_opa_path, opa_input

PATH = "orga/decision"


@pytest.fixture
def opa() -> Iterator[FakeOpaServer]:
    """A running fake OPA server."""
    with FakeOpaServer() as server:
        yield server


def reason_of(decision: object) -> str:
    """The reason of a Deny (fails the test for anything else)."""
    assert isinstance(decision, Deny), decision
    return decision.reason


def test_posts_symbiont_input_shape(opa: FakeOpaServer, tmp_path: Path) -> None:
    """The input is the action in Symbiont's shape plus agent, task, step and workspace."""
    opa.set_decision(PATH, True)
    ctx = context(tmp_path, task_id="t1", step_id="s1", iteration=4, attributes={"tier": "dev"})
    decide(OpaGate(opa.url, PATH), tool("run_command", {"command": "ls"}), ctx)
    assert opa.queries[-1].path == PATH
    assert opa.queries[-1].input == {
        "type": "tool_call",
        "call_id": "call-1",
        "tool_name": "run_command",
        "arguments": {"command": "ls"},
        "agent_id": "agent-1",
        "task_id": "t1",
        "step_id": "s1",
        "iteration": 4,
        "delegation_depth": 0,
        "workspace": str(tmp_path),
        "attributes": {"tier": "dev"},
    }


def test_other_action_shapes() -> None:
    """Delegate, respond and terminate inputs carry Symbiont's fields, then the common ones."""
    ctx = context(task_id="t1")
    common: dict[str, object] = {
        "agent_id": "agent-1",
        "task_id": "t1",
        "step_id": None,
        "iteration": 0,
        "delegation_depth": 0,
        "workspace": None,
        "attributes": {},
    }
    assert opa_input(delegate("rev", "abc"), ctx) == {
        "type": "delegate",
        "call_id": "call-d",
        "target": "rev",
        "message_length": 3,
        **common,
    }
    assert opa_input(respond("hello"), ctx) == {"type": "respond", "content_length": 5, **common}
    assert opa_input(terminate("stuck"), ctx) == {"type": "terminate", "reason": "stuck", **common}


@pytest.mark.parametrize(("result", "allowed"), [(True, True), (False, False)])
def test_boolean_result(opa: FakeOpaServer, result: bool, allowed: bool) -> None:
    """{"result": true} allows; {"result": false} denies with a reason naming the policy."""
    opa.set_decision(PATH, result)
    decision = decide(OpaGate(opa.url, PATH), tool("grep", {"pattern": "x"}))
    if allowed:
        assert isinstance(decision, Allow)
    else:
        assert reason_of(decision) == (
            "OPA policy orga/decision denied tool_call 'grep' for agent 'agent-1'"
        )


def test_object_result_with_reason(opa: FakeOpaServer) -> None:
    """An object result denies with the policy's own reason."""

    def rule(document: dict[str, Any]) -> dict[str, Any]:
        if "rm -rf" in document["arguments"].get("command", ""):
            return {"allow": False, "reason": "recursive deletes are not allowed"}
        return {"allow": True}

    opa.set_decision(PATH, rule)
    gate = OpaGate(opa.url, PATH)
    assert isinstance(decide(gate, tool("run_command", {"command": "ls"})), Allow)
    denied = decide(gate, tool("run_command", {"command": "rm -rf /tmp/x"}))
    assert denied == Deny(reason="recursive deletes are not allowed")


def test_object_deny_without_reason(opa: FakeOpaServer) -> None:
    """An object deny without a reason gets the default one."""
    opa.set_decision(PATH, {"allow": False})
    assert reason_of(decide(OpaGate(opa.url, PATH), delegate("x"))) == (
        "OPA policy orga/decision denied delegate to 'x' for agent 'agent-1'"
    )


def test_modified_arguments_become_modify(opa: FakeOpaServer) -> None:
    """modified_arguments turn an allow into a Modify of the same call."""
    opa.set_decision(
        PATH,
        lambda doc: {
            "allow": True,
            "reason": "timeout capped",
            "modified_arguments": {**doc["arguments"], "timeout_s": 120},
        },
    )
    original = tool("run_command", {"command": "make", "timeout_s": 9999}, call_id="c7")
    decision = decide(OpaGate(opa.url, PATH), original)
    assert isinstance(decision, Modify)
    assert decision.reason == "timeout capped"
    assert isinstance(decision.action, ToolCallAction)
    assert decision.action.call_id == "c7"
    assert decision.action.name == "run_command"
    assert json.loads(decision.action.arguments) == {"command": "make", "timeout_s": 120}


def test_modified_arguments_for_non_tool_denied(opa: FakeOpaServer) -> None:
    """Only tool calls can be modified; anything else fails closed."""
    opa.set_decision(PATH, {"allow": True, "modified_arguments": {"a": 1}})
    assert reason_of(decide(OpaGate(opa.url, PATH), respond())) == (
        "OPA returned modified_arguments for a respond action at orga/decision; "
        "only tool calls can be modified"
    )


def test_modified_arguments_must_be_object(opa: FakeOpaServer) -> None:
    """modified_arguments that are not an object fail closed."""
    opa.set_decision(PATH, {"allow": True, "modified_arguments": [1]})
    assert "not an object" in reason_of(decide(OpaGate(opa.url, PATH), tool("grep")))


def test_undefined_decision_denied(opa: FakeOpaServer) -> None:
    """No document at the path ({} from OPA) denies, hinting that the policy is not loaded."""
    decision = decide(OpaGate(opa.url, "orga/missing"), tool("grep"))
    assert reason_of(decision) == (
        "OPA returned no decision for orga/missing (is the policy loaded?)"
    )


@pytest.mark.parametrize("result", [None, "yes", 1, {"allow": "true"}, {"reason": "x"}, [True]])
def test_unexpected_result_denied(opa: FakeOpaServer, result: Any) -> None:
    """A result that is neither a boolean nor an object with a boolean allow denies."""
    opa.set_decision(PATH, result)
    reason = reason_of(decide(OpaGate(opa.url, PATH), tool("grep")))
    assert reason.startswith(
        f"OPA returned an unexpected decision for {PATH}: {json.dumps(result)}"
    )


def test_unreachable_opa_is_an_outage_not_a_denial() -> None:
    """A closed port (connection refused) raises PolicyUnavailableError naming the server,
    instead of denying: the model never sees a denial no policy made."""
    url = closed_opa_url()
    with pytest.raises(PolicyUnavailableError) as raised:
        decide(OpaGate(url, PATH), tool("grep"))
    assert str(raised.value).startswith(f"OPA unreachable at {url}: ")
    assert "refused" in str(raised.value).lower() or "connect" in str(raised.value).lower()
    assert raised.value.service == f"opa at {url}"
    assert raised.value.kind == "policy_unavailable"


def test_timeout_is_an_outage(opa: FakeOpaServer) -> None:
    """An OPA slower than timeout_s raises PolicyUnavailableError naming the timeout."""
    opa.set_decision(PATH, True)
    opa.queue(QueuedAnswer(body={"result": True}, delay_s=2.0))
    gate = OpaGate(opa.url, PATH, timeout_s=0.1)
    with pytest.raises(PolicyUnavailableError, match=r"OPA timed out after 0\.1s at "):
        decide(gate, tool("grep"))


@pytest.mark.parametrize("status", [500, 503])
def test_server_error_is_an_outage(opa: FakeOpaServer, status: int) -> None:
    """A 5xx raises PolicyUnavailableError quoting OPA's error body."""
    body = {"code": "internal_error", "message": "boom"}
    opa.queue(QueuedAnswer(status=status, body=body))
    with pytest.raises(PolicyUnavailableError) as raised:
        decide(OpaGate(opa.url, PATH), tool("grep"))
    assert str(raised.value) == (
        f"OPA answered HTTP {status} for {opa.url}/v1/data/{PATH}: {json.dumps(body)}"
    )


def test_client_error_denied(opa: FakeOpaServer) -> None:
    """A 4xx (the query itself is wrong) denies, quoting OPA's error body."""
    body = {"code": "invalid_parameter", "message": "boom"}
    opa.queue(QueuedAnswer(status=400, body=body))
    reason = reason_of(decide(OpaGate(opa.url, PATH), tool("grep")))
    assert reason == f"OPA answered HTTP 400 for {opa.url}/v1/data/{PATH}: {json.dumps(body)}"


def test_non_json_body_denied(opa: FakeOpaServer) -> None:
    """A body that is not JSON (a proxy's HTML page) denies."""
    opa.queue(QueuedAnswer(raw="<html>bad gateway</html>"))
    reason = reason_of(decide(OpaGate(opa.url, PATH), tool("grep")))
    assert reason.startswith(f"OPA answered a non-JSON body for {opa.url}/v1/data/{PATH}")


def test_unparsable_arguments_denied(opa: FakeOpaServer) -> None:
    """Arguments that are not a JSON object cannot be sent, so the action is denied."""
    action = ToolCallAction(call_id="c", name="grep", arguments="[1]")
    assert reason_of(decide(OpaGate(opa.url, PATH), action)).startswith(
        "OPA input could not be built: "
    )
    assert opa.queries == []


def test_shared_client_and_headers(opa: FakeOpaServer) -> None:
    """An injected client is used (and left open); configured headers are sent."""
    opa.set_decision(PATH, True)

    async def scenario() -> tuple[object, bool]:
        async with httpx.AsyncClient() as client:
            gate = OpaGate(opa.url, PATH, client=client, headers={"authorization": "Bearer t"})
            first = await gate.evaluate_action(tool("grep"), context())
            second = await gate.evaluate_action(respond(), context())
            return (first, second), client.is_closed

    decisions, closed = asyncio.run(scenario())
    assert decisions == (Allow(), Allow())
    assert not closed
    assert [q.headers.get("authorization") for q in opa.queries] == ["Bearer t", "Bearer t"]


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("orga/allow", "orga/allow"),
        ("/orga/allow/", "orga/allow"),
        ("orga.allow", "orga/allow"),
        ("data.orga.gate.decision", "orga/gate/decision"),
    ],
)
def test_path_forms(given: str, normalised: str) -> None:
    """Slash, dot and data.-prefixed rule paths all name the same document."""
    assert normalise_opa_path(given) == normalised


@pytest.mark.parametrize(
    ("url", "path", "timeout_s", "message"),
    [
        ("opa:8181", "orga/allow", 1.0, "must be http"),
        ("ftp://opa", "orga/allow", 1.0, "must be http"),
        ("http://opa:8181", "orga//allow", 1.0, "is not a rule path"),
        ("http://opa:8181", "orga/al low", 1.0, "is not a rule path"),
        ("http://opa:8181", "orga/allow", 0.0, "timeout_s must be positive"),
    ],
)
def test_bad_configuration(url: str, path: str, timeout_s: float, message: str) -> None:
    """A bad URL, path or timeout is a ConfigError at construction."""
    with pytest.raises(ConfigError, match=message):
        OpaGate(url, path, timeout_s=timeout_s)


def test_endpoint() -> None:
    """The gate posts to {url}/v1/data/{path}."""
    assert (
        OpaGate("http://opa:8181/", "orga.allow").endpoint == "http://opa:8181/v1/data/orga/allow"
    )
