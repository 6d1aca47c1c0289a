"""Identical frozen settings parsed once per process and shared (shared.identical)."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from shared.conversation import ConversationMessage, shared_message
from shared.identical import SharedWhenIdentical, shared_default
from shared.loop_types import LoopConfig
from shared.protocol import ConversationRef, Fence, ReasonRequest
from shared.task_spec import TaskSpec, parse_task


class _Limits(BaseModel):
    model_config = ConfigDict(frozen=True)

    steps: int = 1
    names: list[str] = []


def _request(task_id: str, **config: object) -> str:
    return ReasonRequest(
        fence=Fence(task_id=task_id, step_id="s", iteration=0, attempt=0),
        agent_id="agent",
        config=LoopConfig(**config),  # type: ignore[arg-type]
        workspace="/w",
    ).model_dump_json()


def test_requests_with_the_same_settings_share_them() -> None:
    """Two requests whose config, provider, policy and recovery are the same JSON share one
    instance of each; a request with another config gets its own."""
    first = ReasonRequest.model_validate_json(_request("t1"))
    second = ReasonRequest.model_validate_json(_request("t2"))
    other = ReasonRequest.model_validate_json(_request("t3", max_iterations=7))
    assert second.config is first.config
    assert second.provider is first.provider
    assert second.policy is first.policy
    assert second.recovery is first.recovery
    assert other.config is not first.config
    assert other.config.max_iterations == 7


def test_a_shared_value_is_what_parsing_would_have_built() -> None:
    """A shared value has the same fields and the same fields set as a fresh parse of its own
    text (an ``exclude_unset`` dump is unchanged), at every level."""
    text = '{"steps": 2}'
    adapter = TypeAdapter(Annotated[_Limits, SharedWhenIdentical()])
    adapter.validate_json('{"steps": 2, "names": []}')  # another text: another value
    first, again = adapter.validate_json(text), adapter.validate_json(text)
    fresh = _Limits.model_validate_json(text)
    assert again is first
    assert first == fresh
    assert first.model_fields_set == fresh.model_fields_set == {"steps"}
    request = _request("t1", delegation_chain=["a"])
    parsed = ReasonRequest.model_validate_json(request)
    assert ReasonRequest.model_validate_json(request).config is parsed.config
    assert parsed.model_dump_json(exclude_unset=True) == ReasonRequest.model_validate_json(
        request, context={}
    ).model_dump_json(exclude_unset=True)


def test_python_mode_and_a_context_are_never_shared() -> None:
    """Values given in code, as dicts or models, and a validation with a context, are
    validated as before: a fresh instance each time."""
    adapter = TypeAdapter(Annotated[_Limits, SharedWhenIdentical()])
    assert adapter.validate_python({"steps": 3}) is not adapter.validate_python({"steps": 3})
    assert adapter.validate_json('{"steps": 3}', context={}) is not adapter.validate_json(
        '{"steps": 3}', context={}
    )


def test_a_value_that_fails_raises_every_time() -> None:
    """A value that does not validate is not kept: each parse of it raises."""
    adapter = TypeAdapter(Annotated[_Limits, SharedWhenIdentical()])
    for _ in range(2):
        with pytest.raises(ValidationError, match="steps"):
            adapter.validate_json('{"steps": "many"}')


def test_only_the_most_recently_used_values_are_kept() -> None:
    """A kind keeps its ``kept`` most recently used values: an older one is parsed again,
    a recently used one stays shared."""
    adapter = TypeAdapter(Annotated[_Limits, SharedWhenIdentical(kept=2)])
    one = adapter.validate_json('{"steps": 1}')
    adapter.validate_json('{"steps": 2}')
    assert adapter.validate_json('{"steps": 1}') is one  # used again: the newest
    adapter.validate_json('{"steps": 3}')  # drops steps=2, the oldest
    assert adapter.validate_json('{"steps": 1}') is one
    two = adapter.validate_json('{"steps": 2}')
    assert adapter.validate_json('{"steps": 2}') is two
    assert adapter.validate_json('{"steps": 3}') is not adapter.validate_json('{"steps": 4}')


def test_tasks_share_their_default_and_identical_settings() -> None:
    """Two tasks that set no limits share the default ones; two task records read back from
    JSON share their identical stagnation, policy and limits."""
    first = parse_task({"goal": "a"}, "first")
    second = parse_task({"goal": "b"}, "second")
    assert second.stagnation is first.stagnation
    assert second.limits is first.limits
    assert second.policy is first.policy
    assert first.model_fields_set == {"goal"}
    read = [TaskSpec.model_validate_json(t.model_dump_json()) for t in (first, second)]
    assert read[1].stagnation is read[0].stagnation
    assert read[1].limits is read[0].limits
    assert read[0] == first


def test_a_shared_default_is_built_once() -> None:
    """``shared_default`` builds its model at the first call and returns it after."""
    built: list[_Limits] = []

    def build() -> _Limits:
        built.append(_Limits())
        return built[-1]

    default = shared_default(build)
    assert default() is default()
    assert len(built) == 1


def test_messages_of_the_same_json_are_shared() -> None:
    """The system prompt every task repeats, carried in two requests' tails or read from
    Redis, is one instance; the tasks' own messages are not mixed up."""
    system = ConversationMessage.system("You are an agent.", pin=True)

    def carried(task_id: str) -> ConversationRef:
        tail = [system, ConversationMessage.user(f"Goal of {task_id}", pin=True)]
        request = ReasonRequest(
            fence=Fence(task_id=task_id, step_id="s", iteration=0, attempt=0),
            agent_id="agent",
            config=LoopConfig(),
            workspace="/w",
            conversation_ref=ConversationRef(length=2, tail=tail),
        )
        ref = ReasonRequest.model_validate_json(request.model_dump_json()).conversation_ref
        assert ref is not None
        return ref

    first, second = carried("t1"), carried("t2")
    assert second.tail[0] is first.tail[0]
    assert [m.content for m in second.tail] == ["You are an agent.", "Goal of t2"]
    assert shared_message(system.model_dump_json()) is first.tail[0]


# -- review (branch revm): where a shared value is not what this parse would have built ------


def _request_text(task_id: str, config: dict[str, object]) -> str:
    """A request's JSON whose config is ``config`` as given (keys the model does not know,
    non-finite floats written as ``Infinity``/``NaN``, as Python's json and pydantic read)."""
    body = json.loads(_request(task_id))
    body["config"] = {**body["config"], **config}
    return json.dumps(body)


def test_a_strict_parse_is_not_answered_by_an_earlier_lax_one() -> None:
    """``model_validate_json(..., strict=True)`` is JSON mode without a context, so it is
    shared, but the key does not see ``strict``: a config a strict parse refuses
    (``"max_iterations": "9101"``, a string) is accepted when a lax parse of the same text
    came first. The module promises "the same input under the same validation"."""
    text = _request_text("strict", {"max_iterations": "9101"})
    with pytest.raises(ValidationError, match="max_iterations"):
        ReasonRequest.model_validate_json(
            _request_text("strict", {"max_iterations": "9102"}), strict=True
        )  # a fresh parse refuses it
    ReasonRequest.model_validate_json(text)  # a lax parse of the same text, kept
    with pytest.raises(ValidationError, match="max_iterations"):
        ReasonRequest.model_validate_json(text, strict=True)


def test_a_forbidding_parse_is_not_answered_by_an_earlier_ignoring_one() -> None:
    """``extra="forbid"`` given to ``model_validate_json`` (the docstring names exactly this
    override as what the key cannot see, but guards it only in Python mode): a config with an
    unknown key is refused by a fresh forbidding parse, accepted once an ignoring parse of the
    same text was kept."""
    text = _request_text("extra", {"max_iterations": 9201, "unknown_setting": 1})
    with pytest.raises(ValidationError, match="unknown_setting"):
        ReasonRequest.model_validate_json(
            _request_text("extra", {"max_iterations": 9202, "unknown_setting": 1}),
            extra="forbid",
        )
    ReasonRequest.model_validate_json(text)
    with pytest.raises(ValidationError, match="unknown_setting"):
        ReasonRequest.model_validate_json(text, extra="forbid")


def test_infinity_and_null_are_different_values() -> None:
    """The key is ``orjson.dumps`` of the parsed value, and orjson writes ``inf`` and ``nan``
    as ``null``: a request whose ``max_cost_usd`` is ``null`` (no money limit) gets the config
    parsed from an earlier ``Infinity`` (a limit, so an unpriced model is refused by
    ``workers.handlers._price``)."""
    limited = ReasonRequest.model_validate_json(
        _request_text("inf", {"max_iterations": 9301, "max_cost_usd": float("inf")})
    )
    assert limited.config.max_cost_usd == float("inf")
    unlimited = ReasonRequest.model_validate_json(
        _request_text("null", {"max_iterations": 9301, "max_cost_usd": None})
    )
    assert unlimited.config.max_cost_usd is None


def test_a_nan_is_refused_even_after_a_null() -> None:
    """``NaN`` fails ``max_cost_usd``'s ``ge=0`` on a fresh parse; after a config with
    ``null`` there, it shares that config's key (``null``) and is accepted as ``None``."""
    with pytest.raises(ValidationError, match="max_cost_usd"):
        ReasonRequest.model_validate_json(
            _request_text("nan", {"max_iterations": 9401, "max_cost_usd": float("nan")})
        )
    ReasonRequest.model_validate_json(
        _request_text("null", {"max_iterations": 9402, "max_cost_usd": None})
    )
    with pytest.raises(ValidationError, match="max_cost_usd"):
        ReasonRequest.model_validate_json(
            _request_text("nan", {"max_iterations": 9402, "max_cost_usd": float("nan")})
        )
