"""Bad input against the real runtime: Redis, a Celery worker and the coordinator as processes.

Malformed tasks, garbage stream entries, misdirected and duplicated observations, bad control
messages and a model that answers junk are sent next to valid tasks. Each bad item ends where an
operator can read why (``orga:rejected``, ``orga:dead_letter`` or a ``control_rejected`` event);
the valid work completes; neither process dies; nothing stays pending in the consumer groups.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest
import redis

from coordinator.state import AwaitKind
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.protocol import (
    PROTOCOL_VERSION,
    Fence,
    ReasonedMessage,
    WorkerFailedMessage,
    encode_entry,
)
from shared.task_spec import MAX_TASK_BYTES
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import PARTITIONS, Cluster, assert_journal_is_clean, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One worker and one coordinator; the worker lets a task name its model's base URL (the
    fake model of this module listens on 127.0.0.1)."""
    running = Cluster(private_redis.url, tmp_path_factory.mktemp("cluster"))
    try:
        running.worker(ORGA_ALLOW_TASK_BASE_URL="true")
        running.coordinator()
        yield running
    finally:
        running.stop()


@pytest.fixture
def raw(cluster: Cluster) -> Iterator[redis.Redis]:
    """A plain client for writing garbage straight into the streams."""
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    """A local OpenAI-compatible server the worker process calls (127.0.0.1, no key)."""
    with FakeOpenAIServer() as server:
        yield server


def _say(text: str, step: str = "s") -> dict[str, Any]:
    return {
        "goal": "answer",
        "provider": {"kind": "scripted", "replies": [text]},
        "steps": [{"id": step, "instruction": "say it"}],
    }


def _slow() -> dict[str, Any]:
    # Two calls, so that the reasoning is applied on its own and the task then awaits its
    # tools for 3 s (a lone call would carry its reasoning to the tool worker).
    command = {"name": "run_command", "arguments": {"command": "sleep 3; echo slept"}}
    other = {"name": "run_command", "arguments": {"command": "echo awake"}}
    return {
        "goal": "take a while",
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [command, other]}, "finished"],
        },
        "steps": [{"id": "work", "instruction": "sleep"}],
        "stagnation": {"enabled": False},
    }


def _alias_bomb() -> str:
    anchors = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    anchors += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "goal: g\nprovider:\n  replies:\n    - text: hi\n" + "".join(
        f"      {line}\n" for line in anchors
    )


# Each bad submission and a phrase its rejection must contain.
BAD_TASKS: dict[str, tuple[str, str]] = {
    "malformed-yaml": ("goal: [unclosed", "not valid YAML or JSON"),
    "missing-goal": (json.dumps({"steps": [{"id": "x", "instruction": "y"}]}), "goal: Field"),
    "huge": ("goal: " + "x" * (MAX_TASK_BYTES + 10), f"the limit is {MAX_TASK_BYTES} bytes"),
    "empty": ("   \n", "the task is empty"),
    "not-a-mapping": ("- just\n- a list\n", "a task must be a mapping"),
    "nested-100k": ('{"goal": "g", "x": ' + "[" * 100_000, "nested too deeply"),
    "alias-bomb": (_alias_bomb(), "more than 100000 values"),
    "lone-surrogate": ('{"goal": "g", "metadata": {"k": "\\udc00"}}', "unpaired surrogate"),
    "bad-tag": ("goal: !!timestamp not-a-date\n", "a tagged value cannot be read"),
    "typo": (json.dumps({"goal": "g", "stagnation": {"enabld": False}}), "stagnation.enabld"),
    "secret": (json.dumps({"goal": "g", "provider": {"api_key": "sk-x"}}), "secrets must not"),
    "overflow": (json.dumps({"goal": "g", "limits": {"step_timeout": 1e300}}), "out of range"),
}


def _p(task_id: str) -> int:
    """The partition of a task (its streams are that partition's)."""
    return keys.partition_of(task_id, PARTITIONS)


def _fence(task_id: str, **fields: Any) -> Fence:
    return Fence(task_id=task_id, **{"step_id": "work", "iteration": 0, "attempt": 0, **fields})


def _llm_task(base_url: str) -> dict[str, Any]:
    return {
        "goal": "survive a confused model",
        "provider": {"kind": "openai", "base_url": base_url, "model": "gpt-test"},
        "steps": [{"id": "s", "instruction": "look around"}],
        "stagnation": {"enabled": False},
    }


def _confused_replies(model: FakeOpenAIServer) -> None:
    """A non-JSON page, then five tool calls of which one is valid, then an answer."""
    model.respond_raw("<html><body>502 Bad Gateway</body></html>", status=200)
    calls = [
        ("bad_json", "file_read", '{"path": '),
        ("unknown", "teleport", "{}"),
        ("not_object", "file_read", "[1, 2]"),
        ("escape", "file_read", '{"path": "../../../../etc/passwd"}'),
        ("good", "file_list", "{}"),
    ]
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }
    model.respond_json({"choices": [{"message": message, "finish_reason": "tool_calls"}]})
    model.respond_text("done despite the bad calls")


def _xadd(raw: redis.Redis, stream: str, fields: Mapping[str, str]) -> str:
    """XADD with plain string fields; the entry id."""
    return str(raw.xadd(stream, cast("Any", dict(fields))))


def _entries(raw: redis.Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    rows = cast("list[tuple[str, dict[str, str]]]", raw.xrange(stream))
    return [(str(i), dict(f)) for i, f in rows]


def _pending(raw: redis.Redis, stream: str) -> int:
    summary: dict[str, Any] = raw.xpending(stream, keys.coordinator_group)
    return int(summary["pending"])


def test_bad_input_is_refused_with_reasons_and_valid_work_completes(
    cluster: Cluster, raw: redis.Redis, model: FakeOpenAIServer
) -> None:
    """Bad tasks, garbage and stale stream entries, bad control messages and a confused model,
    all at once beside valid tasks: every bad item is recorded with a readable reason, the
    valid tasks complete, both processes survive and no entry is left pending."""
    client = cluster.client()
    worker, coordinator = cluster.processes
    good = [client.submit(_say(f"hello {i}")) for i in range(3)]
    slow = client.submit(_slow())
    _confused_replies(model)
    confused = client.submit(_llm_task(model.base_url))
    bad = {name: client.submit(text) for name, (text, _why) in BAD_TASKS.items()}
    _xadd(raw, keys.intake_stream(0), {"task": "goal: [unclosed"})  # no task_id: one is made up
    _xadd(raw, keys.intake_stream(_p("no-task-field")), {"task_id": "no-task-field"})

    # Observations: undecodable entries go to the dead-letter stream...
    garbage = {
        _xadd(raw, keys.observations_stream(0), fields): why
        for fields, why in [
            ({"v": "99", "kind": "reasoned", "body": "{}"}, "unsupported protocol version '99'"),
            ({"v": PROTOCOL_VERSION, "kind": "reasoned"}, "stream entry has no 'body' field"),
            ({os.urandom(8).hex(): os.urandom(48).hex()}, "unsupported protocol version None"),
            ({"v": PROTOCOL_VERSION, "kind": "worker_failed", "body": "{not json"}, "Invalid JSON"),
            ({"v": PROTOCOL_VERSION, "kind": "reasoned", "body": "[" * 50_000}, "recursion limit"),
            (
                {"v": PROTOCOL_VERSION, "kind": "bogus", "body": '{"kind": "bogus"}'},
                "does not match",
            ),
            (
                {
                    "v": PROTOCOL_VERSION,
                    "body": json.dumps({"kind": "worker_failed", "error": "x" * 2_000_000}),
                },
                "worker_failed.fence: Field required",
            ),
        ]
    }
    # ...while well-formed messages for no task are acknowledged and ignored.
    stray = [
        _xadd(raw, keys.observations_stream(0), encode_entry(message))
        for message in (
            WorkerFailedMessage(fence=_fence("no-such-task"), error="boom"),
            ReasonedMessage(fence=_fence("no-such-task"), terminal_output="hijacked"),
        )
    ]

    # Stale fences for a task that is running: the reasoning it already applied, an iteration
    # it never reached, an attempt that was never dispatched.
    wait_until(lambda: _awaits_tools(client, slow), 60, "the slow task to run its command")
    for fence in [
        _fence(slow),
        _fence(slow, iteration=7),
        _fence(slow, iteration=1, attempt=5, call_id="call_1"),
        _fence(slow, step_id="other"),
    ]:
        stale = ReasonedMessage(fence=fence, terminal_output="stale")
        failed = WorkerFailedMessage(fence=fence, error="x")
        _xadd(raw, keys.observations_stream(_p(slow)), encode_entry(stale))
        _xadd(raw, keys.observations_stream(_p(slow)), encode_entry(failed))

    # Control messages that make no sense.
    # (Each in its task's partition's stream; one id each, as the events name only the id.)
    first_ms = int(time.time() * 1000) + 1000
    controls = [
        str(raw.xadd(keys.control_stream(_p(fields.get("task_id", ""))), cast("Any", fields),
                     id=f"{first_ms}-{n}"))
        for n, fields in enumerate([
            {"action": "explode", "task_id": good[0]},
            {"action": "review", "task_id": slow, "review_id": "nope", "decision": "retry"},
            {"action": "review", "task_id": good[0], "decision": "maybe"},
            {"action": "cancel", "task_id": "no-such-task"},
            {os.urandom(4).hex(): os.urandom(16).hex()},
        ])
    ]  # fmt: skip

    # The valid work completes.
    for task_id in good:
        assert client.wait(task_id, timeout_s=60)["status"] == "completed", cluster.logs()
    result = client.wait(slow, timeout_s=60)
    assert result["status"] == "completed", cluster.logs()
    assert result["output"] == "finished"
    assert_journal_is_clean(client.journal(slow))
    result = client.wait(confused, timeout_s=60)
    assert result["status"] == "completed", cluster.logs()
    assert result["output"] == "done despite the bad calls"

    # A duplicate of an observation already applied to a finished task changes nothing.
    applied = [
        f
        for _i, f in _entries(raw, keys.observations_stream(_p(good[0])))
        if good[0] in f.get("body", "")
    ]
    for fields in applied:
        _xadd(raw, keys.observations_stream(_p(good[0])), fields)

    _assert_rejections(client, bad)
    _assert_dead_letters(raw, garbage, stray)
    _assert_wrong_observations_recorded(client, slow)
    _assert_control_rejections(client, controls)
    _assert_the_model_saw_every_refusal(client, confused, model)
    assert client.result(good[0])["output"] == "hello 0"

    streams = (keys.intake_stream, keys.observations_stream, keys.control_stream)
    for stream in (kind(p) for kind in streams for p in range(PARTITIONS)):
        wait_until(lambda s=stream: _pending(raw, s) == 0, 20, f"no pending entry on {stream}")
    assert worker.popen is not None
    assert coordinator.popen is not None
    assert worker.popen.poll() is None, worker.tail()
    assert coordinator.popen.poll() is None, coordinator.tail()
    assert "loop_failed" not in coordinator.log.read_text(errors="replace"), coordinator.tail()


def _with_pattern(task: dict[str, Any], pattern: str) -> dict[str, Any]:
    return {**task, "pre_hydration": {"custom_patterns": [{"ref_type": "x", "pattern": pattern}]}}


def test_task_patterns_can_neither_freeze_nor_wedge_the_coordinator(cluster: Cluster) -> None:
    """Issue 12, items 1 and 2 as submitted: ``(a+)+$`` against its goal runs and completes,
    ``(unclosed`` and a backreference in a deny pattern are on orga:rejected naming the
    pattern, and a valid task submitted after them completes."""
    client = cluster.client()
    redos = client.submit(
        _with_pattern({**_say("x"), "goal": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"}, "(a+)+$"),
        task_id="redos-1",
    )
    unclosed = client.submit(_with_pattern(_say("x"), "(unclosed"))
    backreference = client.submit({**_say("x"), "policy": {"deny_patterns": [r"(rm) \1"]}})
    valid = client.submit(_say("still served"))

    assert client.wait(valid, timeout_s=60)["output"] == "still served", cluster.logs()
    assert client.wait(redos, timeout_s=60)["status"] == "completed", cluster.logs()
    wait_until(lambda: client.rejection(backreference) is not None, 30, "the rejections")
    reason = client.rejection(unclosed) or ""
    assert "pre_hydration.custom_patterns" in reason, reason
    assert "the pattern '(unclosed' cannot be used: it is not valid RE2 syntax" in reason, reason
    reason = client.rejection(backreference) or ""
    assert "policy.deny_patterns" in reason, reason
    assert "it has a backreference" in reason, reason


def _awaits_tools(client: Any, task_id: str) -> bool:
    try:
        awaiting = client.record(task_id).awaiting
    except Exception:
        return False
    return awaiting is not None and awaiting.kind is AwaitKind.TOOLS


def _assert_rejections(client: Any, bad: dict[str, str]) -> None:
    """Each bad submission is on orga:rejected with a reason naming its fault."""
    last = bad["overflow"]
    wait_until(lambda: client.rejection(last) is not None, 30, "the last rejection")
    for name, task_id in bad.items():
        reason = client.rejection(task_id)
        assert reason is not None, name
        assert BAD_TASKS[name][1] in reason, (name, reason)
        assert reason.startswith("intake entry "), reason
        assert len(reason) < 3000, (name, len(reason))
    assert "the task is empty" in (client.rejection("no-task-field") or "")


def _assert_dead_letters(raw: redis.Redis, garbage: dict[str, str], stray: list[str]) -> None:
    """Each undecodable entry is dead-lettered with its error; the well-formed ones are not."""

    def dead() -> dict[str, dict[str, str]]:
        return {f["entry_id"]: f for _i, f in _entries(raw, keys.dead_letter_stream(0))}

    wait_until(lambda: set(garbage) <= set(dead()), 30, "every garbage entry dead-lettered")
    letters = dead()
    for entry_id, why in garbage.items():
        assert letters[entry_id]["stream"] == keys.observations_stream(0)
        assert why in letters[entry_id]["error"], (why, letters[entry_id]["error"])
        assert all(len(value) <= 4096 for value in letters[entry_id].values())
    assert not set(stray) & set(letters)
    assert all(f.get("stream") != keys.observations_stream(0) or f["entry_id"] in garbage
               for f in letters.values())  # fmt: skip


def _assert_wrong_observations_recorded(client: Any, slow: str) -> None:
    """Observations for no task and for a step the task does not have are recorded as
    ``observation_refused`` events with their reason (stale ones are not)."""
    refused = {
        (f["task_id"], f["reason"])
        for _i, f in client.events(count=100_000)
        if f.get("event") == "observation_refused"
    }
    assert {("no-such-task", "unknown_task"), (slow, "unknown_step")} <= refused, refused


def _assert_control_rejections(client: Any, controls: list[str]) -> None:
    """Each bad control message is acknowledged with a control_rejected event saying why."""

    def rejected() -> dict[str, str]:
        return {
            f["entry_id"]: f["error"]
            for _i, f in client.events()
            if f.get("event") == "control_rejected"
        }

    wait_until(lambda: set(controls) <= set(rejected()), 30, "every control message refused")
    errors = [rejected()[entry_id] for entry_id in controls]
    assert "unknown control action 'explode'" in errors[0]
    assert "is not waiting for a review" in errors[1]
    assert "unknown review decision 'maybe'" in errors[2]
    assert "task 'no-such-task' is unknown or has already ended" in errors[3]
    assert "unknown control action None" in errors[4]


def _assert_the_model_saw_every_refusal(client: Any, task_id: str, model: FakeOpenAIServer) -> None:
    """The junk reply failed one attempt; each bad call was answered, the good one ran."""
    record = client.record(task_id)
    answers = {
        m.tool_call_id: m.content for m in record.conversation.messages if m.role.value == "tool"
    }
    assert answers["bad_json"].startswith("[Schema validation failed] tool 'file_read' arguments")
    assert "not valid JSON" in answers["bad_json"]
    assert answers["not_object"].startswith("[Schema validation failed]")
    assert "must be a JSON object, got array" in answers["not_object"]
    assert answers["escape"].startswith("[Policy denied] rule 'workspace-paths'")
    assert "Unknown tool 'teleport'" in answers["unknown"]
    assert answers["good"] == "[. is empty]"  # file_list of the fresh workspace
    failures = [m.content for m in record.conversation.messages if "[Coordinator]" in m.content]
    assert len(failures) == 1
    assert "not JSON" in failures[0]
    last_request = json.dumps(model.requests[-1].body["messages"])
    assert "[Schema validation failed]" in last_request
    assert "[Policy denied]" in last_request
    assert model.pending == 0
