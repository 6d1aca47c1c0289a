"""The inbox's web application through Starlette's TestClient, on fakeredis.

No coordinator runs here: a decision is checked where the client puts it (the control stream,
exactly as ``orga review decide`` writes it); applying it is the integration tests' part.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import fakeredis
import pytest
from httpx import Response
from starlette.testclient import TestClient
from starlette.types import Message

from coordinator.client import OrgaClient
from coordinator.inbox import InboxConfigError, ReviewerAuth, create_app
from coordinator.state import ChildRef, ReviewItem, StepRecord, TaskRecord, TaskStatus
from shared import keys
from shared.events import JournalEntry, Started
from shared.inference import Usage
from shared.loop_types import LoopConfig
from shared.settings import OrgaSettings
from shared.task_spec import parse_task

TOKEN = "s3cret-token-for-tests"
EVIL = "<script>alert('goal')</script>"


def _client() -> OrgaClient:
    client = OrgaClient("redis://fake.invalid:6379/0")
    client.redis = fakeredis.FakeRedis(decode_responses=True)
    return client


def _escalated(client: OrgaClient, task_id: str = "t1", review_id: str = "r1") -> ReviewItem:
    """Store a task waiting for a review, as the coordinator leaves it."""
    spec = parse_task({"goal": EVIL, "steps": [{"id": "look", "instruction": "look <b>here</b>"}]})
    now = time.time()
    review = ReviewItem(
        review_id=review_id, task_id=task_id, step_id="look", source="detector",
        reason="no new state for 12 steps <img src=x onerror=alert(1)>", created_at=now,
        deadline=now + 3600, default_decision="abort",
        snapshot={
            "goal": EVIL, "step": {"id": "look", "instruction": "look <b>here</b>"},
            "iteration": 14, "attempts": 1, "milestones": ["reproduced"],
            "counters": {"level": "ask_human", "steps_since_milestone": 12},
            "recent": [{"role": "assistant", "content": "", "tool": "",
                        "tool_calls": ["file_read({\"path\": \"a.py\"})"]},
                       {"role": "tool", "content": "</pre><script>x()</script>",
                        "tool": "file_read", "tool_calls": []}],
        },
    )  # fmt: skip
    record = TaskRecord(
        task_id=task_id, spec=spec, status=TaskStatus.AWAITING_REVIEW, created_at=now,
        updated_at=now, steps=[StepRecord(spec=spec.steps[0])], iteration=14,
        milestones=["reproduced"], review=review,
    )  # fmt: skip
    client.redis.hset(
        keys.task_key(task_id, 0),
        mapping={"state": record.model_dump_json(), "status": "awaiting_review"},
    )
    client.redis.zadd(keys.task_index_key(0), {task_id: now})
    client.redis.hset(keys.open_reviews_key(0), review_id, review.model_dump_json())
    return review


@pytest.fixture
def orga() -> OrgaClient:
    """An OrgaClient on a fresh fake Redis holding one escalated task."""
    client = _client()
    _escalated(client)
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


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# -- authentication ----------------------------------------------------------------------------


def test_no_credentials_configured_is_refused() -> None:
    """Without a token or an account the inbox cannot be built, and the error says what to set."""
    with pytest.raises(InboxConfigError, match="ORGA_INBOX_TOKEN"):
        ReviewerAuth.from_settings(OrgaSettings(inbox_token=None, inbox_basic_auth=None))


def test_empty_settings_count_as_unset() -> None:
    """Compose passes unset variables as empty strings: an empty account list is no account, and
    both empty is refused like both unset."""
    settings = OrgaSettings(inbox_token=TOKEN, inbox_basic_auth="")  # type: ignore[arg-type]
    assert ReviewerAuth.from_settings(settings).accounts == {}
    with pytest.raises(InboxConfigError, match="ORGA_INBOX_TOKEN"):
        ReviewerAuth.from_settings(OrgaSettings(inbox_token="", inbox_basic_auth=""))  # type: ignore[arg-type]


def test_a_short_token_is_refused_without_echoing_it() -> None:
    """A token shorter than 16 characters is refused, saying its length and how to make one."""
    with pytest.raises(InboxConfigError, match=r"is 7 characters.*at least 16") as raised:
        ReviewerAuth(token="letmein")
    assert "letmein" not in str(raised.value)


def test_a_malformed_account_is_refused_without_echoing_it() -> None:
    """ORGA_INBOX_BASIC_AUTH entries must be user:password; the error names the entry, not it."""
    settings = OrgaSettings(inbox_basic_auth="alice:pw,bob-hunter2")  # type: ignore[arg-type]
    with pytest.raises(InboxConfigError, match="entry 2") as raised:
        ReviewerAuth.from_settings(settings)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "path", ["/", "/tasks", "/tasks/t1", "/tasks/rows", "/tasks/t1/live", "/reviews/count"]
)
def test_every_page_needs_the_token(orga: OrgaClient, path: str) -> None:
    """Without credentials a page redirects to the login form and shows no task data."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        response = client.get(path, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login?next=")
    assert "alert" not in response.text


def test_a_wrong_token_is_refused_and_a_right_one_logs_in(orga: OrgaClient) -> None:
    """The login form refuses a wrong token (401) and lets the right one in as the named user."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        token = _csrf(client.get("/login").text)
        wrong = client.post("/login", data={"csrftoken": token, "token": "nope", "name": "eve"})
        assert wrong.status_code == 401
        assert "not the inbox&#39;s token" in wrong.text
        assert client.get("/", follow_redirects=False).status_code == 303
        right = client.post("/login", data={"csrftoken": token, "token": TOKEN, "name": "bob"})
        assert right.status_code == 200
        assert '<b id="reviewer">bob</b>' in right.text


def test_bearer_token_reads_without_a_session(orga: OrgaClient) -> None:
    """`Authorization: Bearer TOKEN` reads a page; a wrong bearer token is refused."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        refused = client.get("/", headers={"Authorization": "Bearer x"}, follow_redirects=False)
        assert refused.status_code == 303


def test_basic_auth_challenges_and_admits_an_account(orga: OrgaClient) -> None:
    """With accounts, a request without them gets a 401 challenge; a right password passes."""
    app = create_app(orga, ReviewerAuth(accounts={"carol": "pw"}))
    with TestClient(app) as client:
        challenged = client.get("/")
        assert challenged.status_code == 401
        assert challenged.headers["www-authenticate"].startswith("Basic ")
        assert client.get("/", headers=_basic("carol", "wrong")).status_code == 401
        page = client.get("/", headers=_basic("carol", "pw"))
    assert page.status_code == 200
    assert '<b id="reviewer">carol</b>' in page.text


def test_a_session_from_an_old_token_is_refused(orga: OrgaClient) -> None:
    """A login made with a token that was since changed no longer opens the inbox."""
    old = create_app(orga, ReviewerAuth(token="old-token-0123456789"), secret="same-secret")
    with TestClient(old) as client:
        token = _csrf(client.get("/login").text)
        client.post(
            "/login", data={"csrftoken": token, "token": "old-token-0123456789", "name": "dan"}
        )
        cookies = dict(client.cookies)
    new = create_app(orga, ReviewerAuth(token="new-token-0123456789"), secret="same-secret")
    with TestClient(new, cookies=cookies) as client:
        assert client.get("/", follow_redirects=False).status_code == 303


# -- CSRF --------------------------------------------------------------------------------------


def test_a_decision_without_the_csrf_token_is_refused(
    browser: TestClient, orga: OrgaClient
) -> None:
    """A decide form without (or with a forged) csrftoken is refused with 403 and sends nothing."""
    for extra in ({}, {"csrftoken": "forged"}):
        refused = browser.post("/decide", data={"review_id": "r1", "decision": "abort", **extra})
        assert refused.status_code == 403
        assert "CSRF check failed" in refused.text
    assert orga.redis.xlen(keys.control_stream(0)) == 0


def test_basic_auth_without_cookies_is_still_csrf_checked(orga: OrgaClient) -> None:
    """Basic auth is sent by the browser unasked: a cookieless cross-site form is refused."""
    app = create_app(orga, ReviewerAuth(accounts={"carol": "pw"}))
    with TestClient(app) as client:
        refused = client.post(
            "/decide", data={"review_id": "r1", "decision": "abort"}, headers=_basic("carol", "pw")
        )
    assert refused.status_code == 403
    assert orga.redis.xlen(keys.control_stream(0)) == 0


# -- pages -------------------------------------------------------------------------------------


def test_user_and_model_text_is_escaped(browser: TestClient) -> None:
    """A `<script>` in the goal, the reason or a tool result is shown as text, never as markup."""
    for path in ("/", "/tasks", "/tasks/t1"):
        page = browser.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text, path
        assert "&lt;script&gt;alert(&#39;goal&#39;)&lt;/script&gt;" in page.text, path
    inbox = browser.get("/").text
    assert "<img src=x" not in inbox
    assert "&lt;/pre&gt;&lt;script&gt;x()&lt;/script&gt;" in inbox
    assert "look &lt;b&gt;here&lt;/b&gt;" in inbox


def test_the_inbox_shows_the_review_context(browser: TestClient) -> None:
    """Each review shows its step, reason, counters, last milestone, recent calls and the forms."""
    page = browser.get("/").text
    for expected in ("Review r1", "iteration 14", "reproduced", "steps since milestone",
                     "ask_human", "file_read({&#34;path&#34;: &#34;a.py&#34;})",
                     'value="retry"', 'value="skip"', 'value="abort"',
                     "abort</b> by default"):  # fmt: skip
        assert expected in page, expected


def test_reviews_are_listed_newest_first(orga: OrgaClient, browser: TestClient) -> None:
    """A later escalation comes before an earlier one."""
    time.sleep(0.01)
    _escalated(orga, task_id="t2", review_id="r2")
    page = browser.get("/").text
    assert page.index("Review r2") < page.index("Review r1")


def test_pages_carry_a_content_security_policy(browser: TestClient) -> None:
    """Every page forbids inline and foreign scripts and framing."""
    headers = browser.get("/").headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_the_open_review_count_is_live(orga: OrgaClient, browser: TestClient) -> None:
    """The navigation's badge counts the open reviews; its fragment follows new escalations."""
    assert '<span class="count" id="open-reviews" data-refresh="/reviews/count">1</span>' in (
        browser.get("/tasks").text
    )
    _escalated(orga, task_id="t2", review_id="r2")
    assert browser.get("/reviews/count").text == "2"


def test_a_task_page_shows_the_last_200_journal_entries(
    orga: OrgaClient, browser: TestClient
) -> None:
    """Of a long journal the task page shows the last 200 entries, newest first."""
    started = Started(agent_id="a", config=LoopConfig())
    for sequence in range(250):  # as the store writes them: stream id 0-(sequence + 1)
        entry = JournalEntry(sequence=sequence, agent_id="a", event=started, task_id="t1")
        orga.redis.xadd(
            keys.journal_stream("t1", 0), {"data": entry.model_dump_json()}, id=f"0-{sequence + 1}"
        )
    state = TaskRecord.model_validate_json(str(orga.redis.hget(keys.task_key("t1", 0), "state")))
    state.journal_seq = 250
    orga.redis.hset(keys.task_key("t1", 0), "state", state.model_dump_json())
    page = browser.get("/tasks/t1").text
    sequences = [int(n) for n in re.findall(r"<tr[^>]*><td>(\d+)</td><td>\d\d:\d\d", page)]
    assert sequences == list(range(249, 49, -1))
    assert "last 200 entries, newest first" in page


def test_a_task_page_shows_its_usage_and_cost(orga: OrgaClient, browser: TestClient) -> None:
    """The task page shows the tokens used and what they cost, against the task's limit."""
    key = keys.task_key("t1", 0)
    state = TaskRecord.model_validate_json(str(orga.redis.hget(key, "state")))
    data = state.spec.model_dump(mode="json", exclude_unset=True)
    data["limits"] = {"max_cost_usd": 0.5}
    data["provider"] = {"model": "gpt-4o"}
    state.spec = parse_task(data)
    state.usage = Usage(
        prompt_tokens=900, completion_tokens=100, total_tokens=1000, cost_usd=0.1234
    )
    orga.redis.hset(key, "state", state.model_dump_json())
    live = browser.get("/tasks/t1/live").text
    assert '1000 tokens · cost <b id="task-cost">$0.1234</b> of at most $0.5000' in live


def test_an_unknown_task_page_says_so(browser: TestClient) -> None:
    """A task page for an unknown id answers 404 with the client's message."""
    page = browser.get("/tasks/nope")
    assert page.status_code == 404
    assert "no task &#39;nope&#39;" in page.text


def test_the_live_fragments_are_bare_rows(browser: TestClient) -> None:
    """The live refresh gets the rows alone, with the task's status and iteration."""
    rows = browser.get("/tasks/rows").text
    assert rows.lstrip().startswith("<tr")
    assert "awaiting_review" in rows
    live = browser.get("/tasks/t1/live").text
    assert '<b id="task-iteration">14</b>' in live
    assert "<html" not in live


def test_static_files_are_shipped_in_the_package(orga: OrgaClient) -> None:
    """The stylesheet and the live-update script are served (without login, as the login page)."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        assert client.get("/static/inbox.js").status_code == 200
        assert "data-refresh" in client.get("/static/inbox.js").text
        assert client.get("/static/inbox.css").status_code == 200


# -- deciding ----------------------------------------------------------------------------------


def test_a_decision_goes_through_the_client(browser: TestClient, orga: OrgaClient) -> None:
    """Retry with a hint is written to the control stream as `orga review decide` writes it,
    by the logged-in reviewer; with no coordinator running the page says none applied it."""
    token = _csrf(browser.get("/").text)
    form = {"csrftoken": token, "review_id": "r1", "decision": "retry",
            "hint": " measure  it\r\nfirst "}  # fmt: skip
    response = browser.post("/decide", data=form)
    assert response.status_code == 200
    assert "no coordinator applied the decision" in response.text
    [(_id, fields)] = orga.redis.xrange(keys.control_stream(0))
    assert fields == {"action": "review", "task_id": "t1", "review_id": "r1", "decision": "retry",
                      "hint": "measure  it\nfirst", "by": "inbox:alice"}  # fmt: skip


def test_a_decision_applied_redirects_to_the_task(browser: TestClient, orga: OrgaClient) -> None:
    """Once the review is closed (as the coordinator does) the reviewer lands on the task page."""
    token = _csrf(browser.get("/").text)

    def close_when_sent() -> None:  # the coordinator's part: applied, named by its entry
        while not orga.redis.xlen(keys.control_stream(0)):
            time.sleep(0.01)
        [(entry_id, _fields)] = orga.redis.xrange(keys.control_stream(0))
        orga.redis.xadd(keys.events_stream(0), {"event": "review_decided", "review_id": "r1",
                                             "entry_id": entry_id, "decision": "skip",
                                             "by": "inbox:alice"})  # fmt: skip
        orga.redis.hdel(keys.open_reviews_key(0), "r1")

    closer = threading.Thread(target=close_when_sent)
    closer.start()
    response = browser.post("/decide", data={"csrftoken": token, "review_id": "r1",
                                             "decision": "skip", "hint": "ignored"})  # fmt: skip
    closer.join()
    assert response.url.path == "/tasks/t1"
    assert "skip applied to task t1 (review r1)" in response.text
    [(_id, fields)] = orga.redis.xrange(keys.control_stream(0))
    assert fields["hint"] == ""  # a hint goes with retry only, as on the CLI


def test_deciding_a_closed_review_says_so(browser: TestClient, orga: OrgaClient) -> None:
    """A second reviewer deciding a review already closed sees the client's error, not a crash."""
    token = _csrf(browser.get("/").text)
    orga.redis.hdel(keys.open_reviews_key(0), "r1")
    response = browser.post("/decide", data={"csrftoken": token, "review_id": "r1",
                                             "decision": "abort"})  # fmt: skip
    assert response.url.path == "/"
    assert "no open review &#39;r1&#39;" in response.text


def test_deciding_a_review_another_decision_closed_names_the_winner(
    browser: TestClient, orga: OrgaClient
) -> None:
    """The review was decided and applied (its claim expired since): the late reviewer is told
    who decided it, not that no such review is open."""
    token = _csrf(browser.get("/").text)
    orga.redis.xadd(keys.events_stream(0), {"event": "review_decided", "review_id": "r1",
                                         "decision": "skip", "by": "inbox:alice"})  # fmt: skip
    orga.redis.hdel(keys.open_reviews_key(0), "r1")
    response = browser.post("/decide", data={"csrftoken": token, "review_id": "r1",
                                             "decision": "abort"})  # fmt: skip
    assert "was already decided by &#39;inbox:alice&#39; (skip)" in response.text
    assert not orga.redis.xlen(keys.control_stream(0))


def test_an_invalid_decision_is_refused(browser: TestClient, orga: OrgaClient) -> None:
    """A decision other than retry, skip, abort, approve or revise is a 400 naming the choices."""
    token = _csrf(browser.get("/").text)
    response = browser.post("/decide", data={"csrftoken": token, "review_id": "r1",
                                             "decision": "delete"})  # fmt: skip
    assert response.status_code == 400
    assert "retry, skip, abort, approve, revise" in response.text
    assert orga.redis.xlen(keys.control_stream(0)) == 0


def _critic_review(client: OrgaClient) -> ReviewItem:
    """A human critic's review of a step's result, with model text that must stay text."""
    review = _escalated(client, task_id="t2", review_id="r2")
    critic = {
        "critic": "human", "rubric": "names the file <b>bold</b>", "step_id": "look",
        "instruction": "look", "result": "I wrote <script>steal()</script>",
        "done_when": "test -f a.txt", "done_when_output": "exit code: 0", "round": 2,
        "max_rounds": 2, "verdicts": [{"verdict": "revise", "reason": "which <i>file</i>?",
                                       "decided_by": "human:bob"}],
    }  # fmt: skip
    changed = review.model_copy(
        update={"source": "critic", "snapshot": {**review.snapshot, "critic": critic}}
    )
    client.redis.hset(keys.open_reviews_key(0), "r2", changed.model_dump_json())
    return changed


def test_a_critic_review_shows_the_result_and_its_buttons(
    browser: TestClient, orga: OrgaClient
) -> None:
    """A review of a step's result shows the rubric, the result, the check and the verdicts,
    escaped, with Approve and Revise; other reviews have no such buttons."""
    _critic_review(orga)
    page = browser.get("/").text
    critic = page[page.index('id="critic-r2"') :]
    for expected in ("names the file &lt;b&gt;bold&lt;/b&gt;",
                     "I wrote &lt;script&gt;steal()&lt;/script&gt;", "test -f a.txt",
                     "exit code: 0", "which &lt;i&gt;file&lt;/i&gt;?", "by human:bob",
                     'value="approve"', 'value="revise"', "review round 2"):  # fmt: skip
        assert expected in critic, expected
    assert "<script>steal" not in page
    assert 'id="critic-r1"' not in page


def test_a_revision_carries_its_reason_through_the_client(
    browser: TestClient, orga: OrgaClient
) -> None:
    """Revise writes the reason as the decision's hint; approve writes none."""
    _critic_review(orga)
    token = _csrf(browser.get("/").text)
    browser.post("/decide", data={"csrftoken": token, "review_id": "r2", "decision": "revise",
                                  "hint": "name the file"})  # fmt: skip
    [(_id, fields)] = orga.redis.xrange(keys.control_stream(0))
    assert (fields["decision"], fields["hint"], fields["by"]) == (
        "revise",
        "name the file",
        "inbox:alice",
    )


def test_login_redirects_only_within_the_site(orga: OrgaClient) -> None:
    """After login `next` may be a path here, never another site."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        token = _csrf(client.get("/login").text)
        response = client.post("/login", follow_redirects=False, data={
            "csrftoken": token, "token": TOKEN, "next": "//evil.example/x"})  # fmt: skip
    assert response.headers["location"] == "/"


def test_a_subagents_review_names_its_parent_and_the_tree_is_escaped(
    orga: OrgaClient, browser: TestClient
) -> None:
    """A sub-agent's review shows its parent's goal and step (escaped); the parent's page lists
    the child in its sub-agent tree, with the child's goal escaped."""
    review = _escalated(orga, task_id="p.1", review_id="r9")
    review.snapshot["parent"] = {
        "task_id": "p",
        "goal": f"parent {EVIL}",
        "depth": 1,
        "step": {"id": "combine", "instruction": "delegate <i>x</i>"},
    }
    orga.redis.hset(keys.open_reviews_key(0), "r9", review.model_dump_json())
    page = browser.get("/").text
    assert 'sub-agent of task\n      <a href="/tasks/p">p</a>' in page
    assert "parent &lt;script&gt;alert(&#39;goal&#39;)&lt;/script&gt;" in page
    assert "step <b>combine</b>: delegate &lt;i&gt;x&lt;/i&gt;" in page
    parent = TaskRecord(
        task_id="p", spec=parse_task({"goal": "parent"}), created_at=1.0, updated_at=1.0,
        children=[ChildRef(task_id="p.1", agent="helper", call_id="c1", step_id="combine",
                           iteration=1, goal=f"child {EVIL}")],
    )  # fmt: skip
    orga.redis.hset(keys.task_key("p", 0), mapping={"state": parent.model_dump_json()})
    tree = browser.get("/tasks/p").text
    assert '<li data-task="p.1"><a href="/tasks/p.1">p.1</a>' in tree
    assert "child &lt;script&gt;alert" in tree and "<script>alert" not in tree
    assert "awaiting_review" in tree  # the child's own status, read from its record


# -- reviewer names ----------------------------------------------------------------------------


def _login(client: TestClient, name: str, token: str = TOKEN) -> Response:
    csrf = _csrf(client.get("/login").text)
    return client.post(
        "/login", follow_redirects=False,
        data={"csrftoken": csrf, "token": token, "name": name, "next": "/"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "fits"), [("Jane Doe", "Jane-Doe"), ("Zoë Ünal", "Zoe-Unal"), ("x" * 59, "x" * 58)]
)
def test_a_name_decisions_cannot_be_recorded_under_is_refused_at_login(
    orga: OrgaClient, name: str, fits: str
) -> None:
    """A login whose name `inbox:NAME` cannot record (a space, a letter outside ASCII, more than
    58 characters) is refused with the rule and a name that fits, and logs nobody in."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    with TestClient(app) as client:
        refused = _login(client, name)
        assert refused.status_code == 400
        assert "cannot be recorded with your decisions" in refused.text
        assert f"e.g. &#39;{fits}&#39;" in refused.text
        assert client.get("/", follow_redirects=False).status_code == 303


def test_a_name_accepted_at_login_is_the_one_a_decision_records(orga: OrgaClient) -> None:
    """The longest name login accepts (58 characters, with '.', '@' and '-') decides a review."""
    name = "jane.doe@example-" + "x" * 41
    app = create_app(orga, ReviewerAuth(token=TOKEN), decide_timeout_s=0.05)
    with TestClient(app) as client:
        assert _login(client, name).status_code == 303
        csrf = _csrf(client.get("/").text)
        client.post("/decide", data={"csrftoken": csrf, "review_id": "r1", "decision": "skip"})
    [(_id, fields)] = orga.redis.xrange(keys.control_stream(0))
    assert fields["by"] == f"inbox:{name}"


def test_an_account_decisions_cannot_be_recorded_under_is_refused_at_start() -> None:
    """A basic-auth account named `ann smith` stops the inbox from starting, naming the account,
    the rule and a name that fits, never its password."""
    settings = OrgaSettings(inbox_basic_auth="bob:pw1,ann smith:hunter2")  # type: ignore[arg-type]
    with pytest.raises(InboxConfigError, match=r"account 'ann smith'.*'ann-smith'") as raised:
        ReviewerAuth.from_settings(settings)
    assert "hunter2" not in str(raised.value)


# -- logins: throttle, logout ------------------------------------------------------------------


def test_failed_logins_from_one_address_are_throttled(orga: OrgaClient) -> None:
    """After 3 wrong tokens from one address (any names) even the right token is refused there
    with 429, Retry-After and a message, unchecked; another address still logs in."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), max_failed_logins=3)
    with TestClient(app, client=("10.0.0.1", 4000)) as client:
        for attempt in range(3):
            assert _login(client, f"eve{attempt}", token="wrong").status_code == 401
        refused = _login(client, "alice")
        assert refused.status_code == 429
        assert 0 < int(refused.headers["retry-after"]) <= 60
        assert "too many failed logins" in refused.text
        assert f"try again in {refused.headers['retry-after']} s" in refused.text
        assert client.get("/", follow_redirects=False).status_code == 303
    with TestClient(app, client=("10.0.0.2", 4000)) as other:
        assert _login(other, "bob").status_code == 303


def test_failed_logins_for_one_account_are_throttled_from_any_address(orga: OrgaClient) -> None:
    """Wrong basic-auth passwords for carol from 3 addresses: carol is refused (429) from a 4th,
    right password or not; dave, from there, is not."""
    app = create_app(orga, ReviewerAuth(accounts={"carol": "pw", "dave": "pw2"}),
                     max_failed_logins=3)  # fmt: skip
    for number in range(3):
        with TestClient(app, client=(f"10.0.1.{number}", 4000)) as client:
            assert client.get("/", headers=_basic("carol", "guess")).status_code == 401
    with TestClient(app, client=("10.0.1.9", 4000)) as client:
        refused = client.get("/", headers=_basic("carol", "pw"))
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) > 0
        assert "too many failed logins" in refused.text
        assert client.get("/", headers=_basic("dave", "pw2")).status_code == 200


def test_wrong_bearer_tokens_are_throttled(orga: OrgaClient) -> None:
    """Guessing the token as `Authorization: Bearer` counts as failed logins too."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), max_failed_logins=3)
    with TestClient(app) as client:
        for _ in range(3):
            guess = client.get("/", headers={"Authorization": "Bearer x"}, follow_redirects=False)
            assert guess.status_code == 303
        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429


def test_wrong_bearer_tokens_lock_out_their_address_only(orga: OrgaClient) -> None:
    """Bearer failures are counted per address, not under one shared name: another address's
    bearer client still reads."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), max_failed_logins=3)
    with TestClient(app, client=("10.0.2.1", 4000)) as client:
        for _ in range(3):
            guess = client.get("/", headers={"Authorization": "Bearer x"}, follow_redirects=False)
            assert guess.status_code == 303
    with TestClient(app, client=("10.0.2.2", 4000)) as other:
        assert other.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_logged_out_session_opens_nothing(orga: OrgaClient) -> None:
    """After logout the session's cookie, replayed from a copy taken before, is refused."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), secret="same-secret")
    with TestClient(app) as client:
        assert _login(client, "alice").status_code == 303
        copied = dict(client.cookies)
        csrf = _csrf(client.get("/").text)
        assert client.post("/logout", data={"csrftoken": csrf}).url.path == "/login"
    with TestClient(app, cookies=copied) as replayed:
        assert replayed.get("/", follow_redirects=False).status_code == 303


def test_a_new_login_ends_the_browsers_previous_one(orga: OrgaClient) -> None:
    """Logging in again (as another name) ends the login the browser held before."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), secret="same-secret")
    with TestClient(app) as client:
        _login(client, "alice")
        first = dict(client.cookies)
        _login(client, "bob")
        assert '<b id="reviewer">bob</b>' in client.get("/").text
    with TestClient(app, cookies=first) as replayed:
        assert replayed.get("/", follow_redirects=False).status_code == 303


# -- cookies and bodies ------------------------------------------------------------------------


def _set_cookies(response: Response) -> dict[str, str]:
    """The cookies a response sets: name -> the whole Set-Cookie header."""
    headers = response.headers.get_list("set-cookie")
    return {header.split("=", 1)[0]: header for header in headers}


@pytest.mark.parametrize(
    ("setting", "base_url", "secure"),
    [("auto", "https://inbox.example", True), ("auto", "http://127.0.0.1:8765", False),
     (True, "http://127.0.0.1:8765", True), (False, "https://inbox.example", False)],
)  # fmt: skip
def test_cookies_are_secure_over_https(
    orga: OrgaClient, setting: bool | Literal["auto"], base_url: str, secure: bool
) -> None:
    """The session and CSRF cookies are `Secure` over HTTPS (`auto`), always (`true`: behind a
    TLS proxy the inbox sees plain HTTP from) or never (`false`): ORGA_INBOX_SECURE_COOKIES."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), secure_cookies=setting)
    with TestClient(app, base_url=base_url) as client:
        form = client.get("/login")
        [csrf_cookie] = _set_cookies(form).values()
        client.cookies.clear()  # sent by hand below: a browser behind TLS sends it to the proxy
        login = client.post(
            "/login", follow_redirects=False, headers={"cookie": csrf_cookie.split(";")[0]},
            data={"csrftoken": _csrf(form.text), "token": TOKEN, "name": "alice"},
        )  # fmt: skip
    cookies = {"csrftoken": csrf_cookie, **_set_cookies(login)}
    assert set(cookies) == {"csrftoken", "orga_inbox"}, login.text
    assert all(("; secure" in c.lower()) is secure for c in cookies.values()), cookies


def test_the_secure_cookies_setting_reads_auto_true_false() -> None:
    """ORGA_INBOX_SECURE_COOKIES is `auto` unless set to a boolean."""
    assert OrgaSettings().inbox_secure_cookies == "auto"
    assert OrgaSettings(inbox_secure_cookies="false").inbox_secure_cookies is False  # type: ignore[arg-type]


def _post_raw(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> tuple[int, str, int]:
    """POST /login straight through ASGI: (status, body, how many chunks the app read)."""
    form = (b"content-type", b"application/x-www-form-urlencoded")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/login", "raw_path": b"/login",
             "query_string": b"", "root_path": "", "client": ("10.0.2.1", 4000),
             "server": ("127.0.0.1", 8765),
             "headers": [(b"host", b"127.0.0.1:8765"), form, *headers]}  # fmt: skip
    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        read += 1
        more = read < len(chunks)
        return {"type": "http.request", "body": chunks[min(read, len(chunks)) - 1],
                "more_body": more}  # fmt: skip

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body.decode(), read


def test_a_declared_body_over_the_cap_is_refused_before_it_is_read(orga: OrgaClient) -> None:
    """An anonymous POST declaring 60 MB gets 413 saying the cap, and none of it is read."""
    app = create_app(orga, ReviewerAuth(token=TOKEN))
    status, text, read = _post_raw(app, [(b"content-length", b"62914560")], [b"x" * 65536] * 960)
    assert (status, read) == (413, 0)
    assert "Content-Length 62914560" in text and f"at most {1 << 20} bytes" in text


def test_a_body_without_a_length_is_cut_at_the_cap(orga: OrgaClient) -> None:
    """A body streamed without Content-Length is read only until it passes the cap: 413."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), max_body_bytes=1000)
    status, text, read = _post_raw(app, [], [b"x" * 600] * 100)
    assert (status, read) == (413, 2)
    assert "more than 1000 bytes" in text


def test_a_body_within_the_cap_is_served(orga: OrgaClient) -> None:
    """A login form under the cap reaches the login (here: a CSRF refusal, not a 413)."""
    app = create_app(orga, ReviewerAuth(token=TOKEN), max_body_bytes=1000)
    body = b"token=x&name=y"
    status, _text, _read = _post_raw(app, [(b"content-length", str(len(body)).encode())], [body])
    assert status == 403
