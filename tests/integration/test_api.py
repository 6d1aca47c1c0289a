"""`orga api` as a pipeline meets it: the installed entry point serving a real deployment (a real
Redis, real Celery worker processes, a coordinator process), driven over HTTP with httpx."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.client import task_text
from orga.api import SSE_PING_S
from shared.task_spec import load_task_file
from tests.integration.harness import (
    REPO,
    Cluster,
    Process,
    cli_env,
    on_16_partitions,
    run_orga,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

ORGA = Path(sys.executable).with_name("orga")
TOKEN = "api-test-token-0123456789abcdef"
WANDERER = REPO / "examples" / "wanderer" / "task.yaml"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[httpx.Client]:
    """`orga api` (the console script) serving the cluster; an httpx client with the token."""
    port = _free_port()
    env = cluster._env({"ORGA_API_TOKENS": f"another-token-0123456789,{TOKEN}"})
    command = [str(ORGA), "api", "--host", "127.0.0.1", "--port", str(port)]
    process = Process("api", command, env, cluster.root / "api.log").start()
    try:
        process.wait_for_log(f"API on http://127.0.0.1:{port}/v1/")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as c:
            yield c
    finally:
        process.stop()


def _quick(reply: str = "hi there") -> dict[str, Any]:
    return {
        "goal": "say hi",
        "provider": {"kind": "scripted", "replies": [reply]},
        "steps": [{"id": "s", "instruction": "say hi"}],
    }


def _several_turns() -> dict[str, Any]:
    """Three tool turns, one of them slow, then an answer: a journal long enough to cut."""
    turns = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}
        for command in ("echo one", "sleep 2; echo two", "echo three")
    ]
    return {
        "goal": "use the tools",
        "provider": {"kind": "scripted", "replies": [*turns, "done"]},
        "steps": [{"id": "s", "instruction": "run them"}],
        "stagnation": {"enabled": False},
    }


def _events(response: httpx.Response, limit: int | None = None) -> list[dict[str, Any]]:
    """Server-Sent Events off a streamed response: id, event, data (parsed JSON)."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if "event" in current:
                found.append(current)
                if limit is not None and len(found) == limit:
                    return found
            current = {}
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        current[name] = json.loads(value) if name == "data" else value
    return found


def _submit(api: httpx.Client, task: dict[str, Any], **headers: str) -> str:
    response = api.post("/v1/tasks", json=task, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["task_id"])


def _ended(api: httpx.Client, task_id: str) -> dict[str, Any]:
    wait_until(
        lambda: (
            api.get(f"/v1/tasks/{task_id}").json().get("status")
            in ("completed", "failed", "aborted")
        ),
        90,
        f"task {task_id} to end",
    )
    return dict(api.get(f"/v1/tasks/{task_id}/result").json())


def test_bad_tokens_are_refused(api: httpx.Client) -> None:
    """No token, a wrong one, or another scheme: 401 with a JSON error naming the header and
    the fix, and WWW-Authenticate; the OpenAPI description needs none."""
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Basic {TOKEN}"}):  # fmt: skip
        response = api.get("/v1/tasks", headers=headers)
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["field"] == "Authorization" and "ORGA_API_TOKENS" in error["fix"]
    spec = api.get("/v1/openapi.json", headers={"Authorization": ""})
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    assert "/v1/tasks/{task_id}/events" in paths and "/v1/reviews/{review_id}/decision" in paths
    assert "TaskSpec" in spec.json()["components"]["schemas"]
    assert spec.json()["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_bad_json_and_bad_fields_are_named(api: httpx.Client) -> None:
    """A body that is not JSON: 400 naming the body; a task with a wrong field: 422 naming
    each field (``body.steps.0.id``) with the fix."""
    broken = api.post(
        "/v1/tasks", content=b'{"goal": "x",', headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 400, broken.text
    assert broken.json()["error"]["field"] == "body"
    assert "not valid JSON" in broken.json()["error"]["message"]
    invalid = api.post("/v1/tasks", json={"goal": "x", "steps": [{"id": 3, "instruction": "y"}]})
    assert invalid.status_code == 422, invalid.text
    fields = [e["field"] for e in invalid.json()["errors"]]
    assert "body.steps.0.id" in fields
    assert invalid.json()["error"]["fix"]
    unknown = api.post("/v1/tasks", json={**_quick(), "colour": "blue"})
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "body.colour"
    decision = api.post("/v1/reviews/r1/decision", json={"decision": "maybe"})
    assert decision.status_code == 422 and decision.json()["error"]["field"] == "body.decision"
    assert api.get("/v1/tasks/nope-0/events").status_code == 404


def test_an_oversize_body_is_refused_before_it_is_read(api: httpx.Client) -> None:
    """413 as JSON for a body over the cap, declared (Content-Length) or streamed without a
    length; the API serves the next request."""
    big = b"x" * (2 << 20)
    declared = api.post("/v1/tasks", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["field"] == "body"

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    streamed = api.post("/v1/tasks", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text
    assert api.get("/v1/tasks").status_code == 200


@on_16_partitions
def test_the_same_idempotency_key_gives_the_same_task(api: httpx.Client) -> None:
    """Submitting twice with one Idempotency-Key: the same task id (the second marked
    replayed), one task in the list, and its result."""
    first = api.post("/v1/tasks", json=_quick("once"), headers={"Idempotency-Key": "api-k1"})
    assert first.status_code == 201, first.text
    task_id = first.json()["task_id"]
    wait_until(lambda: api.get(f"/v1/tasks/{task_id}").status_code == 200, 30, "acceptance")
    again = api.post("/v1/tasks", json=_quick("once"), headers={"Idempotency-Key": "api-k1"})
    assert again.status_code == 201 and again.json() == {"task_id": task_id, "replayed": True}
    assert again.headers["idempotent-replayed"] == "true"
    assert _ended(api, task_id)["output"] == "once"
    listed = [t["task_id"] for t in api.get("/v1/tasks", params={"limit": 500}).json()["tasks"]]
    assert listed.count(task_id) == 1
    differ = api.post(
        "/v1/tasks", json={**_quick(), "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    assert differ.status_code == 422 and differ.json()["error"]["field"] == "Idempotency-Key"


@on_16_partitions
def test_events_resume_after_a_disconnect_without_gap_or_duplicate(api: httpx.Client) -> None:
    """SSE of a running task, cut after three events and resumed with Last-Event-ID: every
    journal entry once, in order, then the terminal status as the last event; a resumption
    after the end repeats nothing; a malformed Last-Event-ID is a 400 naming it."""
    task_id = _submit(api, _several_turns())
    with api.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        first = _events(response, limit=3)
    resume = {"Last-Event-ID": first[-1]["id"]}
    with api.stream("GET", f"/v1/tasks/{task_id}/events", headers=resume) as response:
        rest = _events(response)
    seen = first + rest
    sequences = [e["data"]["sequence"] for e in seen if e["event"] == "journal"]
    assert sequences == list(range(len(sequences))), sequences
    assert seen[-1]["event"] == "status" and seen[-1]["data"]["status"] == "completed"
    statuses = [e["data"]["status"] for e in seen if e["event"] == "status"]
    assert len(statuses) == len(set(statuses)), statuses
    assert len(api.get(f"/v1/tasks/{task_id}/journal").json()["entries"]) == len(sequences)
    with api.stream(
        "GET", f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": seen[-1]["id"]}
    ) as response:
        assert _events(response) == []
    bad = api.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "Last-Event-ID"


def test_a_review_is_listed_shown_and_decided(api: httpx.Client, cluster: Cluster) -> None:
    """The wanderer escalates; its review is listed and shown; `abort` through the API is
    applied (the task ends aborted); a second decision is a 409 naming who decided."""
    task = json.loads(task_text(load_task_file(WANDERER)))
    task_id = _submit(api, task)
    client = cluster.client()
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 120, "escalation")
    review_id = api.get(f"/v1/tasks/{task_id}").json()["review_id"]
    listed = api.get("/v1/reviews").json()["reviews"]
    assert review_id in [r["review_id"] for r in listed]
    shown = api.get(f"/v1/reviews/{review_id}").json()
    assert shown["task_id"] == task_id and shown["source"] == "detector"
    decided = api.post(
        f"/v1/reviews/{review_id}/decision", json={"decision": "abort", "by": "alice"}
    )
    assert decided.status_code == 200, decided.text
    assert decided.json() == {"review_id": review_id, "task_id": task_id, "decision": "abort"}
    assert _ended(api, task_id)["status"] == "aborted"
    again = api.post(f"/v1/reviews/{review_id}/decision", json={"decision": "skip"})
    assert again.status_code in (404, 409), again.text
    assert "api:alice" in again.json()["error"]["message"] or again.status_code == 404
    journal = api.get(f"/v1/tasks/{task_id}/journal").json()["entries"]
    decided_by = [
        e["event"].get("decided_by") for e in journal if e["event"]["type"] == "ReviewDecided"
    ]
    assert decided_by == ["api:alice"], decided_by


@on_16_partitions
def test_tasks_are_listed_by_page_and_status(api: httpx.Client, cluster: Cluster) -> None:
    """Pages of one task follow each other by cursor with no task twice, newest first by
    creation time (the coordinator's, then the id; on several partitions not the order of
    submission: each partition's intake is read apart); a status filter keeps only that
    status; a bad cursor is a 400 naming it; cancel of an ended task is 409."""
    submitted = [_submit(api, _quick(f"n{i}")) for i in range(3)]
    for task_id in submitted:
        _ended(api, task_id)
    client = cluster.client()
    created = {task_id: client.record(task_id).created_at for task_id in submitted}
    ids = sorted(submitted, key=lambda task_id: (created[task_id], task_id))
    seen: list[str] = []
    cursor = None
    for _ in range(3):
        page = api.get("/v1/tasks", params={"limit": 1, **({"cursor": cursor} if cursor else {})})
        rows = page.json()["tasks"]
        assert len(rows) == 1
        seen.append(rows[0]["task_id"])
        cursor = page.json()["next_cursor"]
    assert seen == list(reversed(ids)), (seen, ids)
    done = api.get("/v1/tasks", params={"status": "completed", "limit": 500}).json()["tasks"]
    assert {t["status"] for t in done} == {"completed"} and set(ids) <= {t["task_id"] for t in done}
    unknown = api.get("/v1/tasks", params={"status": "done"})
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "query.status"
    bad = api.get("/v1/tasks", params={"cursor": "not a cursor"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "cursor"
    assert api.post(f"/v1/tasks/{ids[0]}/cancel", json={"reason": "late"}).status_code == 409


def test_orga_api_refuses_to_start_without_tokens(tmp_path: Path) -> None:
    """No ORGA_API_TOKENS, or a short one: exit 2 naming the setting and the fix, before any
    runtime starts."""
    missing = run_orga("api", "--port", str(_free_port()), env=cli_env(tmp_path))
    assert missing.returncode == 2, missing.stderr
    assert "ORGA_API_TOKENS is not set" in missing.stderr and "openssl rand" in missing.stderr
    short = run_orga(
        "api", "--port", str(_free_port()), env=cli_env(tmp_path, ORGA_API_TOKENS="short")
    )
    assert short.returncode == 2 and "shorter than 16" in short.stderr, short.stderr
    assert "short" not in short.stderr.replace("shorter", "")


def test_orga_api_serves_the_embedded_runtime(tmp_path: Path) -> None:
    """Without ORGA_REDIS_URL, `orga api` holds the embedded runtime (its Redis, workers and
    coordinator): a task submitted over HTTP completes, and its events end with the status."""
    port = _free_port()
    env = cli_env(tmp_path, ORGA_API_TOKENS=TOKEN)
    command = [str(ORGA), "api", "--port", str(port)]
    process = Process("embedded-api", command, env, tmp_path / "api.log").start()
    try:
        process.wait_for_log(f"API on http://127.0.0.1:{port}/v1/ (tasks of the embedded runtime")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as api:
            task_id = _submit(api, _quick("embedded"))
            with api.stream("GET", f"/v1/tasks/{task_id}/events") as response:
                seen = _events(response)
            assert seen[-1]["event"] == "status" and seen[-1]["data"]["status"] == "completed"
            assert api.get(f"/v1/tasks/{task_id}/result").json()["output"] == "embedded"
    finally:
        process.stop()
    assert process.popen is not None and process.popen.returncode == 0, process.tail()


def test_a_held_call_is_edited_through_the_api(api: httpx.Client, cluster: Cluster) -> None:
    """A gate's `ask` holds a `git push`; its review shows the call and its schema; an edit
    that does not fit the schema is a 422 naming `body.arguments` (the review stays open); an
    edit that fits runs instead of the push, and the journal says who edited what."""
    push = {"command": "git push origin main"}
    edited = {"command": "echo edited through the api"}
    task = {
        "goal": "ship the fix",
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [{"name": "run_command", "arguments": push}]}, "shipped"],
        },
        "steps": [{"id": "ship", "instruction": "push the branch"}],
        "policy": {"require_approval": ["run_command:git push*"]},
        "stagnation": {"enabled": False},
    }
    task_id = _submit(api, task)
    wait_until(
        lambda: api.get(f"/v1/tasks/{task_id}").json().get("status") == "awaiting_review",
        120,
        "the held call's review",
    )
    review_id = api.get(f"/v1/tasks/{task_id}").json()["review_id"]
    shown = api.get(f"/v1/reviews/{review_id}").json()
    assert shown["source"] == "call" and shown["snapshot"]["call"]["arguments"] == push, shown
    bad = api.post(
        f"/v1/reviews/{review_id}/decision",
        json={"decision": "edit", "arguments": {"command": 3}, "by": "bob"},
    )
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"]["field"] == "body.arguments", bad.json()
    assert "is not of type 'string'" in bad.json()["error"]["message"]
    assert review_id in [r["review_id"] for r in api.get("/v1/reviews").json()["reviews"]]
    no_arguments = api.post(f"/v1/reviews/{review_id}/decision", json={"decision": "edit"})
    assert no_arguments.status_code == 422, no_arguments.text
    good = api.post(
        f"/v1/reviews/{review_id}/decision",
        json={"decision": "edit", "arguments": edited, "by": "bob"},
    )
    assert good.status_code == 200, good.text
    assert _ended(api, task_id)["status"] == "completed"
    journal = api.get(f"/v1/tasks/{task_id}/journal").json()["entries"]
    (decision,) = [e["event"] for e in journal if e["event"]["type"] == "CallDecided"]
    assert decision["decision"] == "edit" and decision["decided_by"] == "api:bob", decision
    assert json.loads(decision["arguments_after"]) == edited


def test_resuming_the_events_of_a_quiet_task_answers_at_once(api: httpx.Client) -> None:
    """A task awaiting review sends nothing new: a client resuming with the last event's id
    gets the response's headers at once (not after the next event, which may be hours away)
    and a ping comment while nothing happens; an unknown task is still a 404 and a bad
    cursor a 400, before any stream."""
    task = {
        "goal": "ship the fix",
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [{"name": "run_command", "arguments": {
                "command": "git push origin main"}}]}, "shipped"],
        },
        "steps": [{"id": "ship", "instruction": "push the branch"}],
        "policy": {"require_approval": ["run_command:git push*"]},
        "stagnation": {"enabled": False},
    }  # fmt: skip
    task_id = _submit(api, task)
    with api.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        seen = []
        for event in _events_until(response, "awaiting_review"):
            seen.append(event)
    resume = {"Last-Event-ID": seen[-1]["id"]}
    started = time.monotonic()
    with api.stream(
        "GET", f"/v1/tasks/{task_id}/events", headers=resume, timeout=SSE_PING_S + 20
    ) as response:
        assert response.status_code == 200 and time.monotonic() - started < 5
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith(":") and "ping" in first, first  # a comment, not an event
    assert time.monotonic() - started < SSE_PING_S + 15
    assert api.get("/v1/tasks/nope-0/events", headers=resume).status_code == 404
    bad = api.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "Last-Event-ID"
    assert api.post(f"/v1/tasks/{task_id}/cancel").status_code == 202


def _events_until(response: httpx.Response, status: str) -> Iterator[dict[str, Any]]:
    """The events of a streamed response up to the status event ``status`` (included)."""
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if "event" in current:
                yield current
                if current["event"] == "status" and current["data"]["status"] == status:
                    return
            current = {}
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        current[name] = json.loads(value) if name == "data" else value
