"""A held tool call edited in the inbox, in a real browser (Debian's Chromium driven by
Playwright), on a deployment: a real Redis, a Celery worker and a coordinator process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.events import CallDecided
from tests.integration.harness import Cluster, status_of, wait_until
from tests.integration.test_inbox import TOKEN, chromium, inbox_url

__all__ = ["chromium", "inbox_url"]  # the fixtures, shared with test_inbox

pytestmark = pytest.mark.integration

PUSH = {"command": "git push origin main"}
EDITED = {"command": "echo pushed to review > pushed.txt"}


def _held_push(cluster: Cluster) -> tuple[str, str]:
    """Submit a task whose push is held; wait for its review: (task, review)."""
    client = cluster.client()
    reply = {"tool_calls": [{"name": "run_command", "arguments": PUSH}]}
    task_id = client.submit(
        {
            "goal": "ship the fix",
            "provider": {"kind": "scripted", "replies": [reply, "pushed for review"]},
            "steps": [{"id": "ship", "instruction": "push the branch"}],
            "policy": {"require_approval": ["run_command:git push*"]},
        }
    )
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 60, "the held call")
    return task_id, str(client.status(task_id)["review_id"])


def test_a_reviewer_edits_a_held_call_in_the_browser(
    cluster: Cluster, inbox_url: str, chromium: Any, tmp_path: Path
) -> None:
    """The inbox shows the held call and its arguments; an edit that does not fit the tool's
    schema comes back with the error naming the field and the typed text kept; a valid edit
    runs the call with the new arguments, journaled with who decided and both versions."""
    from playwright.sync_api import expect

    task_id, review_id = _held_push(cluster)
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{inbox_url}/")
    page.fill("input[name=name]", "rita")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")

    card = page.locator(f"#review-{review_id}")
    expect(card.locator(".held-call code.tool")).to_have_text("run_command")
    expect(card.locator(".held-call pre.arguments")).to_contain_text('"git push origin main"')
    expect(card.locator(".held-call .schema")).to_contain_text("command")
    expect(card.locator("button[value=retry]")).to_have_count(0)

    bad = '{"command": 3}'
    card.locator("textarea[name=arguments]").fill(bad)
    card.locator("button[value=edit]").click()
    error = page.locator(f"#error-{review_id}")
    expect(error).to_contain_text("at 'command': 3 is not of type 'string'")
    expect(page.locator(f"#review-{review_id} textarea[name=arguments]")).to_have_value(bad)
    page.screenshot(path=str(tmp_path / "bad-edit.png"))
    assert status_of(cluster.client(), task_id) == "awaiting_review"

    card = page.locator(f"#review-{review_id}")
    card.locator("textarea[name=arguments]").fill(json.dumps(EDITED))
    card.locator("button[value=edit]").click()
    page.wait_for_url(f"{inbox_url}/tasks/{task_id}")
    expect(page.locator(".flash.ok")).to_contain_text(f"edit applied to task {task_id}")
    context.close()

    client = cluster.client()
    assert client.wait(task_id, timeout_s=60)["status"] == "completed"
    workspace = Path(client.record(task_id).workspace or "")
    assert (workspace / "pushed.txt").read_text() == "pushed to review\n"
    decided = [e.event for e in client.journal(task_id) if isinstance(e.event, CallDecided)]
    assert [(d.decision, d.decided_by) for d in decided] == [("edit", "inbox:rita")]
    assert json.loads(decided[0].arguments_before) == PUSH
    assert json.loads(decided[0].arguments_after or "") == EDITED
