"""Malformed and misdirected stream messages (hypothesis).

``decode_entry`` turns any field dict into a message or a WireFormatError naming the problem.
Valid messages with the wrong fence never change a task; a matching one delivered twice is
applied once; a matching one with odd content never makes the machine raise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.machine import Effects, MachineSettings, TaskMachine, parse_plan
from coordinator.state import AwaitKind, TaskRecord
from shared.actions import Observation, RespondAction, ToolCallAction
from shared.conversation import ConversationMessage, MessageRole
from shared.errors import WireFormatError
from shared.inference import ToolCall, Usage
from shared.loop_types import TerminationKind, TerminationReason
from shared.protocol import (
    PROTOCOL_VERSION,
    Fence,
    ReasonedMessage,
    ToolObservedMessage,
    WorkerFailedMessage,
    decode_entry,
    encode_entry,
)
from shared.stagnation.events import ToolKind
from shared.task_spec import parse_task

SETTINGS = MachineSettings(observation_deadline_s=10.0, max_redeliveries=2, workspace_root="/ws")
STATES = ["plan", "reason", "tools", "verify"]
Message = ReasonedMessage | ToolObservedMessage | WorkerFailedMessage

# -- records in each waiting state ------------------------------------------------------------


_BUILT: dict[str, TaskRecord] = {}


def _record(state: str) -> TaskRecord:
    """A fresh copy of a task waiting on a plan, a reasoning turn, two tool calls, or a
    verification (each built once)."""
    if state not in _BUILT:
        _BUILT[state] = _build(state)
    return _BUILT[state].model_copy(deep=True)


def _build(state: str) -> TaskRecord:
    steps: list[dict[str, Any]] = [{"id": "work", "instruction": "do it"}]
    if state == "verify":
        steps[0]["done_when"] = "pytest -q"
    spec = parse_task({"goal": "g", "steps": [] if state == "plan" else steps})
    record = TaskRecord(task_id="t1", spec=spec, created_at=0.0, updated_at=0.0)
    TaskMachine(record, 1.0, SETTINGS).start()
    assert record.awaiting is not None
    if state == "tools":
        calls = [_call("c1"), _call("c2")]
        turn = ReasonedMessage(fence=record.awaiting.fence, actions=calls, approved_calls=calls)
        TaskMachine(record, 2.0, SETTINGS).on_reasoned(turn)
    elif state == "verify":
        answer = ReasonedMessage(
            fence=record.awaiting.fence,
            actions=[RespondAction(content="done")],
            terminal_output="done",
        )
        TaskMachine(record, 2.0, SETTINGS).on_reasoned(answer)
    return record


def _call(
    call_id: str, name: str = "file_read", arguments: str = '{"path": "a"}'
) -> ToolCallAction:
    return ToolCallAction(call_id=call_id, name=name, arguments=arguments)


def _apply(record: TaskRecord, message: Message, now: float = 5.0) -> Effects:
    machine = TaskMachine(record, now, SETTINGS)
    if isinstance(message, ReasonedMessage):
        return machine.on_reasoned(message)
    if isinstance(message, ToolObservedMessage):
        return machine.on_tool_observed(message)
    return machine.on_worker_failed(message)


def _awaited(record: TaskRecord) -> Fence:
    assert record.awaiting is not None
    return record.awaiting.fence


# -- strategies -------------------------------------------------------------------------------

TEXT = st.text(max_size=40)
IDS = st.one_of(st.sampled_from(["t1", "t2", "work", "plan", "c1", "c2", "c3", ""]), TEXT)


def _other_than(*values: object) -> Callable[[object], bool]:
    """A filter keeping what is none of ``values``."""

    def keep(candidate: object) -> bool:
        return candidate not in values

    return keep


@st.composite
def stale_fences(draw: st.DrawFn, awaited: Fence) -> Fence:
    """The awaited fence with at least one of task, step, iteration, attempt changed."""
    changed = draw(
        st.sets(st.sampled_from(["task_id", "step_id", "iteration", "attempt"]), min_size=1)
    )
    update: dict[str, Any] = {}
    for name in changed:
        current = getattr(awaited, name)
        if isinstance(current, int):
            # iteration + 1 is the fence of a chained reasoning's own calls (Fence.acting):
            # their results may arrive first and are kept, so it is not stale.
            others = (current, current + 1) if name == "iteration" else (current,)
            update[name] = draw(
                st.integers(min_value=0, max_value=2**40).filter(_other_than(*others))
            )
        else:
            update[name] = draw(IDS.filter(_other_than(current, "")))
    call_id = draw(st.one_of(st.none(), st.sampled_from(["c1", "c2"]), IDS))
    return awaited.model_copy(update={**update, "call_id": call_id})


ARGUMENTS = st.one_of(
    TEXT,
    st.sampled_from(["", "{", "[]", "null", '"x"', '{"path": 1}', "NaN", '{"a": {"b": [1, 2]}}']),
    st.dictionaries(TEXT, st.one_of(TEXT, st.integers()), max_size=3).map(json.dumps),
)
TOOL_CALLS = st.builds(ToolCall, id=IDS, name=IDS, arguments=ARGUMENTS)
CALL_ACTIONS = st.builds(ToolCallAction, call_id=IDS, name=IDS, arguments=ARGUMENTS)
CONVERSATION_MESSAGES = st.builds(
    ConversationMessage,
    role=st.sampled_from(list(MessageRole)),
    content=TEXT,
    tool_calls=st.lists(TOOL_CALLS, max_size=2),
    tool_call_id=st.one_of(st.none(), IDS),
    tool_name=st.one_of(st.none(), IDS),
)
USAGE = st.builds(
    Usage,
    prompt_tokens=st.integers(min_value=-(10**6), max_value=10**9),
    completion_tokens=st.integers(min_value=-(10**6), max_value=10**9),
    total_tokens=st.integers(min_value=-(10**6), max_value=10**9),
)
TERMINATIONS = st.one_of(
    st.none(),
    st.builds(
        TerminationReason,
        kind=st.sampled_from(list(TerminationKind)),
        message=st.one_of(st.none(), TEXT),
    ),
)
PLANS = st.one_of(
    TEXT,
    st.lists(
        st.dictionaries(
            st.sampled_from(["id", "instruction", "done_when", "max_iterations", "extra"]),
            st.one_of(IDS, st.integers(min_value=-5, max_value=50), st.none()),
        ),
        max_size=4,
    ).map(lambda steps: json.dumps({"steps": steps})),
    st.just('```json\n{"steps": [{"id": "a", "instruction": "x"}]}\n```'),
)
# Metadata a tool worker may send, third-party tools' malformed kinds and exit codes included.
METADATA = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.one_of(st.sampled_from([k.value for k in ToolKind]), TEXT),
        "exit_code": st.one_of(st.integers(min_value=-300, max_value=300).map(str), TEXT),
        "path": TEXT,
        "content_hash": TEXT,
        "before_hash": TEXT,
        "after_hash": TEXT,
        "output_hash": TEXT,
        "tool_name": IDS,
        "error_type": TEXT,
        "anything": TEXT,
    },
)


def reasoned_messages(fence: Fence) -> st.SearchStrategy[ReasonedMessage]:
    """Well-formed reasoning answers with arbitrary content for ``fence``."""
    return st.builds(
        ReasonedMessage,
        fence=st.just(fence),
        new_messages=st.lists(CONVERSATION_MESSAGES, max_size=3),
        actions=st.lists(CALL_ACTIONS, max_size=3),
        approved_calls=st.lists(CALL_ACTIONS, max_size=3),
        denied_count=st.integers(min_value=-3, max_value=10**6),
        usage=USAGE,
        terminal_output=st.one_of(st.none(), PLANS),
        termination=TERMINATIONS,
        duration_ms=st.floats(allow_nan=False, allow_infinity=False),
    )


def tool_observed_messages(fence: Fence) -> st.SearchStrategy[ToolObservedMessage]:
    """Well-formed tool answers with arbitrary content; the observation answers its fence."""
    observation = st.builds(
        Observation,
        source=IDS,
        content=st.one_of(TEXT, st.just("x" * 200_000)),
        is_error=st.booleans(),
        call_id=st.sampled_from([None, fence.call_id]),
        metadata=METADATA,
    )
    return st.builds(
        ToolObservedMessage,
        fence=st.just(fence),
        observation=observation,
        escalation_reason=st.one_of(st.none(), TEXT),
        duration_ms=st.floats(allow_nan=False, allow_infinity=False),
    )


def worker_failures(fence: Fence) -> st.SearchStrategy[WorkerFailedMessage]:
    """Worker failures, retryable or not."""
    return st.builds(WorkerFailedMessage, fence=st.just(fence), error=TEXT, retryable=st.booleans())


def any_message(fence: Fence) -> st.SearchStrategy[Message]:
    """Any of the three message kinds for ``fence``."""
    return st.one_of(
        reasoned_messages(fence), tool_observed_messages(fence), worker_failures(fence)
    )


# -- decode_entry -----------------------------------------------------------------------------

VALID_BODY = WorkerFailedMessage(
    fence=Fence(task_id="t1", step_id="s", iteration=1, attempt=0), error="boom"
).model_dump(mode="json")
FIELD_VALUES = st.one_of(
    TEXT,
    st.binary(max_size=40),
    st.integers(),
    st.none(),
    st.floats(),
    st.sampled_from(["1", "0", "2", "3", "v1", "", b"1", b"\xff\xfe"]),
)


def _mutated_body(draw: st.DrawFn) -> str:
    body: dict[str, Any] = json.loads(json.dumps(VALID_BODY))
    fence: dict[str, Any] = body["fence"]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        target = draw(st.sampled_from([body, fence]))
        key = draw(st.sampled_from([*target, "unknown", "kind"]))
        if draw(st.booleans()) and key in target:
            del target[key]
        else:
            target[key] = draw(
                st.one_of(
                    st.none(),
                    st.booleans(),
                    st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(),
                    TEXT,
                    st.sampled_from(["reasoned", "tool_observed", "worker_failed", "bogus"]),
                    st.lists(st.integers(), max_size=2),
                    st.dictionaries(TEXT, TEXT, max_size=2),
                )
            )
    return json.dumps(body)


@st.composite
def entries(draw: st.DrawFn) -> dict[Any, Any]:
    """Stream fields: a (maybe) mutated valid entry plus random extra or missing fields."""
    fields: dict[Any, Any] = {
        "v": draw(st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION.encode()])),
        "kind": "worker_failed",
        "body": _mutated_body(draw),
    }
    if draw(st.booleans()):
        fields["body"] = draw(
            st.one_of(
                st.just(fields["body"]),
                st.just(fields["body"].encode()),
                TEXT,
                st.binary(max_size=60),
                st.just('{"kind": "reasoned", "fence": {}}'),
                st.just("[" * 5_000),
                st.just('{"kind": "worker_failed", "error": "' + "x" * 2_000_000 + '"}'),
            )
        )
    for dropped in draw(st.lists(st.sampled_from(["v", "kind", "body"]), max_size=2)):
        fields.pop(dropped, None)
    extra = draw(st.dictionaries(st.one_of(TEXT, st.binary(max_size=8)), FIELD_VALUES, max_size=3))
    for key, value in extra.items():
        fields.setdefault(key, value)
    if draw(st.booleans()):
        fields = {
            (k.encode() if isinstance(k, str) else k): (v.encode() if isinstance(v, str) else v)
            for k, v in fields.items()
        }
    return fields


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@settings(deadline=None, max_examples=300)
@given(entries())
def test_decode_entry_returns_a_message_or_names_the_problem(fields: dict[Any, Any]) -> None:
    """Any fields: a message, or a WireFormatError about the version, the body or a field."""
    text = {_text(k): _text(v) for k, v in fields.items()}
    try:
        message = decode_entry(fields)
    except WireFormatError as exc:
        error = str(exc)
        if text.get("v") != PROTOCOL_VERSION:
            assert "unsupported protocol version" in error
            assert repr(text.get("v")) in error
        elif "body" not in text:
            assert "no 'body' field" in error
        else:
            assert error.startswith("invalid ")
            assert ": " in error
        assert len(error) < 3000
        return
    assert isinstance(message, ReasonedMessage | ToolObservedMessage | WorkerFailedMessage)
    assert decode_entry(encode_entry(message)) == message


@settings(deadline=None, max_examples=100)
@given(st.dictionaries(st.one_of(TEXT, st.binary(max_size=8)), FIELD_VALUES, max_size=5))
def test_decode_entry_on_random_fields_never_raises_anything_else(fields: dict[Any, Any]) -> None:
    """Fields with no structure at all only ever give WireFormatError."""
    with pytest.raises(WireFormatError):
        decode_entry(fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "unsupported protocol version None"),
        ({"v": "99", "body": "{}"}, "unsupported protocol version '99'"),
        ({b"v": b"0"}, "unsupported protocol version '0'"),
        ({"v": PROTOCOL_VERSION}, "stream entry has no 'body' field"),
        ({"v": PROTOCOL_VERSION, "body": "not json"}, "Invalid JSON"),
        (
            {"v": PROTOCOL_VERSION, "body": '{"kind": "bogus"}'},
            "does not match any of the expected tags",
        ),
        (
            {"v": PROTOCOL_VERSION, "body": '{"kind": "worker_failed"}'},
            "worker_failed.fence: Field required",
        ),
        (
            {"v": PROTOCOL_VERSION, "body": json.dumps({**VALID_BODY, "fence": "t1/s/1/0"})},
            "worker_failed.fence: Input should be an object",
        ),
        (
            {
                "v": PROTOCOL_VERSION,
                "body": json.dumps(
                    {**VALID_BODY, "fence": {**VALID_BODY["fence"], "iteration": -1}}
                ),
            },
            "worker_failed.fence.iteration: Input should be greater than or equal to 0",
        ),
        ({"v": PROTOCOL_VERSION, "body": b"\xff\xfe\x00"}, "Invalid JSON"),
        ({"v": PROTOCOL_VERSION, "body": "[" * 100_000}, "recursion limit exceeded"),
    ],
)
def test_known_bad_entries_name_their_fault(fields: dict[Any, Any], expected: str) -> None:
    """Each classic malformed entry is refused with a message an operator can act on."""
    with pytest.raises(WireFormatError) as caught:
        decode_entry(fields)
    assert expected in str(caught.value)


def test_a_ten_megabyte_observation_decodes() -> None:
    """A huge but valid observation is a message, not a crash (size is the tools' business)."""
    fence = Fence(task_id="t1", step_id="s", iteration=0, attempt=0, call_id="c1")
    message = ToolObservedMessage(
        fence=fence, observation=Observation(source="tool", content="x" * 10_000_000)
    )
    assert decode_entry(encode_entry(message)) == message


# -- the machine: wrong fences ----------------------------------------------------------------


@settings(deadline=None, max_examples=150)
@given(st.sampled_from(STATES), st.data())
def test_a_message_with_a_stale_fence_changes_nothing(state: str, data: st.DataObject) -> None:
    """Other task, other step, old iteration, other attempt: ignored, the record untouched."""
    record = _record(state)
    before = record.model_dump()
    fence = data.draw(stale_fences(_awaited(record)))
    message = data.draw(any_message(fence))
    effects = _apply(record, message)
    assert effects.changed is False
    assert effects.reason_dispatches == []
    assert effects.tool_dispatches == []
    assert effects.journal == []
    assert effects.events == []
    assert effects.dead_letters == []
    assert effects.reviews == []
    assert record.model_dump() == before


@settings(deadline=None, max_examples=100)
@given(st.sampled_from(["tools", "verify"]), st.data())
def test_an_observation_for_an_unknown_call_changes_nothing(
    state: str, data: st.DataObject
) -> None:
    """The awaited iteration but a call id that was never dispatched: ignored."""
    record = _record(state)
    assert record.awaiting is not None
    known = {c.call_id for c in record.awaiting.calls}
    call_id = data.draw(st.one_of(st.none(), IDS).filter(lambda c: c not in known))
    fence = _awaited(record).model_copy(update={"call_id": call_id})
    message = data.draw(tool_observed_messages(fence))
    before = record.model_dump()
    assert _apply(record, message).changed is False
    assert record.model_dump() == before


@settings(deadline=None, max_examples=100)
@given(st.sampled_from(["plan", "reason"]), st.data())
def test_tool_observations_while_reasoning_change_nothing(state: str, data: st.DataObject) -> None:
    """A tool observation carrying the awaited fence of a reasoning dispatch is ignored."""
    record = _record(state)
    before = record.model_dump()
    call_id = data.draw(IDS)
    message = data.draw(tool_observed_messages(_awaited(record).for_call(call_id)))
    assert _apply(record, message).changed is False
    assert record.model_dump() == before


# -- the machine: matching fences, odd content, duplicates ------------------------------------


def _matching(record: TaskRecord, data: st.DataObject) -> Message:
    awaiting = record.awaiting
    assert awaiting is not None
    if awaiting.kind in (AwaitKind.REASON, AwaitKind.PLAN):
        choice = data.draw(st.sampled_from(["reasoned", "failed"]))
        if choice == "reasoned":
            return data.draw(reasoned_messages(awaiting.fence))
        return data.draw(worker_failures(awaiting.fence))
    call_id = data.draw(st.sampled_from([c.call_id for c in awaiting.calls]))
    choice = data.draw(st.sampled_from(["observed", "failed"]))
    if choice == "observed":
        return data.draw(tool_observed_messages(awaiting.fence.for_call(call_id)))
    return data.draw(worker_failures(awaiting.fence.for_call(call_id)))


@settings(deadline=None, max_examples=200)
@given(st.sampled_from(STATES), st.data())
def test_a_matching_message_with_odd_content_is_applied_once(
    state: str, data: st.DataObject
) -> None:
    """Garbage tool calls, plans, usage, outputs: applied without raising, a duplicate is
    ignored, and the record still round-trips through JSON (the store can save it; the
    conversation is stored apart)."""
    record = _record(state)
    message = _matching(record, data)
    first = _apply(record, message)
    assert first.changed is True
    restored = TaskRecord.model_validate_json(record.model_dump_json())
    restored.conversation = record.conversation  # stored apart, message by message
    assert restored == record
    after_first = record.model_dump()
    second = _apply(record, message, now=6.0)
    assert second.changed is False
    assert record.model_dump() == after_first
    for request in first.reason_dispatches + first.tool_dispatches:
        assert type(request).model_validate_json(request.model_dump_json()) == request


@settings(deadline=None, max_examples=50)
@given(st.data())
def test_a_long_run_of_duplicates_and_stale_messages_applies_each_iteration_once(
    data: st.DataObject,
) -> None:
    """Every answer delivered twice, mixed with replays of older ones: each iteration is
    applied once and the journal has no gap."""
    record = _record("tools")
    delivered: list[Message] = []
    journal = []
    for _ in range(6):
        for message in _answers(record, len(delivered)):
            replays = (
                data.draw(st.lists(st.sampled_from(delivered), max_size=3)) if delivered else []
            )
            for replay in [*replays, message, message]:
                journal += _apply(record, replay).journal
            delivered.append(message)
    assert record.iteration == 4
    sequences = [entry.sequence for entry in journal]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    reasoned = [e.iteration for e in journal if e.event.type == "ReasoningComplete"]
    assert reasoned == [2, 3, 4]
    collected = [e.iteration for e in journal if e.event.type == "ObservationsCollected"]
    assert collected == [1, 2, 3]


def _answers(record: TaskRecord, serial: int) -> list[Message]:
    """The clean answers to what the record awaits: one per tool call, or one reasoning turn."""
    awaiting = record.awaiting
    assert awaiting is not None
    if awaiting.kind is AwaitKind.TOOLS:
        return [
            ToolObservedMessage(
                fence=awaiting.fence.for_call(c.call_id),
                observation=Observation(source="file_read", content=f"v{serial}-{c.call_id}"),
            )
            for c in awaiting.calls
        ]
    calls = [_call(f"k{serial}", arguments=json.dumps({"path": f"f{serial}"}))]
    return [ReasonedMessage(fence=awaiting.fence, actions=calls, approved_calls=calls)]


# -- bugs found here and fixed in coordinator/machine/ -------------------------------------


def test_verify_exit_code_with_two_minus_signs_does_not_crash_the_machine() -> None:
    """A verification observation whose exit_code is '--5' fails the check, it does not raise."""
    record = _record("verify")
    fence = _awaited(record).for_call(record.awaiting.calls[0].call_id)  # type: ignore[union-attr]
    observation = Observation(source="run_command", content="", metadata={"exit_code": "--5"})
    _apply(record, ToolObservedMessage(fence=fence, observation=observation))


def test_a_tool_kind_the_detector_does_not_know_does_not_crash_the_machine() -> None:
    """A plugin tool reporting metadata kind='search' is observed as 'other', not a crash."""
    record = _record("tools")
    for call_id in ("c1", "c2"):
        observation = Observation(source="search", content="x", metadata={"kind": "search"})
        _apply(
            record,
            ToolObservedMessage(fence=_awaited(record).for_call(call_id), observation=observation),
        )


def test_a_non_numeric_exit_code_does_not_crash_the_machine() -> None:
    """A tool reporting exit_code='n/a' is observed, not a crash."""
    record = _record("tools")
    for call_id in ("c1", "c2"):
        observation = Observation(source="t", content="x", metadata={"exit_code": "n/a"})
        _apply(
            record,
            ToolObservedMessage(fence=_awaited(record).for_call(call_id), observation=observation),
        )


def test_an_observation_naming_another_call_does_not_crash_the_machine() -> None:
    """An observation whose own call_id differs from its fence's is handled, not a crash."""
    record = _record("tools")
    for call_id in ("c1", "c2"):
        observation = Observation(source="t", content="x", call_id="zz")
        _apply(
            record,
            ToolObservedMessage(fence=_awaited(record).for_call(call_id), observation=observation),
        )


@pytest.mark.parametrize("failure", ["termination", "reason_failed", "tool_failed"])
def test_a_duplicate_failure_is_not_applied_to_the_next_attempt(failure: str) -> None:
    """An inference or tool failure delivered twice counts one failed attempt, not two."""
    record = _record("tools" if failure == "tool_failed" else "reason")
    fence = _awaited(record)
    message: Message
    if failure == "termination":
        reason = TerminationReason.error("Inference failed: HTTP 500")
        message = ReasonedMessage(fence=fence, termination=reason)
    else:
        fence = fence.for_call("c1") if failure == "tool_failed" else fence
        message = WorkerFailedMessage(fence=fence, error="ConfigError: no key", retryable=False)
    assert _apply(record, message).changed is True
    assert _apply(record, message, now=6.0).changed is False
    assert record.steps[0].attempts == 1


def test_a_deeply_nested_plan_falls_back_instead_of_crashing() -> None:
    """A plan reply of 100,000 brackets falls back to one step, like any unusable plan."""
    assert parse_plan("[" * 100_000) == []


def test_a_plan_with_a_huge_timeout_falls_back_instead_of_crashing() -> None:
    """A plan whose done_when timeout overflows a timedelta is unusable, not a crash."""
    step = {"id": "a", "instruction": "x", "done_when": {"command": "c", "timeout": 1e300}}
    assert parse_plan(json.dumps({"steps": [step]})) == []
