"""A held tool call in the inbox through Starlette's TestClient, on fakeredis: the card, the
edit form's refusals (the typed text kept), and an edit written to the control stream."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import fakeredis
import pytest
from starlette.testclient import TestClient

from coordinator.client import OrgaClient
from coordinator.inbox import ReviewerAuth, create_app
from coordinator.state import ReviewItem, StepRecord, TaskRecord, TaskStatus
from shared import keys
from shared.actions import ToolCallAction
from shared.task_spec import parse_task

TOKEN = "s3cret-token-for-tests"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
PUSH = ToolCallAction(call_id="c1", name="run_command", arguments='{"command": "git push <b>"}')


@pytest.fixture
def orga() -> OrgaClient:
    """A fake Redis holding a task whose push is held under review r1."""
    client = OrgaClient("redis://fake.invalid:6379/0")
    client.redis = fakeredis.FakeRedis(decode_responses=True)
    spec = parse_task({"goal": "ship", "steps": [{"id": "ship", "instruction": "push"}]})
    now = time.time()
    review = ReviewItem(
        review_id="r1", task_id="t1", step_id="ship", source="call", reason="rule says ask",
        created_at=now, deadline=now + 3600, default_decision="abort", call=PUSH,
        input_schema=SCHEMA,
        snapshot={"goal": "ship", "call": {"tool": "run_command", "call_id": "c1",
                                           "arguments": {"command": "git push <b>"}}},
    )  # fmt: skip
    record = TaskRecord(
        task_id="t1", spec=spec, status=TaskStatus.AWAITING_REVIEW, created_at=now,
        updated_at=now, steps=[StepRecord(spec=spec.steps[0])], review=review,
    )  # fmt: skip
    client.redis.hset(
        keys.task_key("t1", 0),
        mapping={"state": record.model_dump_json(), "status": "awaiting_review"},
    )
    client.redis.zadd(keys.task_index_key(0), {"t1": now})
    client.redis.hset(keys.open_reviews_key(0), "r1", review.model_dump_json())
    return client


@pytest.fixture
def browser(orga: OrgaClient) -> Iterator[TestClient]:
    """A TestClient on an inbox with a token, logged in as alice."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), secret="test-secret", decide_timeout_s=0.3)
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        form = client.get("/login")
        client.post("/login", data={"csrftoken": _csrf(form.text), "name": "alice",
                                    "token": TOKEN, "next": "/"})  # fmt: skip
        yield client


def _csrf(html: str) -> str:
    found = re.search(r'name="csrftoken" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def test_the_card_shows_the_held_call_escaped(browser: TestClient) -> None:
    """The held call's tool, its arguments (escaped) and the call's decisions; no retry/skip."""
    page = browser.get("/").text
    assert '<code class="tool">run_command</code>' in page
    assert "git push &lt;b&gt;" in page and "git push <b>" not in page
    assert 'value="edit"' in page and 'value="reject"' in page
    assert 'value="retry"' not in page
    assert "<code>command</code> <small>string, required</small>" in page


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("{oops", "the edited arguments are not JSON"),
        ("[1]", "must be a JSON object, got list"),
        ('{"command": 3}', "at &#39;command&#39;: 3 is not of type &#39;string&#39;"),
    ],
)
def test_a_bad_edit_comes_back_with_the_error_and_the_text(
    browser: TestClient, orga: OrgaClient, typed: str, error: str
) -> None:
    """422, the error on the card, the typed text in the form; nothing written."""
    form = {"csrftoken": _csrf(browser.get("/").text), "review_id": "r1", "decision": "edit",
            "arguments": typed}  # fmt: skip
    response = browser.post("/decide", data=form)
    assert response.status_code == 422
    assert error in response.text
    escaped = typed.replace('"', "&#34;")
    assert f'spellcheck="false">{escaped}</textarea>' in response.text
    assert orga.redis.xlen(keys.control_stream(0)) == 0


def test_an_edit_and_a_rejection_are_written_as_the_cli_writes_them(
    browser: TestClient, orga: OrgaClient
) -> None:
    """An edit carries its arguments (compact JSON); a rejection its message as the hint."""
    form = {"csrftoken": _csrf(browser.get("/").text), "review_id": "r1", "decision": "edit",
            "arguments": '{"command": "git push origin fix"}'}  # fmt: skip
    browser.post("/decide", data=form)
    [(_id, fields)] = orga.redis.xrange(keys.control_stream(0))
    assert fields == {"action": "review", "task_id": "t1", "review_id": "r1", "decision": "edit",
                      "hint": "", "by": "inbox:alice",
                      "arguments": '{"command":"git push origin fix"}'}  # fmt: skip
