"""Malformed task files (hypothesis): a clear TaskSpecError or a valid spec that round-trips."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.state import TaskRecord
from shared.conversation import Conversation, ConversationMessage
from shared.pre_hydration import PreHydrationEngine
from shared.protocol import ReasonRequest, ToolRequest
from shared.task_spec import (
    MAX_TASK_BYTES,
    MAX_TASK_DEPTH,
    MAX_TASK_VALUES,
    TaskSpec,
    TaskSpecError,
    parse_task,
    parse_task_text,
)

SETTINGS = MachineSettings(workspace_root="/ws")

VALID: dict[str, Any] = {
    "goal": "fix the bug",
    "agent_id": "agent-1",
    "steps": [
        {"id": "reproduce", "instruction": "run the tests", "done_when": "pytest -q"},
        {"id": "fix", "instruction": "fix it", "max_iterations": 4},
    ],
    "provider": {"kind": "scripted", "replies": ["done", {"text": "ok"}]},
    "tools": ["file_read", "run_command"],
    "policy": {"kind": "default", "deny_patterns": ["npm publish"]},
    "limits": {"max_iterations": 10, "step_timeout": "2m", "tool_timeout": 30},
    "review": {"deadline": "1h", "default_decision": "skip"},
    "recovery": {"strategy": "retry", "max_attempts": 2},
    "metadata": {"team": "infra"},
}

# Leaves a random mutation may replace, with the field name the error must mention.
FIELDS = [
    ("goal",),
    ("agent_id",),
    ("idempotency_key",),
    ("steps",),
    ("steps", 0),
    ("steps", 0, "id"),
    ("steps", 0, "instruction"),
    ("steps", 0, "done_when"),
    ("steps", 1, "max_iterations"),
    ("provider",),
    ("provider", "kind"),
    ("provider", "replies"),
    ("tools",),
    ("policy",),
    ("policy", "kind"),
    ("limits",),
    ("limits", "max_iterations"),
    ("limits", "step_timeout"),
    ("limits", "temperature"),
    ("review", "deadline"),
    ("review", "default_decision"),
    ("recovery",),
    ("stagnation",),
    ("step_iteration",),
    ("context",),
    ("metadata",),
    ("metadata", "team"),
]

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "-1s",
            "5 parsecs",
            "1e400",
            "99999999999d",
            "nan",
            "inf",
            "1h30x",
            "Retry",
            "DeadLetter",
            "permissive",
            "cedar",
            "opa",
            "../../etc/passwd",
            "\x00",
            "\udc00",
        ]
    ),
    st.binary(max_size=8),
    st.dates(),
    st.sampled_from([10**30, -(10**30), 2**63, 1e300, -1e300, float("nan"), float("inf")]),
)
GARBAGE = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), children, max_size=4),
    ),
    max_leaves=12,
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
YAML_TOKENS = st.sampled_from(
    [
        "goal:", "goal: fix", "steps:", "- ", "  ", "\n", "id: a", "instruction: x", ":", "{",
        "}", "[", "]", ",", "'", '"', "&a ", "*a", "<<: *a", "? ", "|", ">", "!!binary ",
        "!!set ", "!!python/object:os.system ", "!!timestamp ", "%YAML 1.1\n", "---\n",
        "...\n", "#", "\t", "1:", "null:", "on:", "2024-01-01", ".nan", ".inf", "0x1f", "\x00",
        "provider: {kind: scripted, api_key: x}", "limits: {step_timeout: 1e400}",
    ]
)  # fmt: skip


def _mutate(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``document`` with the value at ``path`` replaced by ``value``."""
    copy: dict[str, Any] = json.loads(json.dumps(document))
    target: Any = copy
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return copy


def _outcome(data: Any, source: str = "task") -> TaskSpec | TaskSpecError:
    """parse_task's answer; any exception other than TaskSpecError fails the test."""
    try:
        return parse_task(data, source)
    except TaskSpecError as exc:
        return exc


def _assert_round_trips(spec: TaskSpec) -> None:
    """The spec, the record holding it (its conversation is stored apart, message by message)
    and the first dispatch all survive JSON."""
    assert TaskSpec.model_validate_json(spec.model_dump_json()) == spec
    assert parse_task(json.loads(spec.model_dump_json())) == spec
    record = TaskRecord(task_id="t1", spec=spec, created_at=0.0, updated_at=0.0)
    effects = TaskMachine(record, 1.0, SETTINGS).start()
    restored = TaskRecord.model_validate_json(record.model_dump_json())
    restored.conversation = Conversation(
        messages=[
            ConversationMessage.model_validate_json(m.model_dump_json())
            for m in record.conversation.messages
        ]
    )
    assert restored == record
    for request in effects.reason_dispatches:
        assert ReasonRequest.model_validate_json(request.model_dump_json()) == request
    for tool in effects.tool_dispatches:
        assert ToolRequest.model_validate_json(tool.model_dump_json()) == tool


def _assert_readable(error: TaskSpecError, source: str) -> None:
    message = str(error)
    assert message.startswith(f"{source}: ")
    assert len(message) > len(source) + 10
    assert len(message) < 5000


def test_the_base_document_is_valid() -> None:
    """The document the mutations start from is a valid task that round-trips."""
    spec = parse_task(VALID)
    _assert_round_trips(spec)


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), GARBAGE)
def test_a_garbage_field_is_rejected_by_name_or_accepted_and_round_trips(
    path: tuple[Any, ...], value: Any
) -> None:
    """Any value at any field: a TaskSpecError naming that field, or a spec that round-trips."""
    document = _mutate(VALID, path, value)
    outcome = _outcome(document, "mutated.yaml")
    if isinstance(outcome, TaskSpec):
        _assert_round_trips(outcome)
        return
    _assert_readable(outcome, "mutated.yaml")
    named = str(path[0])
    assert named in str(outcome), (path, str(outcome))


@settings(deadline=None, max_examples=100)
@given(st.dictionaries(st.text(max_size=12), GARBAGE, max_size=6), st.booleans())
def test_random_mappings_never_raise_anything_but_task_spec_error(
    extra: dict[str, Any], keep_goal: bool
) -> None:
    """Unknown fields, missing goal, nested garbage: TaskSpecError or a round-tripping spec."""
    document = {"goal": "g", **extra} if keep_goal else extra
    outcome = _outcome(document, "random")
    if isinstance(outcome, TaskSpec):
        assert set(document) <= set(TaskSpec.model_fields)
        _assert_round_trips(outcome)
    else:
        _assert_readable(outcome, "random")
        shown = [repr(k) if not k or "." in k or k.strip() != k else k for k in document]
        assert any(name in str(outcome) for name in ["goal", *shown]), str(outcome)


@settings(deadline=None, max_examples=200)
@given(st.lists(YAML_TOKENS, max_size=30).map("".join))
def test_yaml_fragments_give_a_spec_or_a_task_spec_error(text: str) -> None:
    """Random YAML-ish text through the intake path: TaskSpecError or a valid spec."""
    try:
        spec = parse_task_text(text, source="intake entry 1-0")
    except TaskSpecError as exc:
        _assert_readable(exc, "intake entry 1-0")
        return
    _assert_round_trips(spec)


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=200))
def test_arbitrary_text_gives_a_spec_or_a_task_spec_error(text: str) -> None:
    """Any unicode text, as YAML and as JSON: never another exception type."""
    for source in ("arbitrary.yaml", "arbitrary.json"):
        try:
            spec = parse_task_text(text, source=source)
        except TaskSpecError as exc:
            _assert_readable(exc, source)
            continue
        _assert_round_trips(spec)


@settings(deadline=None, max_examples=150)
@given(JSON_VALUES)
def test_json_documents_give_a_spec_or_a_task_spec_error(value: Any) -> None:
    """Any JSON document (lists, scalars, objects without goal): TaskSpecError or a spec."""
    text = json.dumps(value)
    try:
        spec = parse_task_text(text, source="doc.json")
    except TaskSpecError as exc:
        _assert_readable(exc, "doc.json")
        return
    _assert_round_trips(spec)


# A float has 53 bits: durations given as float seconds beyond 2**53 microseconds (285 years)
# cannot be exact. Text durations are (test_huge_durations_round_trip_exactly).
_EXACT_SECONDS = 2**53 / 1e6


@settings(deadline=None, max_examples=60)
@given(st.sampled_from(["step_timeout", "tool_timeout"]), st.floats(allow_nan=True))
def test_any_duration_number_is_accepted_or_rejected_by_name(field: str, seconds: float) -> None:
    """Durations from NaN to 1e308: a spec, or an error naming limits (never OverflowError)."""
    outcome = _outcome({"goal": "g", "limits": {field: seconds}})
    if isinstance(outcome, TaskSpec):
        if seconds < _EXACT_SECONDS:
            _assert_round_trips(outcome)
    else:
        assert "limits" in str(outcome)


def test_huge_durations_round_trip_exactly() -> None:
    """A duration past 2**53 microseconds is written and read back unchanged."""
    _assert_round_trips(parse_task({"goal": "g", "limits": {"step_timeout": 288230376152.59375}}))


@settings(deadline=None, max_examples=60)
@given(st.text(alphabet="0123456789.e+-smhdu xyz", max_size=16))
def test_any_duration_text_is_accepted_or_rejected_by_name(text: str) -> None:
    """Duration strings, valid or not: a spec, or an error naming the review deadline."""
    outcome = _outcome({"goal": "g", "review": {"deadline": text}})
    if isinstance(outcome, TaskSpec):
        _assert_round_trips(outcome)
    else:
        assert "review" in str(outcome)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"steps": [{"id": "a", "instruction": "x"}]}, "goal: Field required"),
        ({"goal": ""}, "goal: String should have at least 1 character"),
        ({"goal": 5}, "goal: Input should be a valid string"),
        ({"goal": "g", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"goal": "g", "stagnation": {"enabld": False}}, "stagnation.enabld: Extra inputs"),
        ({"goal": "g", "step_iteration": {"max_reatempts": 1}}, "step_iteration.max_reatempts"),
        ({"goal": "g", "recovery": {"strategy": "retry", "tries": 1}}, "recovery.retry.tries"),
        (
            {"goal": "g", "steps": [{"id": "a", "instruction": "x"}] * 2},
            "step id 'a' is used twice",
        ),
        ({"goal": "g", "steps": [{"id": "../x", "instruction": "x"}]}, "steps.0.id"),
        ({"goal": "g", "limits": {"step_timeout": "5 parsecs"}}, "limits.step_timeout"),
        ({"goal": "g", "limits": {"step_timeout": "-1s"}}, "limits.step_timeout"),
        ({"goal": "g", "limits": {"step_timeout": "1e400"}}, "limits: value out of range"),
        ({"goal": "g", "review": {"deadline": 1e300}}, "review: value out of range"),
        ({"goal": "g", "provider": {"api_key": "sk-1"}}, "provider.api_key: secrets must not"),
        ({"goal": "g", "provider": {"Auth_Token": "x"}}, "provider.Auth_Token: secrets"),
        ({"goal": "g", "policy": {"kind": "allow-all"}}, "policy.kind: Input should be"),
        ({"goal": "g", "policy": {"kind": "cedar"}}, "policy kind 'cedar' needs policy_files"),
        ({"goal": "g", "provider": {1: "x"}}, "provider.1: the key 1 is not a string"),
        ({"goal": "g", "metadata": {"k": "\udc00"}}, "metadata.k: the text"),
        ({"goal": "g", "limits": {"temperature": float("nan")}}, "limits.temperature: nan"),
        (
            {"goal": "g", "provider": {"replies": [{"text": b"\xff"}]}},
            "provider.replies.0.text: a bytes value",
        ),
    ],
)
def test_known_bad_documents_name_their_fault(document: dict[str, Any], expected: str) -> None:
    """Each classic mistake is rejected with a message naming the field and the problem."""
    with pytest.raises(TaskSpecError) as caught:
        parse_task(document, source="bad.yaml")
    assert expected in str(caught.value)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [MAX_TASK_DEPTH - 4, MAX_TASK_DEPTH, 250, 5000])
def test_deep_nesting_is_refused_before_it_can_poison_the_store(depth: int) -> None:
    """Nesting the record's JSON could not reload is refused; shallow nesting round-trips."""
    document = {"goal": "g", "provider": {"replies": [{"text": "x", "deep": _nested(depth)}]}}
    if depth < MAX_TASK_DEPTH - 3:
        _assert_round_trips(parse_task(document))
        return
    with pytest.raises(TaskSpecError, match="nested more than"):
        parse_task(document)


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("deep.yaml", "goal: g\nx: " + "[" * 10_000),
        ("deep.yaml", "goal: g\nx: " + "{a: " * 10_000),
        ("deep.json", '{"goal": "g", "x": ' + "[" * 100_000),
        ("deep.json", '{"goal": "g", "x": ' + '{"a": ' * 100_000),
    ],
)
def test_text_nested_past_the_parser_limit_is_a_task_spec_error(source: str, text: str) -> None:
    """Thousands of opening brackets (a RecursionError in the parsers): a readable rejection."""
    with pytest.raises(TaskSpecError, match="nested too deeply"):
        parse_task_text(text, source=source)


def test_yaml_alias_bomb_is_refused_quickly() -> None:
    """A 600-byte billion-laughs task is refused instead of expanding in the coordinator."""
    anchors = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    anchors += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "goal: g\nprovider:\n  replies:\n    - text: hi\n" + "".join(
        f"      {line}\n" for line in anchors
    )
    assert len(text) < 1000
    with pytest.raises(TaskSpecError, match=f"more than {MAX_TASK_VALUES} values"):
        parse_task_text(text, source="bomb.yaml")


@pytest.mark.parametrize(
    ("filler", "size"),
    [("x", MAX_TASK_BYTES), ("é", MAX_TASK_BYTES // 2 + 1), ("x", 3 * MAX_TASK_BYTES)],
)
def test_huge_tasks_are_rejected_by_size(filler: str, size: int) -> None:
    """A task over 1 MiB (counted in UTF-8 bytes) names its size and the limit."""
    with pytest.raises(TaskSpecError) as caught:
        parse_task_text("goal: " + filler * size, source="huge.yaml")
    assert f"the limit is {MAX_TASK_BYTES} bytes" in str(caught.value)


def test_a_task_just_under_the_size_limit_is_accepted() -> None:
    """The size limit is not off by one: a goal that fits is accepted and round-trips."""
    text = "goal: " + "x" * (MAX_TASK_BYTES - len("goal: "))
    _assert_round_trips(parse_task_text(text, source="big.yaml"))


def _issue_task(pattern: str, goal: str = "x") -> str:
    """The JSON task of issue 12, items 1 and 2, with one custom pre-hydration pattern."""
    return json.dumps(
        {
            "goal": goal,
            "provider": {"kind": "scripted", "replies": ["x"]},
            "steps": [{"id": "s", "instruction": "x"}],
            "pre_hydration": {"custom_patterns": [{"ref_type": "x", "pattern": pattern}]},
        }
    )


@pytest.mark.parametrize(
    ("section", "why"),
    [
        ({"pre_hydration": {"custom_patterns": [{"ref_type": "x", "pattern": "(unclosed"}]}}, ""),
        ({"policy": {"kind": "default", "deny_patterns": ["(unclosed"]}}, ""),
        ({"pre_hydration": {"custom_patterns": [{"ref_type": "x", "pattern": "(?=a)a"}]}}, "look"),
        ({"policy": {"deny_patterns": [r"(rm) \1"]}}, "backreference"),
    ],
)
def test_patterns_that_do_not_compile_are_rejected_at_intake(
    section: dict[str, Any], why: str
) -> None:
    """A task pattern RE2 cannot take (issue 12, item 2) is a TaskSpecError naming it."""
    text = json.dumps({"goal": "x", **section})
    with pytest.raises(TaskSpecError) as caught:
        parse_task_text(text, source="redos-2")
    message = str(caught.value)
    assert message.startswith(f"redos-2: {next(iter(section))}.")
    assert "cannot be used: it " in message
    assert why in message


@pytest.mark.timeout(10)
def test_the_catastrophic_pattern_of_issue_12_is_accepted_and_harmless() -> None:
    """``(a+)+$`` is valid RE2: the task is accepted and its goal is searched at once."""
    spec = parse_task_text(_issue_task("(a+)+$", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"), "redos-1")
    engine = PreHydrationEngine(spec.pre_hydration)
    assert engine.extract_references(spec.goal) == []
