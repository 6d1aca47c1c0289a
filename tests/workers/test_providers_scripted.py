"""The scripted provider: loading and validating scripts, replaying them, running out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import FinishReason, InferenceOptions, InferenceResponse, ToolCall, Usage
from tests.fakes.llm_server import FIXTURES_DIR
from workers.providers import (
    SCRIPT_EXHAUSTED_TEXT,
    InferenceError,
    InferenceProvider,
    OnExhausted,
    ScriptedProvider,
    ScriptedReply,
    ScriptError,
    ScriptExhaustedError,
    load_script,
)


def complete(
    provider: InferenceProvider,
    conversation: Conversation | None = None,
    options: InferenceOptions | None = None,
) -> InferenceResponse:
    """Run one completion synchronously."""
    conv = conversation or Conversation(messages=[ConversationMessage.user("hi")])
    return asyncio.run(provider.complete(conv, options or InferenceOptions()))


def replay(provider: ScriptedProvider, count: int) -> list[InferenceResponse]:
    """``count`` completions in a row."""
    return [complete(provider) for _ in range(count)]


def write(tmp_path: Path, name: str, text: str) -> Path:
    """A script file in the temporary directory."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- loading -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["script_demo.yaml", "script_demo.json"])
def test_yaml_and_json_scripts_replay_the_same_run(name: str) -> None:
    """Both recorded scripts give a read, a command and a final answer."""
    provider = ScriptedProvider.from_file(FIXTURES_DIR / name)
    first, second, third = replay(provider, 3)
    assert first.content == "I will read the README first."
    assert first.tool_calls == [
        ToolCall(id="call_1", name="file_read", arguments='{"path": "README.md"}')
    ]
    assert first.finish_reason is FinishReason.TOOL_CALLS
    assert second.tool_calls[0].id == "call_2"
    assert json.loads(second.tool_calls[0].arguments) == {"command": "pytest -q"}
    assert second.usage == Usage(prompt_tokens=120, completion_tokens=30, total_tokens=150)
    assert (third.content, third.tool_calls, third.finish_reason) == (
        "All tests pass.",
        [],
        FinishReason.STOP,
    )


def test_a_mapping_script_sets_its_exhaustion_behaviour() -> None:
    """``on_exhausted: raise`` in the JSON script applies."""
    provider = ScriptedProvider.from_file(FIXTURES_DIR / "script_demo.json")
    replay(provider, 3)
    with pytest.raises(ScriptExhaustedError):
        complete(provider)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "- {tool_calls: [{arguments: {a: 1}}]}",
            r"reply 0: tool_calls\[0\]\.name: Field required",
        ),
        ("- text: ok\n- {}", "reply 1: a reply needs `text` or `tool_calls`"),
        ("- text: ok\n- {txt: hi}", "reply 1: txt: Extra inputs are not permitted"),
        ("- tool_calls: [{name: f, arguments: [1, 2]}]", r"reply 0: tool_calls\[0\]\.arguments"),
        ("- {text: hi, finish_reason: done}", "reply 0: finish_reason: Input should be"),
        ("- {text: hi, usage: {prompt_tokens: many}}", "reply 0: usage.prompt_tokens"),
        ("- tool_calls: [{name: ''}]", r"reply 0: tool_calls\[0\]\.name: String should have"),
        ("[]", "replies: List should have at least 1 item"),
        ("hello", "a script is a list of replies .* got str"),
        ("{replies: [hi], on_exhausted: loop}", "script: on_exhausted: Input should be"),
    ],
)
def test_a_malformed_script_names_the_reply_and_the_problem(
    tmp_path: Path, text: str, match: str
) -> None:
    """Validation happens at load time and the error says which reply is wrong and how."""
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ScriptError, match=match) as caught:
        load_script(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ConfigError)


def test_invalid_yaml_and_json_name_the_file(tmp_path: Path) -> None:
    """Syntax errors say the file is not valid YAML/JSON."""
    for name, text in (("bad.yaml", "- text: [unclosed"), ("bad.json", '[{"text": "x"')):
        with pytest.raises(ScriptError, match=f"{name}' is not valid YAML/JSON"):
            load_script(write(tmp_path, name, text))


def test_a_missing_script_file_says_how_to_fix_it(tmp_path: Path) -> None:
    """A path that does not exist names the path and ORGA_SCRIPT_PATH."""
    with pytest.raises(ScriptError, match=r"cannot read the script .*ORGA_SCRIPT_PATH"):
        load_script(tmp_path / "nope.yaml")


def test_malformed_replies_in_code_fail_at_construction() -> None:
    """``from_replies`` validates too."""
    with pytest.raises(ScriptError, match=r"reply 1: tool_calls\[0\]\.name"):
        ScriptedProvider.from_replies(["ok", {"tool_calls": [{}]}])


# -- replay --------------------------------------------------------------------------------


def test_from_replies_accepts_text_dicts_and_models() -> None:
    """Plain strings, file-format dicts and ScriptedReply objects mix."""
    provider = ScriptedProvider.from_replies(
        [
            "one",
            {"tool_calls": [{"name": "f", "arguments": {"x": 1}}]},
            ScriptedReply(text="three", finish_reason=FinishReason.MAX_TOKENS),
        ]
    )
    one, two, three = replay(provider, 3)
    assert one.content == "one"
    assert two.tool_calls == [ToolCall(id="call_1", name="f", arguments='{"x": 1}')]
    assert three.finish_reason is FinishReason.MAX_TOKENS


def test_call_ids_are_deterministic_and_unique_across_replies() -> None:
    """Generated ids count call_1, call_2... over the run; a scripted id is kept as is."""
    provider = ScriptedProvider.from_replies(
        [
            {"tool_calls": [{"name": "a"}, {"name": "b"}]},
            {"tool_calls": [{"name": "c", "id": "toolu_x"}, {"name": "d"}]},
        ]
    )
    first, second = replay(provider, 2)
    assert [c.id for c in first.tool_calls + second.tool_calls] == [
        "call_1",
        "call_2",
        "toolu_x",
        "call_3",
    ]


def test_usage_is_estimated_when_the_script_has_none() -> None:
    """Prompt tokens are the conversation estimate, completion the reply's estimate."""
    provider = ScriptedProvider.from_replies(["All done."])
    conversation = Conversation.with_system("You are helpful.")
    conversation.push(ConversationMessage.user("Do the thing"))
    usage = complete(provider, conversation).usage
    reply_estimate = ConversationMessage.assistant("All done.").estimate_tokens()
    assert usage.prompt_tokens == conversation.estimate_tokens()
    assert usage.completion_tokens == reply_estimate
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_the_model_is_the_options_model_or_the_default() -> None:
    """Responses report options.model, else the provider's model name."""
    provider = ScriptedProvider.from_replies(["a", "b"], model="demo-model")
    assert complete(provider).model == "demo-model"
    assert complete(provider, options=InferenceOptions(model="other")).model == "other"
    assert provider.default_model() == "demo-model"
    assert provider.provider_name() == "scripted"


def test_requests_are_recorded_as_snapshots() -> None:
    """Each call records the conversation as it was and the options."""
    provider = ScriptedProvider.from_replies(["a"])
    conversation = Conversation(messages=[ConversationMessage.user("first")])
    options = InferenceOptions(max_tokens=10)
    asyncio.run(provider.complete(conversation, options))
    conversation.push(ConversationMessage.user("later"))
    (request,) = provider.requests
    assert len(request.conversation) == 1
    assert request.options == options


def test_an_explicit_empty_text_is_allowed() -> None:
    """``text: ''`` scripts an empty reply (a no-progress turn)."""
    provider = ScriptedProvider.from_replies([{"text": ""}])
    response = complete(provider)
    assert (response.content, response.finish_reason) == ("", FinishReason.STOP)


# -- exhaustion ----------------------------------------------------------------------------


def test_the_default_exhaustion_is_a_final_answer() -> None:
    """Out of replies, the provider answers ``Script exhausted`` with no tool calls."""
    provider = ScriptedProvider.from_replies([{"tool_calls": [{"name": "f"}]}])
    _, extra, again = replay(provider, 3)
    for response in (extra, again):
        assert response.content == SCRIPT_EXHAUSTED_TEXT
        assert response.tool_calls == []
        assert response.finish_reason is FinishReason.STOP
    assert provider.remaining == 0


def test_repeat_last_replays_the_last_reply_with_fresh_ids() -> None:
    """``repeat_last`` repeats the final reply; call ids keep counting."""
    provider = ScriptedProvider.from_replies(
        ["a", {"tool_calls": [{"name": "poll"}]}], on_exhausted="repeat_last"
    )
    _, last, repeated = replay(provider, 3)
    assert last.tool_calls[0].id == "call_1"
    assert repeated.tool_calls[0].id == "call_2"
    assert repeated.tool_calls[0].name == "poll"


def test_raise_on_exhaustion_says_how_many_replies_were_used() -> None:
    """``raise`` gives ScriptExhaustedError (an InferenceError) naming the count."""
    provider = ScriptedProvider.from_replies(["a", "b"], on_exhausted=OnExhausted.RAISE)
    replay(provider, 2)
    with pytest.raises(ScriptExhaustedError, match="all 2 replies were used") as caught:
        complete(provider)
    assert isinstance(caught.value, InferenceError)


def test_the_argument_overrides_the_scripts_exhaustion_setting() -> None:
    """An explicit on_exhausted wins over the script's own."""
    provider = ScriptedProvider.from_file(
        FIXTURES_DIR / "script_demo.json", on_exhausted="final_answer"
    )
    assert replay(provider, 4)[-1].content == SCRIPT_EXHAUSTED_TEXT


def test_reset_starts_the_script_again() -> None:
    """After reset the first reply, call_1 and an empty request log come back."""
    provider = ScriptedProvider.from_replies([{"tool_calls": [{"name": "f"}]}])
    replay(provider, 2)
    provider.reset()
    assert complete(provider).tool_calls[0].id == "call_1"
    assert len(provider.requests) == 1
    assert provider.remaining == 0


def test_it_implements_the_protocol_with_a_readable_repr() -> None:
    """ScriptedProvider is an InferenceProvider; repr shows progress."""
    provider = ScriptedProvider.from_replies(["a", "b"])
    assert isinstance(provider, InferenceProvider)
    complete(provider)
    assert repr(provider) == "ScriptedProvider(replies=2, used=1, on_exhausted='final_answer')"


def test_an_unknown_exhaustion_mode_is_rejected() -> None:
    """A typo in on_exhausted is a ValueError listing nothing silently."""
    replies: list[Any] = ["a"]
    with pytest.raises(ValueError, match="loop"):
        ScriptedProvider.from_replies(replies, on_exhausted="loop")
