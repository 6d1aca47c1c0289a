"""The inbox's task page in a real browser (Debian's Chromium through Playwright): the model's
answer appears while it streams, and the journal reads as a timeline (words, durations in ms or
s, each tool result folded under its line), on a real deployment with a streaming worker."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import REPO, Cluster, Process, status_of, wait_until
from tests.integration.test_inbox import (  # the browser fixture and the inbox's settings
    ORGA,
    TOKEN,
    _env,
    _free_port,
    chromium,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.integration

ANSWER = " ".join(f"word{n}" for n in range(60)) + "."


@pytest.fixture
def streaming_cluster(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> Iterator[tuple[Cluster, FakeOpenAIServer, str]]:
    """A worker streaming a slow fake model's answers, a coordinator, and `orga inbox`."""
    with FakeOpenAIServer(api_key="sk-i", chunk_delay_s=0.08) as model:
        running = Cluster(private_redis.url, tmp_path)
        port = _free_port()
        env = _env(ORGA_REDIS_URL=private_redis.url, ORGA_INBOX_TOKEN=TOKEN)
        inbox = Process("inbox", [str(ORGA), "inbox", "--port", str(port)], env, tmp_path / "i.log")
        try:
            running.worker(
                name="wt1", ORGA_PROVIDER="openai", ORGA_BASE_URL=model.base_url,
                ORGA_API_KEY="sk-i", ORGA_STREAM_TOKENS="true",
            )  # fmt: skip
            running.coordinator(name="ct1")
            inbox.start()
            inbox.wait_for_log(f"review inbox on http://127.0.0.1:{port}/")
            yield running, model, f"http://127.0.0.1:{port}"
        finally:
            inbox.stop()
            running.stop()


def test_the_task_page_streams_the_answer_and_reads_as_a_timeline(
    streaming_cluster: tuple[Cluster, FakeOpenAIServer, str],
    chromium: Any,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """The answer's first words show on the task page while the model still streams it; once
    the task ends, the journal says what the model proposed and what each call answered, with
    readable durations and no raw JSON."""
    from playwright.sync_api import expect

    cluster, model, inbox_url = streaming_cluster
    model.respond_tool_calls(
        [("call_1", "file_write", {"path": "a.txt", "content": "hello"})], content="Writing."
    )
    model.respond_text(ANSWER)
    client = cluster.client()
    task_id = client.submit(
        {
            "goal": "write a.txt, then explain",
            "provider": {"kind": "openai", "model": "gpt-test"},
            "steps": [{"id": "work", "instruction": "do it"}],
            "stagnation": {"enabled": False},
        }
    )
    wait_until(lambda: status_of(client, task_id) is not None, 60, "the task to start")
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{inbox_url}/tasks/{task_id}")
    page.fill("input[name=name]", "tess")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{inbox_url}/tasks/{task_id}")

    live = page.locator("#live-answer")
    expect(live).to_contain_text("word0 word1 word2")
    assert len(model.stream_ends) < 2, "the answer showed only once the model had finished"
    expect(live).to_contain_text("work · iteration 2")
    page.screenshot(path=str(tmp_path / "streaming.png"))

    wait_until(lambda: status_of(client, task_id) == "completed", 120, "the task to complete")
    expect(live).to_contain_text("word59.")
    assert live.inner_text().count("word0 ") == 1
    journal = page.locator("table.journal")
    expect(journal).to_contain_text("model proposed file_write(path=a.txt, content=hello)")
    expect(journal).to_contain_text("results: file_write ok")
    expect(journal).to_contain_text(re.compile(r"1 call ran in \d+(\.\d+)? (ms|s)"))
    expect(journal).to_contain_text(re.compile(r"ended completed .* took \d+(\.\d+)? (ms|s)"))
    text = journal.inner_text()
    assert not re.search(r"\d+us\b", text), "a duration in microseconds"
    assert '{"' not in text, "raw JSON in the timeline"
    result = journal.locator("details.block", has_text="file_write call_1 → ok")
    result.locator("summary").click()
    expect(result.locator("pre")).to_be_visible()
    expect(result.locator("pre")).to_contain_text("a.txt")
    page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
    context.close()


def test_the_live_answer_drops_an_old_attempt_still_streaming(chromium: Any) -> None:  # noqa: F811
    """inbox.js in a real browser, its tokens endpoint answered by the test: attempt 0 of an
    answer keeps streaming after attempt 1 started; its late pieces are dropped, never joined
    to attempt 1's (as ``AnswerView`` does)."""
    from playwright.sync_api import expect

    def entry(kind: str, attempt: int, text: str = "") -> dict[str, Any]:
        return {"kind": kind, "step": "s", "iteration": 1, "attempt": attempt,
                "purpose": "act", "text": text}  # fmt: skip

    entries = [
        entry("token", 0, "old "),
        entry("stream_restarted", 1),
        entry("token", 1, "new "),
        entry("token", 0, "stale "),
        entry("stream_restarted", 0),
        entry("token", 1, "answer"),
        entry("stream_done", 1),
    ]
    for number, found in enumerate(entries):
        found["id"] = f"{number + 1}-0"
    script = (REPO / "coordinator" / "inbox" / "static" / "inbox.js").read_text()
    page_html = (
        '<html><head><script src="/static/inbox.js"></script></head>'
        '<body><pre id="live-answer" data-tokens="/tokens"></pre></body></html>'
    )

    def answer(route: Any) -> None:
        url = route.request.url
        if url.endswith("/static/inbox.js"):
            route.fulfill(body=script, content_type="text/javascript")
        elif "/tokens" in url:
            first = url.endswith("after=0-0")
            body = {"entries": entries if first else [], "ended": True}
            route.fulfill(body=json.dumps(body), content_type="application/json")
        else:
            route.fulfill(body=page_html, content_type="text/html")

    context = chromium.new_context()
    page = context.new_page()
    page.route("http://inbox.test/**", answer)
    page.goto("http://inbox.test/page")
    live = page.locator("#live-answer")
    expect(live).to_have_attribute("data-done", "s/1/act")
    text = page.locator("#live-answer .answer-text").inner_text()
    assert text == "new answer", live.inner_text()
    context.close()
