"""Webhooks from a real coordinator process (``ORGA_WEBHOOKS``) to a local HTTP receiver: a
receiver that fails twice then accepts gets the same signed delivery three times, backing
off; one that never accepts is dead-lettered after the deadline; one that hangs delays no
task."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.webhooks import verify_signature
from tests.integration.harness import (
    PARTITIONS,
    Cluster,
    running_cluster,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

SECRET = "webhook-secret-0123456789"
HOOKED_ENV: dict[str, str] = {}
"""The coordinators' webhook settings (filled by the ``hooked`` fixture)."""
DEADLINE_S = 5


@dataclass
class Received:
    """One post the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """A local HTTP server: ``/flaky`` answers 500 to the first two posts of a delivery,
    then 204; ``/down`` always 503; ``/hang`` never answers (until the test ends);
    ``/toggle`` 500 until ``accept_toggle`` is set, then 204."""

    posts: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    accept_toggle: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_post(self, handler: BaseHTTPRequestHandler) -> int:
        length = int(handler.headers.get("Content-Length", "0"))
        post = Received(
            handler.path, dict(handler.headers), handler.rfile.read(length), time.time()
        )
        with self.lock:
            delivery = post.headers.get("X-Orga-Delivery")
            earlier = [
                p
                for p in self.posts
                if p.path == post.path and p.headers.get("X-Orga-Delivery") == delivery
            ]
            self.posts.append(post)
        if post.path.startswith("/hang"):
            self.release.wait(60)
            return 204
        if post.path.startswith("/down"):
            return 503
        if post.path.startswith("/toggle"):
            return 204 if self.accept_toggle.is_set() else 500
        return 500 if len(earlier) < 2 else 204

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path.startswith(path)]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    """The receiver, serving on a free local port; its base URL."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(state.on_post(self))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def hooked(
    private_redis: EmbeddedRedis,
    receiver: tuple[Receiver, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """A worker and a coordinator whose ORGA_WEBHOOKS name the receiver's three endpoints."""
    _, base = receiver
    hooks = [
        {"url": f"{base}/flaky", "events": ["task_finished"], "secret": SECRET},
        {"url": f"{base}/down?token=query-credential", "events": ["task_failed"]},
        {"url": f"{base}/hang", "events": ["task_finished"]},
        {"url": f"{base}/toggle", "events": ["review_opened"]},
    ]
    HOOKED_ENV.update(
        {
            "ORGA_WEBHOOKS": json.dumps(hooks),
            "ORGA_WEBHOOK_DEADLINE_S": str(DEADLINE_S),
            "ORGA_WEBHOOK_TIMEOUT_S": "30",
            "ORGA_WEBHOOK_CLAIM_IDLE_MS": "1000",
        }
    )
    root = tmp_path_factory.mktemp("hooked")
    with running_cluster(private_redis.url, root, coordinator_env=HOOKED_ENV) as running:
        yield running


def _quick(reply: str) -> dict[str, Any]:
    return {
        "goal": "answer",
        "provider": {"kind": "scripted", "replies": [reply]},
        "steps": [{"id": "s", "instruction": "answer"}],
    }


def test_a_receiver_failing_twice_gets_the_signed_post_a_third_time(
    hooked: Cluster, receiver: tuple[Receiver, str]
) -> None:
    """task_finished to /flaky: three posts of one delivery (500, 500, 204), each signed
    with HMAC-SHA256 over its timestamp and body, spaced by the back-off (1 s, then 2 s)."""
    state, _ = receiver
    client = hooked.client()
    task_id = client.submit(_quick("finished"))
    assert client.wait(task_id, timeout_s=60)["status"] == "completed"
    wait_until(lambda: len([p for p in state.at("/flaky") if p.json["task_id"] == task_id]) >= 3,
               30, "the third post")  # fmt: skip
    posts = [p for p in state.at("/flaky") if p.json["task_id"] == task_id]
    assert len({p.headers["X-Orga-Delivery"] for p in posts}) == 1
    for post in posts:
        assert post.json["event"] == "task_finished" and post.json["lifecycle_event"] == "completed"
        assert verify_signature(
            SECRET, post.headers["X-Orga-Signature"], post.headers["X-Orga-Timestamp"], post.body
        )
        assert not verify_signature("another-secret", post.headers["X-Orga-Signature"],
                                    post.headers["X-Orga-Timestamp"], post.body)  # fmt: skip
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(posts)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, gaps
    time.sleep(2.5)
    assert len([p for p in state.at("/flaky") if p.json["task_id"] == task_id]) == 3


def test_a_receiver_that_never_accepts_is_dead_lettered(
    hooked: Cluster, receiver: tuple[Receiver, str]
) -> None:
    """task_failed to /down (503 always): retried until the deadline, then on the partition's
    dead-letter stream as ``kind: webhook`` with the URL's query shown as ``***`` (a credential
    may be there) and the last error."""
    state, _ = receiver
    client = hooked.client()
    call = {"name": "run_command", "arguments": {"command": "sleep 30"}}
    task_id = client.submit({
        "goal": "wait", "provider": {"kind": "scripted", "replies": [{"tool_calls": [call]}]},
        "steps": [{"id": "s", "instruction": "wait"}],
    })  # fmt: skip
    wait_until(lambda: status_of(client, task_id) == "running", 30, "the task to run")
    client.cancel(task_id, "stop it")
    wait_until(lambda: status_of(client, task_id) == "aborted", 30, "the abort")
    dead = keys.dead_letter_stream(keys.partition_of(task_id, PARTITIONS))

    def letters() -> list[dict[str, str]]:
        rows = client.redis.xrange(dead)
        return [f for _i, f in rows if f.get("kind") == "webhook" and f.get("task_id") == task_id]

    wait_until(letters, DEADLINE_S + 20, "the dead letter")
    letter = letters()[0]
    assert letter["event"] == "task_failed" and letter["url"].endswith("/down?***")
    assert "query-credential" not in json.dumps(letter) and SECRET not in json.dumps(letter)
    assert "HTTP 503" in letter["error"] and int(letter["attempts"]) >= 2
    assert len([p for p in state.at("/down") if p.json["task_id"] == task_id]) >= 2
    assert SECRET not in (Path(hooked.root) / "c1.log").read_text()


def test_a_hanging_receiver_delays_no_task(hooked: Cluster, receiver: tuple[Receiver, str]) -> None:
    """/hang holds every post it gets: the tasks after it complete as fast as the first."""
    state, _ = receiver
    client = hooked.client()
    wait_until(lambda: state.at("/hang"), 30, "a post to /hang")
    hanging = len(state.at("/hang"))
    durations = []
    for n in range(3):
        started = time.monotonic()
        result = client.wait(client.submit(_quick(f"quick {n}")), timeout_s=60)
        durations.append(time.monotonic() - started)
        assert result["status"] == "completed"
    assert not state.release.is_set() and len(state.at("/hang")) > hanging
    assert max(durations) < 5.0, durations
    print(f"RESULT task_seconds_with_a_hanging_webhook {max(durations):.2f}")


def test_a_post_pending_when_its_coordinator_dies_is_made_by_the_next(
    hooked: Cluster, receiver: tuple[Receiver, str]
) -> None:
    """review_opened to /toggle fails (500); the coordinator is killed (SIGKILL) while it backs
    off; a coordinator started after takes the pending post over (ORGA_WEBHOOK_CLAIM_IDLE_MS)
    and makes it, with the same delivery id, once the receiver accepts. Runs last: it replaces
    the module's coordinator."""
    state, _ = receiver
    client = hooked.client()
    task_id = client.submit({
        "goal": "write notes",
        "provider": {"kind": "scripted", "replies": ["I wrote notes.txt"]},
        "steps": [{"id": "notes", "instruction": "write notes",
                   "critic": {"human": True, "rubric": "clear notes", "max_rounds": 1}}],
    })  # fmt: skip

    def posts() -> list[Received]:
        return [p for p in state.at("/toggle") if p.json["task_id"] == task_id]

    wait_until(posts, 60, "the first post of review_opened")
    first = next(p for p in hooked.processes if p.name == "c1")
    first.kill()
    state.accept_toggle.set()
    killed_at = time.time()
    hooked.coordinator("c2", **HOOKED_ENV)
    wait_until(lambda: any(p.at > killed_at for p in posts()), 60, "the post taken over")
    assert len({p.headers["X-Orga-Delivery"] for p in posts()}) == 1
    assert posts()[0].json["event"] == "review_opened"
