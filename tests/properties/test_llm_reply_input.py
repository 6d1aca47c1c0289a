"""Malformed LLM replies (hypothesis): the parsers answer an InferenceResponse or an
InferenceError naming the problem; Reason + Gate answer every bad tool call with a message the
model reads and approve the valid calls beside it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.context_manager import DefaultContextManager
from shared.conversation import Conversation, ConversationMessage, MessageRole
from shared.inference import InferenceOptions, InferenceResponse, ToolCall
from shared.loop_types import LoopConfig, LoopState
from tests.fakes.llm_server import FakeAnthropicServer, FakeOpenAIServer, ProgrammedResponse
from workers.gates.base import GateContext
from workers.gates.default import DefaultPolicyGate
from workers.gates.schema import DENIAL_PREFIX, SCHEMA_FAILURE_PREFIX
from workers.phases import LoopTermination, Reasoning, ToolDispatching
from workers.providers.anthropic import AnthropicProvider, parse_anthropic_response
from workers.providers.base import InferenceError, ResponseParseError
from workers.providers.function import FunctionProvider
from workers.providers.openai_compat import OpenAICompatProvider, parse_openai_response
from workers.providers.retry import RetryPolicy
from workers.tools import (
    FILE_LIST_DEFINITION,
    FILE_READ_DEFINITION,
    FILE_WRITE_DEFINITION,
    RUN_COMMAND_DEFINITION,
)

DEFINITIONS = [FILE_READ_DEFINITION, FILE_WRITE_DEFINITION, FILE_LIST_DEFINITION]
KNOWN = frozenset(d.name for d in [*DEFINITIONS, RUN_COMMAND_DEFINITION])
MAX_ERROR_CHARS = 2_000

# -- reply shapes -----------------------------------------------------------------------------

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
ARGUMENT_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "{", '{"path": ', "[]", "null", "42", '"a"', "NaN", "{'a': 1}"]),
    JSON.map(json.dumps),
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value``, or some other JSON value, or the key left out (``_MISSING``)."""
    return st.one_of(value, JSON, st.just(_MISSING))


_MISSING = object()


def _shape(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict whose fields may each be right, wrong or missing."""
    return st.fixed_dictionaries({k: _maybe(v) for k, v in fields.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not _MISSING}
    )


OPENAI_TOOL_CALL = _shape(
    id=st.text(max_size=8),
    type=st.just("function"),
    function=_shape(
        name=st.sampled_from(["file_read", "nope", "", "run_command"]),
        arguments=st.one_of(ARGUMENT_TEXT, st.dictionaries(st.text(max_size=5), JSON, max_size=3)),
    ),
)
OPENAI_REPLY = _shape(
    id=st.text(max_size=8),
    model=st.text(max_size=10),
    choices=st.lists(
        _shape(
            index=st.integers(),
            finish_reason=st.sampled_from(["stop", "length", "tool_calls", "content_filter", ""]),
            message=_shape(
                role=st.just("assistant"),
                content=st.one_of(
                    st.text(max_size=30),
                    st.lists(_shape(type=st.just("text"), text=st.text(max_size=10)), max_size=2),
                ),
                refusal=st.text(max_size=10),
                tool_calls=st.lists(OPENAI_TOOL_CALL, max_size=3),
            ),
        ),
        max_size=2,
    ),
    usage=_shape(
        prompt_tokens=st.integers(), completion_tokens=st.integers(), total_tokens=st.integers()
    ),
    error=_shape(message=st.text(max_size=10), type=st.text(max_size=5)),
)
ANTHROPIC_REPLY = _shape(
    type=st.sampled_from(["message", "error"]),
    model=st.text(max_size=10),
    stop_reason=st.sampled_from(["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn"]),
    content=st.lists(
        st.one_of(
            _shape(type=st.just("text"), text=st.text(max_size=20)),
            _shape(
                type=st.just("tool_use"),
                id=st.text(max_size=8),
                name=st.sampled_from(["file_read", "nope", ""]),
                input=st.dictionaries(st.text(max_size=5), JSON, max_size=3),
            ),
            JSON,
        ),
        max_size=3,
    ),
    usage=_shape(input_tokens=st.integers(), output_tokens=st.integers()),
    error=_shape(type=st.text(max_size=5), message=st.text(max_size=10)),
)


def _check_parse(parse: Any, data: dict[str, Any]) -> None:
    outcome: InferenceResponse | InferenceError
    try:
        outcome = parse(data)
    except InferenceError as exc:
        outcome = exc
    if isinstance(outcome, InferenceError):
        assert 10 < len(str(outcome)) < MAX_ERROR_CHARS
        return
    assert isinstance(outcome, InferenceResponse)
    for call in outcome.tool_calls:
        assert call.id
        assert call.name
        assert isinstance(call.arguments, str)
    assert outcome.usage.total_tokens >= 0


@settings(deadline=None, max_examples=300)
@given(OPENAI_REPLY)
def test_openai_replies_parse_or_raise_an_inference_error(data: dict[str, Any]) -> None:
    """Any chat-completions-like object: a response with named calls, or an InferenceError."""
    _check_parse(lambda d: parse_openai_response(d, "gpt-test"), data)


@settings(deadline=None, max_examples=300)
@given(ANTHROPIC_REPLY)
def test_anthropic_replies_parse_or_raise_an_inference_error(data: dict[str, Any]) -> None:
    """Any Messages-API-like object: a response with named calls, or an InferenceError."""
    _check_parse(lambda d: parse_anthropic_response(d, "claude-test"), data)


@settings(deadline=None, max_examples=100)
@given(st.dictionaries(st.text(max_size=10), JSON, max_size=5))
def test_arbitrary_objects_never_raise_anything_but_an_inference_error(
    data: dict[str, Any],
) -> None:
    """Objects of no known shape: both parsers answer or raise an InferenceError."""
    _check_parse(lambda d: parse_openai_response(d, "gpt-test"), data)
    _check_parse(lambda d: parse_anthropic_response(d, "claude-test"), data)


HUGE = "x" * 10_000_000


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, "no choices in the openai response: an empty object"),
        ({"choices": []}, "no choices"),
        ({"choices": [{"message": None}]}, "has no message object"),
        ({"choices": [{"message": {"tool_calls": "x"}}]}, "tool_calls must be a list"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f"}}]}}]}, "has no id"),
        (
            {"choices": [{"message": {"tool_calls": [{"id": "1", "function": {}}]}}]},
            "has no function.name",
        ),
        (
            {"choices": [{"message": {"tool_calls": [
                {"id": "1", "function": {"name": "f", "arguments": 5}}
            ]}}]},
            "arguments must be JSON text or an object",
        ),
        ({"error": {"message": "overloaded"}}, "answered an error instead of a completion"),
        ({"choices": [{"message": {"tool_calls": [HUGE]}}]}, "must be an object"),
        ({"choices": [{"message": HUGE}]}, "has no message object"),
    ],
)  # fmt: skip
def test_bad_openai_replies_name_their_fault(data: dict[str, Any], expected: str) -> None:
    """Each classic broken chat completion names what is missing, in a short message."""
    with pytest.raises(InferenceError) as caught:
        parse_openai_response(data, "gpt-test")
    assert expected in str(caught.value)
    assert len(str(caught.value)) < MAX_ERROR_CHARS


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, "has no content list"),
        ({"content": None}, "has no content list"),
        ({"content": ["text"]}, "content[0] must be an object"),
        ({"content": [{"type": "tool_use", "name": "f"}]}, "(tool_use) has no id"),
        ({"content": [{"type": "tool_use", "id": "1", "input": [1]}]}, "has no name"),
        ({"content": [{"type": "tool_use", "id": "1", "name": "f", "input": "x"}]}, "input must"),
        ({"type": "error", "error": {"message": "overloaded"}}, "answered an error"),
        ({"content": [{"type": "tool_use", "id": "1", "name": "f", "input": HUGE}]}, "input"),
    ],
)
def test_bad_anthropic_replies_name_their_fault(data: dict[str, Any], expected: str) -> None:
    """Each classic broken Messages reply names what is missing, in a short message."""
    with pytest.raises(InferenceError) as caught:
        parse_anthropic_response(data, "claude-test")
    assert expected in str(caught.value)
    assert len(str(caught.value)) < MAX_ERROR_CHARS


def test_empty_and_null_replies_parse_to_empty_responses() -> None:
    """Null content, no tool calls, no usage: an empty response the Reason phase refuses."""
    openai = parse_openai_response({"choices": [{"message": {"content": None}}]}, "m")
    anthropic = parse_anthropic_response({"content": []}, "m")
    for response in (openai, anthropic):
        assert response.content == ""
        assert response.tool_calls == []


# -- the HTTP path: bodies that are not JSON, too deep, or 10 MB ------------------------------


def _answer(wire: str, body: bytes) -> InferenceResponse:
    """One completion of the ``wire`` provider against a fake server answering ``body`` (200,
    ``application/json``) through the real HTTP client."""
    server_class = FakeOpenAIServer if wire == "openai" else FakeAnthropicServer
    build = OpenAICompatProvider if wire == "openai" else AnthropicProvider
    with server_class(api_key="k") as server:
        server.enqueue(ProgrammedResponse(200, body, content_type="application/json"))
        provider = build(base_url=server.base_url, api_key="k", retry=RetryPolicy(max_retries=0))
        conversation = Conversation.with_system("s")
        conversation.push(ConversationMessage.user("hi"))
        return asyncio.run(provider.complete(conversation, InferenceOptions()))


BODIES = [
    (b"", "not JSON"),
    (b"<html>502 Bad Gateway</html>", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (b"[1, 2]", "expected an object"),
    (b"null", "expected an object"),
    (b"[" * 200_000, "nested too deeply"),
    (b'{"a": ' * 200_000, "nested too deeply"),
]


@pytest.mark.parametrize(("body", "expected"), BODIES)
def test_bodies_that_are_not_a_json_object_are_response_parse_errors(
    body: bytes, expected: str
) -> None:
    """Through the real HTTP client: a short ResponseParseError, for both providers."""
    for wire in ("openai", "anthropic"):
        with pytest.raises(ResponseParseError) as caught:
            _answer(wire, body)
        assert expected in str(caught.value)
        assert len(str(caught.value)) < MAX_ERROR_CHARS


def test_a_ten_megabyte_reply_is_parsed() -> None:
    """A 10 MB completion with a tool call is a response, not a crash or a truncation."""
    arguments = json.dumps({"path": "big.txt", "content": HUGE})
    body = {
        "choices": [
            {
                "message": {
                    "content": HUGE,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "file_write", "arguments": arguments}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    response = _answer("openai", json.dumps(body).encode())
    assert len(response.content) == 10_000_000
    assert response.tool_calls[0].arguments == arguments


# -- Reason + Gate on bad tool calls ----------------------------------------------------------


@dataclass(frozen=True)
class Proposed:
    """A tool call the model proposes and what the loop must make of it."""

    call: ToolCall
    expected: str  # "approved", SCHEMA_FAILURE_PREFIX or DENIAL_PREFIX


VALID_CALLS = st.sampled_from(
    [
        ("approved", "file_read", json.dumps({"path": "notes.txt", "start_line": 1})),
        ("approved", "file_list", json.dumps({"path": "src", "recursive": True})),
        ("approved", "file_list", ""),
        ("approved", "file_list", "   "),
        ("approved", "file_write", json.dumps({"path": "a/b.txt", "content": "x"})),
        ("approved", "run_command", json.dumps({"command": "pytest -q"})),
    ]
)
BAD_CALLS = st.one_of(
    # unknown tools (the arguments are a JSON object, so the gate decides)
    st.tuples(
        st.just(DENIAL_PREFIX),
        st.text(max_size=20).filter(lambda n: n not in KNOWN),
        st.dictionaries(st.text(max_size=5), JSON_SCALARS, max_size=2).map(json.dumps),
    ),
    # arguments that are not JSON, or JSON that is not an object
    st.tuples(
        st.just(SCHEMA_FAILURE_PREFIX),
        st.sampled_from(sorted(KNOWN)),
        st.one_of(
            st.sampled_from(["{", '{"path": ', "{'path': 'a'}", "NaN", "[1", "nul", "1e999x"]),
            JSON.filter(lambda v: not isinstance(v, dict)).map(json.dumps),
        ),
    ),
    # objects that break the tool's schema
    st.tuples(
        st.just(SCHEMA_FAILURE_PREFIX),
        st.just("file_read"),
        st.sampled_from(
            [
                "{}",
                "",
                json.dumps({"path": 5}),
                json.dumps({"path": ""}),
                json.dumps({"path": "a", "start_line": 0}),
                json.dumps({"path": "a", "mode": "rw"}),
            ]
        ),
    ),
    # paths out of the workspace
    st.tuples(
        st.just(DENIAL_PREFIX),
        st.sampled_from(["file_read", "file_write", "file_list"]),
        st.sampled_from(["../../etc/passwd", "/etc/shadow", "a/../../.."]).map(
            lambda p: json.dumps({"path": p, "content": "x"})
        ),
    ).map(lambda t: (t[0], t[1], t[2] if t[1] == "file_write" else _without_content(t[2]))),
    # commands the default policy refuses
    st.tuples(
        st.just(DENIAL_PREFIX),
        st.just("run_command"),
        st.sampled_from(["rm -rf /", "cd / && cat etc/passwd > ../../x"]).map(
            lambda c: json.dumps({"command": c})
        ),
    ),
)


def _without_content(arguments: str) -> str:
    data = json.loads(arguments)
    data.pop("content")
    return json.dumps(data)


@st.composite
def proposals(draw: st.DrawFn) -> list[Proposed]:
    """One model reply: a mix of valid and bad tool calls with unique ids."""
    drawn = draw(st.lists(st.one_of(VALID_CALLS, BAD_CALLS), min_size=1, max_size=6))
    return [
        Proposed(ToolCall(id=f"call_{i}", name=name, arguments=arguments), expected)
        for i, (expected, name, arguments) in enumerate(drawn)
    ]


async def _reason_and_gate(
    reply: InferenceResponse, workspace: Path, allowed: frozenset[str] | None
) -> tuple[ToolDispatching, LoopState]:
    conversation = Conversation.with_system("You are a test agent.")
    conversation.push(ConversationMessage.user("Goal: do it"))
    state = LoopState(agent_id="agent", conversation=conversation)
    config = LoopConfig(tool_definitions=[*DEFINITIONS, RUN_COMMAND_DEFINITION])
    provider = FunctionProvider(lambda _conversation, _options: reply)
    checking = await Reasoning(state, config).produce_output(provider, DefaultContextManager())
    context = GateContext(agent_id="agent", workspace=workspace, allowed_tools=allowed)
    return await checking.check_policy(DefaultPolicyGate(), context), state


def _tool_messages(state: LoopState) -> dict[str, str]:
    return {
        m.tool_call_id or "": m.content
        for m in state.conversation.messages
        if m.role is MessageRole.TOOL
    }


@settings(deadline=None, max_examples=200)
@given(proposals(), st.text(max_size=20))
def test_every_bad_call_is_answered_and_the_valid_ones_beside_it_approved(
    tmp_path_factory: pytest.TempPathFactory, proposed: list[Proposed], text: str
) -> None:
    """Unknown tools, broken JSON, non-objects, schema violations, escapes: each gets a tool
    message with the schema or policy prefix; every valid call is approved, in order."""
    workspace = tmp_path_factory.getbasetemp()
    reply = InferenceResponse(content=text, tool_calls=[p.call for p in proposed])
    dispatching, state = asyncio.run(_reason_and_gate(reply, workspace, KNOWN))
    approved = [a.call_id for a in dispatching.approved]  # type: ignore[union-attr]
    assert approved == [p.call.id for p in proposed if p.expected == "approved"]
    answered = _tool_messages(state)
    for p in proposed:
        if p.expected == "approved":
            assert p.call.id not in answered
        else:
            assert answered[p.call.id].startswith(p.expected), (p, answered[p.call.id])
    assert dispatching.denied_count == len(answered)
    assert dispatching.terminal_output is None


@settings(deadline=None, max_examples=50)
@given(st.sampled_from(["", " ", "\n\t"]))
def test_an_empty_reply_ends_the_turn_with_a_loop_termination(content: str) -> None:
    """No tool calls and no text: LoopTermination saying so, nothing else."""
    reply = InferenceResponse(content=content)
    with pytest.raises(LoopTermination) as caught:
        asyncio.run(_reason_and_gate(reply, Path("/tmp"), KNOWN))
    assert "no tool calls and no text" in str(caught.value)


def test_an_unknown_tool_without_an_allow_list_reaches_the_executor() -> None:
    """Without ``tools`` in the task the gate has no allow-list: an unknown tool passes the
    gate (the executor answers it with 'Unknown tool ...'); see the bad-input report."""
    reply = InferenceResponse(tool_calls=[ToolCall(id="c1", name="nope", arguments="{}")])
    dispatching, _state = asyncio.run(_reason_and_gate(reply, Path("/tmp"), None))
    assert [a.call_id for a in dispatching.approved] == ["c1"]  # type: ignore[union-attr]


def test_a_ten_megabyte_argument_is_checked_like_any_other() -> None:
    """A 10 MB file_write is approved; a huge argument of the wrong type is refused."""
    good = ToolCall(
        id="c1", name="file_write", arguments=json.dumps({"path": "big", "content": HUGE})
    )
    bad = ToolCall(id="c2", name="file_read", arguments=json.dumps({"path": ["x"] * 1_000_000}))
    reply = InferenceResponse(tool_calls=[good, bad])
    dispatching, state = asyncio.run(_reason_and_gate(reply, Path("/tmp"), KNOWN))
    assert [a.call_id for a in dispatching.approved] == ["c1"]  # type: ignore[union-attr]
    assert _tool_messages(state)["c2"].startswith(SCHEMA_FAILURE_PREFIX)


def test_a_schema_failure_quotes_a_huge_value_briefly() -> None:
    """The model is told what is wrong with a 5 MB argument in a short message, not 5 MB."""
    bad = ToolCall(id="c2", name="file_read", arguments=json.dumps({"path": ["x"] * 1_000_000}))
    _dispatching, state = asyncio.run(
        _reason_and_gate(InferenceResponse(tool_calls=[bad]), Path("/tmp"), KNOWN)
    )
    assert len(_tool_messages(state)["c2"]) < 10_000


def test_deeply_nested_arguments_are_a_schema_failure() -> None:
    """Arguments of 100,000 brackets are refused with a message, not a RecursionError."""
    reply = InferenceResponse(
        tool_calls=[ToolCall(id="c1", name="file_read", arguments="[" * 100_000)]
    )
    _dispatching, state = asyncio.run(_reason_and_gate(reply, Path("/tmp"), KNOWN))
    assert _tool_messages(state)["c1"].startswith(SCHEMA_FAILURE_PREFIX)
