"""`orga inbox` as reviewers meet it: the installed entry point serving a real deployment (a real
Redis, real Celery worker processes and a coordinator process), read and decided over HTTP and
in a real browser (Debian's Chromium driven by Playwright, no browser download).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import (
    REPO,
    Cluster,
    Process,
    clean_env,
    on_16_partitions,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

ORGA = Path(sys.executable).with_name("orga")
WANDERER = REPO / "examples" / "wanderer" / "task.yaml"
TOKEN = "inbox-test-token-0123456789"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = clean_env()
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def inbox_url(cluster: Cluster) -> Iterator[str]:
    """`orga inbox` (the console script) serving the cluster, with a token."""
    port = _free_port()
    env = _env(
        ORGA_REDIS_URL=cluster.redis_url,
        ORGA_INBOX_TOKEN=TOKEN,
        ORGA_PARTITIONS=str(cluster.partitions),
    )
    command = [str(ORGA), "inbox", "--host", "127.0.0.1", "--port", str(port)]
    process = Process("inbox", command, env, cluster.root / "inbox.log").start()
    try:
        process.wait_for_log(f"review inbox on http://127.0.0.1:{port}/")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def _escalated_wanderer(cluster: Cluster) -> tuple[str, str]:
    """Submit examples/wanderer and wait until the detector escalates it: (task, review)."""
    client = cluster.client()
    task_id = client.submit(WANDERER)
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 120, "escalation")
    return task_id, str(client.status(task_id)["review_id"])


def _logged_in(base_url: str, name: str) -> httpx.Client:
    session = httpx.Client(base_url=base_url, timeout=60)
    page = session.get("/login")
    csrf = re.search(r'name="csrftoken" value="([^"]+)"', page.text)
    assert csrf, page.text
    response = session.post(
        "/login", data={"csrftoken": csrf.group(1), "token": TOKEN, "name": name}
    )
    assert response.status_code == 303, response.text
    return session


def _csrf_of(session: httpx.Client) -> str:
    found = re.search(r'name="csrftoken" value="([^"]+)"', session.get("/").text)
    assert found
    return found.group(1)


def test_inbox_refuses_to_start_without_credentials() -> None:
    """`orga inbox` with neither ORGA_INBOX_TOKEN nor ORGA_INBOX_BASIC_AUTH exits 2 and says so."""
    outcome = subprocess.run(
        [str(ORGA), "inbox", "--port", str(_free_port())], env=_env(ORGA_REDIS_URL="redis://x"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    assert outcome.stderr.startswith("error: the inbox serves nothing without reviewer auth")
    assert "ORGA_INBOX_TOKEN" in outcome.stderr
    assert outcome.stdout == ""


def test_nothing_is_served_without_the_token(inbox_url: str) -> None:
    """The running inbox answers pages only to a logged-in reviewer."""
    with httpx.Client(base_url=inbox_url) as anonymous:
        for path in ("/", "/tasks", "/tasks/rows"):
            assert anonymous.get(path).status_code == 303, path
        assert anonymous.post("/decide", data={"review_id": "x"}).status_code == 401


@on_16_partitions
def test_two_reviewers_race_and_one_decision_wins(cluster: Cluster, inbox_url: str) -> None:
    """Two reviewers decide one review at once: the coordinator applies one, the other reviewer
    is told whose decision won, and the audit trail names the winner."""
    task_id, review_id = _escalated_wanderer(cluster)
    sessions = {name: _logged_in(inbox_url, name) for name in ("ann", "ben")}
    forms = {
        name: {"review_id": review_id, "decision": decision, "csrftoken": _csrf_of(sessions[name])}
        for name, decision in (("ann", "abort"), ("ben", "skip"))
    }

    def decide(name: str) -> httpx.Response:
        return sessions[name].post("/decide", data=forms[name], follow_redirects=True)

    try:
        with ThreadPoolExecutor(2) as pool:
            answers = dict(zip(forms, pool.map(decide, forms), strict=True))
    finally:
        for session in sessions.values():
            session.close()
    client = cluster.client()
    decided = [f for _i, f in client.events() if f.get("event") == "review_decided"
               and f.get("review_id") == review_id]  # fmt: skip
    assert len(decided) == 1, decided
    winner = decided[0]["by"].removeprefix("inbox:")
    loser = "ben" if winner == "ann" else "ann"
    assert f"applied to task {task_id}" in answers[winner].text
    refusal = answers[loser].text
    assert "was already decided by" in refusal and f"inbox:{winner}" in refusal, refusal
    assert client.wait(task_id, timeout_s=60)["status"] in {"aborted", "failed"}


# -- the browser -------------------------------------------------------------------------------


def _chromium() -> str:
    """Debian's Chromium, or a skip (a failure in CI) saying how to install it."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    message = (
        "no Chromium found for the inbox's browser tests: install Debian's package with "
        "`sudo apt-get update && sudo apt-get install -y chromium` (Playwright drives it through "
        "executable_path; no browser download)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) driven by Playwright."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


def test_a_reviewer_decides_an_escalation_in_the_browser(
    cluster: Cluster, inbox_url: str, chromium: Any, tmp_path: Path
) -> None:
    """A reviewer logs in, reads the wanderer's escalation with its context, retries it with a
    hint, lands on the task page and sees the task resume; a screenshot of each page is kept."""
    from playwright.sync_api import expect

    task_id, review_id = _escalated_wanderer(cluster)
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    shots = tmp_path / "screenshots"

    page.goto(f"{inbox_url}/")
    assert page.url.startswith(f"{inbox_url}/login")
    page.fill("input[name=name]", "rita")
    page.fill("input[name=token]", TOKEN)
    page.screenshot(path=str(shots / "login.png"))
    page.click("button[type=submit]")

    card = page.locator(f"#review-{review_id}")
    expect(card).to_be_visible()
    expect(card.locator(".goal")).to_have_text(re.compile(r"^Find out why the first request"))
    expect(card.locator(".reason")).not_to_be_empty()
    expect(card).to_contain_text("steps since milestone")
    expect(card).to_contain_text("file_read(")
    page.screenshot(path=str(shots / "reviews.png"), full_page=False)
    escalated_at = cluster.client().status(task_id)["iteration"]

    card.locator("textarea[name=hint]").fill("measure the first request <b>first</b>")
    card.locator("button[value=retry]").click()

    page.wait_for_url(f"{inbox_url}/tasks/{task_id}")
    expect(page.locator(".flash.ok")).to_contain_text(f"retry applied to task {task_id}")
    # the live refresh shows the task running on: its iteration grows past the escalation's
    page.wait_for_function(
        "n => Number(document.getElementById('task-iteration').textContent) > n", arg=escalated_at
    )
    expect(page.locator("table.journal")).to_contain_text("ReasoningComplete")
    page.screenshot(path=str(shots / "task.png"))

    page.click("nav a[href='/tasks']")
    expect(page.locator(f"tr[data-task='{task_id}']")).to_be_visible()
    page.screenshot(path=str(shots / "tasks.png"))
    context.close()

    record = cluster.client().record(task_id)
    hints = [m.content for m in record.conversation.messages if "[Human reviewer]" in m.content]
    assert hints == ["[Human reviewer] measure the first request <b>first</b>"]
    decided = [f for _i, f in cluster.client().events() if f.get("event") == "review_decided"
               and f.get("review_id") == review_id]  # fmt: skip
    assert [(f["decision"], f["by"]) for f in decided] == [("retry", "inbox:rita")]
    for name in ("login", "reviews", "task", "tasks"):
        shot = shots / f"{name}.png"
        assert shot.stat().st_size > 10_000, shot
        assert _png_size(shot) == (1280, 800), shot
    if not cluster.client().record(task_id).terminal:
        cluster.client().cancel(task_id)


def test_the_task_page_shows_the_subagent_tree(
    cluster: Cluster, inbox_url: str, chromium: Any, tmp_path: Path
) -> None:
    """A task that delegated to two registered agents: its page lists both sub-agents with
    their status and progress, each linking to its own page, which names its parent."""
    from playwright.sync_api import expect

    example = REPO / "examples" / "delegation"
    for agent in ("summarizer", "checker", "editor"):  # editor: the critic
        done = subprocess.run(
            [str(ORGA), "agents", "add", str(example / "agents" / f"{agent}.yaml"), "--replace"],
            env=_env(ORGA_REDIS_URL=cluster.redis_url), capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    client = cluster.client()
    task_id = client.submit(example / "task.yaml")
    wait_until(lambda: status_of(client, task_id) == "completed", 120, "the parent completed")
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{inbox_url}/login?next=/tasks/{task_id}")
    page.fill("input[name=name]", "sam")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.goto(f"{inbox_url}/tasks/{task_id}")
    tree = page.locator("#subagent-tree")
    expect(tree).to_be_visible()
    for number, agent in ((1, "summarizer"), (2, "checker")):
        child = tree.locator(f"li[data-task='{task_id}.{number}']")
        expect(child).to_contain_text(f"agent {agent}")
        expect(child.locator(".status")).to_have_text("completed")
        expect(child).to_contain_text("1/1 steps")
    expect(tree.locator(f"li[data-task='{task_id}.1']")).to_contain_text("step:summarize")
    page.screenshot(path=str(tmp_path / "subagents.png"))
    tree.locator(f"a[href='/tasks/{task_id}.2']").click()
    page.wait_for_url(f"{inbox_url}/tasks/{task_id}.2")
    expect(page.locator("#task-parent")).to_have_text(task_id)
    context.close()
    assert _png_size(tmp_path / "subagents.png") == (1280, 800)


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[16:24]
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


# -- the embedded runtime ----------------------------------------------------------------------


def test_inbox_on_the_embedded_runtime_resumes_what_orga_run_escalated(tmp_path: Path) -> None:
    """Without ORGA_REDIS_URL, `orga inbox` holds the embedded runtime that `orga run` left the
    wanderer in: a retry decided on the page resumes the task, and SIGTERM stops it all."""
    env = _env(ORGA_HOME=str(tmp_path / "home"), ORGA_WORKSPACE_ROOT=str(tmp_path / "spaces"),
               ORGA_INBOX_BASIC_AUTH="sam:pw1,tess:pw2")  # fmt: skip
    ran = subprocess.run([str(ORGA), "run", str(WANDERER)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert ran.returncode == 3, ran.stdout + ran.stderr
    review_id = re.findall(r"review decide (\w+) --skip", ran.stdout)[0]
    port = _free_port()
    process = Process("inbox", [str(ORGA), "inbox", "--port", str(port)], env,
                      tmp_path / "inbox.log").start()  # fmt: skip
    try:
        process.wait_for_log(f"review inbox on http://127.0.0.1:{port}/ (tasks of the embedded")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", auth=("tess", "pw2"),
                          timeout=60) as reviewer:  # fmt: skip
            inbox = reviewer.get("/")
            assert f'id="review-{review_id}"' in inbox.text
            csrf = re.search(r'name="csrftoken" value="([^"]+)"', inbox.text)
            assert csrf
            form = {"csrftoken": csrf.group(1), "review_id": review_id, "decision": "retry",
                    "hint": "time the first call"}  # fmt: skip
            decided = reviewer.post("/decide", data=form, follow_redirects=True)
            assert "retry applied to task" in decided.text, decided.text
            task_id = decided.url.path.removeprefix("/tasks/")

            def resumed() -> bool:  # escalated again, under a new review: it ran on
                page = reviewer.get(f"/tasks/{task_id}/live").text
                current = re.findall(r"decide review (\w+)", page)
                return "awaiting_review" in page and bool(current) and review_id not in current

            wait_until(resumed, 120, "the wanderer to run on and escalate again")
            page = reviewer.get(f"/tasks/{task_id}/live").text  # the journal keeps the decision
            assert "ReviewDecided" in page and "time the first call" in page
    finally:
        process.stop()
    assert process.popen is not None
    assert process.popen.returncode == 0, process.tail()
    shown = subprocess.run([str(ORGA), "review", "list", "--json"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr  # the home's lock was released on SIGTERM
    assert review_id not in shown.stdout


# -- a human critic ----------------------------------------------------------------------------


HUMAN_CRITIC_TASK = {
    "goal": "write notes a reviewer accepts",
    "provider": {
        "kind": "scripted",
        "replies": [
            "first draft <i>without</i> a file name",
            "I wrote notes.txt, as the rubric asks",
        ],
    },
    "steps": [
        {
            "id": "notes",
            "instruction": "write the notes and say which file",
            "critic": {"human": True, "rubric": "Names the file it wrote <b>by name</b>."},
        }
    ],
}


def test_a_human_critic_revises_then_approves_in_the_browser(
    cluster: Cluster, inbox_url: str, chromium: Any, tmp_path: Path
) -> None:
    """A human critic reads a step's result with its rubric in the inbox, asks for a revision
    with a reason (the worker reads it and answers again), then approves the new result: the
    step completes, and the journal and the events name the reviewer."""
    from playwright.sync_api import expect

    client = cluster.client()
    task_id = client.submit(HUMAN_CRITIC_TASK)
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 60, "critic review")
    first = str(client.status(task_id)["review_id"])
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{inbox_url}/login")
    page.fill("input[name=name]", "cora")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")

    critic = page.locator(f"#critic-{first}")
    expect(critic).to_be_visible()
    expect(critic.locator(".rubric")).to_have_text("Names the file it wrote <b>by name</b>.")
    expect(critic.locator(".result")).to_have_text("first draft <i>without</i> a file name")
    page.screenshot(path=str(tmp_path / "critic.png"))
    critic.locator("textarea[name=hint]").fill("say which file you wrote")
    critic.locator("button[value=revise]").click()
    page.wait_for_url(f"{inbox_url}/tasks/{task_id}")
    expect(page.locator(".flash.ok")).to_contain_text(f"revise applied to task {task_id}")

    wait_until(
        lambda: client.status(task_id)["review_id"] not in (None, first), 60, "second review"
    )
    second = str(client.status(task_id)["review_id"])
    page.goto(f"{inbox_url}/")
    again = page.locator(f"#critic-{second}")
    expect(again.locator(".result")).to_have_text("I wrote notes.txt, as the rubric asks")
    expect(again.locator(".verdicts")).to_contain_text("say which file you wrote")
    again.locator("button[value=approve]").click()
    page.wait_for_url(f"{inbox_url}/tasks/{task_id}")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("table.journal")).to_contain_text("CriticVerdict")
    expect(page.locator(".critic-status")).to_contain_text("approve by human:inbox:cora")
    page.screenshot(path=str(tmp_path / "critic-task.png"))
    context.close()

    assert client.result(task_id)["output"] == "I wrote notes.txt, as the rubric asks"
    decided = [
        (f["decision"], f["by"])
        for _i, f in client.events()
        if f.get("event") == "review_decided" and f.get("review_id") in (first, second)
    ]
    assert decided == [("revise", "inbox:cora"), ("approve", "inbox:cora")]
    messages = [m.content for m in client.record(task_id).conversation.messages]
    assert any(
        m.startswith("[Critic human:inbox:cora] Revise") and m.endswith("say which file you wrote")
        for m in messages
    ), messages
    assert _png_size(tmp_path / "critic.png") == (1280, 800)


def test_the_task_page_shows_what_the_task_cost(
    cluster: Cluster, inbox_url: str, chromium: Any
) -> None:
    """A task priced by its ``provider.pricing``: its page shows the tokens and the cost
    against its ``max_cost_usd``, in a real browser."""
    from playwright.sync_api import expect

    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
    client = cluster.client()
    task_id = client.submit(
        {
            "goal": "answer on a budget",
            "provider": {
                "kind": "scripted",
                "pricing": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
                "replies": [{"text": "done", "usage": usage}],
            },
            "steps": [{"id": "s", "instruction": "answer"}],
            "limits": {"max_cost_usd": 0.5},
        }
    )
    wait_until(lambda: status_of(client, task_id) == "completed", 60, "the task completed")
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{inbox_url}/login?next=/tasks/{task_id}")
    page.fill("input[name=name]", "sam")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.goto(f"{inbox_url}/tasks/{task_id}")
    expect(page.locator("#task-cost")).to_have_text("$0.0060")  # 1000 x $3 + 200 x $15 per M
    expect(page.locator("#task-usage")).to_contain_text("1200 tokens")
    expect(page.locator("#task-usage")).to_contain_text("of at most $0.5000")
    context.close()
