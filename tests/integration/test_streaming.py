"""Live tokens through real processes: `orga run` shows the model's words as they stream, and
a reasoning worker SIGKILLed mid-answer is re-sent with watchers told ``stream_restarted``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared.tokens import AnswerView
from tests.fakes.llm_server import FakeAnthropicServer, FakeLLMServer, FakeOpenAIServer
from tests.integration.harness import (
    ORGA,
    REPO,
    Cluster,
    Process,
    cli_env,
    run_orga,
    wait_until,
)

pytestmark = pytest.mark.integration

ANSWER = " ".join(f"word{n}" for n in range(60)) + "."


def _task(tmp_path: Path) -> Path:
    task = {
        "goal": "answer the question at length",
        "provider": {"kind": "openai", "model": "gpt-test"},
        "steps": [{"id": "answer", "instruction": "answer it"}],
        "stagnation": {"enabled": False},
    }
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


def _provider_env(model: FakeLLMServer, kind: str = "openai") -> dict[str, str]:
    return {"ORGA_PROVIDER": kind, "ORGA_BASE_URL": model.base_url, "ORGA_API_KEY": "sk-s"}


# The provider kinds that stream, each with its fake server speaking its streaming wire format
# (OpenAI's ``data:`` chunks with usage, Anthropic's named events) and a model it accepts.
STREAMING_PROVIDERS: dict[str, tuple[type[FakeOpenAIServer] | type[FakeAnthropicServer], str]] = {
    "openai": (FakeOpenAIServer, "gpt-test"),
    "anthropic": (FakeAnthropicServer, "claude-test"),
}


class _Reader:
    """Reads a pipe as it is written, noting when each piece came."""

    def __init__(self, fd: int) -> None:
        self.pieces: list[tuple[float, str]] = []
        self._fd = fd
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while chunk := os.read(self._fd, 4096):
            self.pieces.append((time.monotonic(), chunk.decode(errors="replace")))

    def first_time(self, text: str) -> float | None:
        """When the output first held ``text``."""
        seen = ""
        for at, piece in self.pieces:
            seen += piece
            if text in seen:
                return at
        return None

    def text(self) -> str:
        self._thread.join(10)
        return "".join(piece for _, piece in self.pieces)


def test_orga_run_shows_the_answer_as_it_streams(tmp_path: Path) -> None:
    """`orga run` prints the first words of the answer while the model is still streaming it
    (long before the iteration ends), then the whole answer once, and the result."""
    with FakeOpenAIServer(api_key="sk-s", chunk_delay_s=0.05) as model:
        model.respond_tool_calls([("call_1", "file_list", {"path": "."})], content="Looking.")
        model.respond_text(ANSWER)
        env = cli_env(tmp_path, **_provider_env(model))
        errors = tmp_path / "stderr.log"
        with errors.open("wb") as stderr:
            process = subprocess.Popen(
                [str(ORGA), "run", str(_task(tmp_path))],
                env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
            )  # fmt: skip
        assert process.stdout is not None
        with process.stdout:
            reader = _Reader(process.stdout.fileno())
            try:
                process.wait(180)
            finally:
                if process.poll() is None:
                    process.kill()
            output = reader.text()
        assert process.returncode == 0, output + errors.read_text()
        assert len(model.stream_ends) == 2, model.requests
        first_words = reader.first_time("word0 word1")
        assert first_words is not None, output
        assert first_words < model.stream_ends[1] - 1.0, "the first words came only at the end"
        # Once as it streamed, once as the result; never restarted, never half of it twice.
        assert output.count(ANSWER) == 2, output
        assert "[answer restarted" not in output
        assert "Looking." in output
        assert "answer · iteration 1\nLooking." in output
        assert "answer · iteration 2\nword0" in output


def _slow_task(tmp_path: Path, kind: str = "openai") -> dict[str, object]:
    model = STREAMING_PROVIDERS[kind][1]
    return {
        "goal": "answer the question at length",
        "provider": {"kind": kind, "model": model},
        "steps": [{"id": "answer", "instruction": "answer it"}],
        "stagnation": {"enabled": False},
    }


@pytest.fixture
def killable(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose worker gets killed."""
    running = Cluster(private_redis.url, tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("kind", sorted(STREAMING_PROVIDERS))
def test_a_worker_killed_mid_stream_restarts_the_answer_for_watchers(
    killable: Cluster, kind: str
) -> None:
    """SIGKILL the reasoning worker's pool process while the answer streams (from the fake
    OpenAI server, or the fake Anthropic one): the dispatch is re-sent, the tokens stream says
    stream_restarted with the new attempt, and what a watcher shows is the one whole answer,
    the task's result."""
    server = STREAMING_PROVIDERS[kind][0]
    with server(api_key="sk-s", chunk_delay_s=0.1) as model:
        model.respond_text(ANSWER)
        model.respond_text(ANSWER)
        fast = {"ORGA_HEARTBEAT_INTERVAL_S": "0.5", "ORGA_HEARTBEAT_TIMEOUT_S": "2"}
        streams = {**_provider_env(model, kind), **fast, "ORGA_STREAM_TOKENS": "true"}
        worker = killable.worker(name="ws1", concurrency=1, **streams)
        killable.coordinator(name="cs1", **fast)
        client = killable.client()
        task_id = client.submit(_slow_task(killable.root, kind))
        wait_until(
            lambda: any(e.kind == "token" for e in client.tokens(task_id)), 60, "streamed tokens"
        )
        for child in worker.children():
            os.kill(child, signal.SIGKILL)
        result = client.wait(task_id, timeout_s=120)
        entries = client.tokens(task_id)
    assert result["status"] == "completed", killable.logs()
    assert result["output"] == ANSWER
    assert all(r.body.get("stream") is True for r in model.requests), model.requests
    kinds = [e.kind for e in entries]
    assert "stream_restarted" in kinds, kinds
    restart = entries[kinds.index("stream_restarted")]
    first = entries[0]
    assert restart.iteration == first.iteration and restart.step == first.step
    view = AnswerView()
    for entry in entries:
        view.apply(entry)
    assert view.done and view.text == ANSWER
    assert view.restarts >= 1
    # orga journal --follow prints the same entries, one {"tokens": ...} line each.
    followed = killable.orga("journal", task_id, "--follow")
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [x["tokens"]["kind"] for x in lines if "tokens" in x] == kinds
    assert any("event" in x for x in lines)
    # The HTTP API's Server-Sent Events carry the same entries, in order, then the end.
    sse = _sse_kinds(killable, task_id)
    assert [kind for kind in sse if kind in ("token", "stream_restarted")] == [
        "stream_restarted" if kind == "stream_restarted" else "token" for kind in kinds
    ], sse
    assert sse[-1] == "status"


def _sse_kinds(cluster: Cluster, task_id: str) -> list[str]:
    """The kinds of a task's events from `orga api`'s `GET /v1/tasks/{id}/events`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    token = "stream-test-token-0123456789"
    command = [str(ORGA), "api", "--host", "127.0.0.1", "--port", str(port)]
    env = cluster._env({"ORGA_API_TOKENS": token})
    process = Process("api", command, env, cluster.root / "api.log").start()
    try:
        process.wait_for_log(f"API on http://127.0.0.1:{port}/v1/")
        found: list[str] = []
        headers = {"Authorization": f"Bearer {token}"}
        url = f"http://127.0.0.1:{port}/v1/tasks/{task_id}/events"
        with httpx.stream("GET", url, headers=headers, timeout=60) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("event:"):
                    found.append(line.partition(":")[2].strip())
        return found
    finally:
        process.stop()


def test_a_deployment_streams_only_when_asked(killable: Cluster) -> None:
    """ORGA_STREAM_TOKENS is off by default on a deployment: the model is asked for one whole
    answer and the task's tokens stream stays empty."""
    with FakeOpenAIServer(api_key="sk-s") as model:
        model.respond_text("whole")
        killable.worker(name="ws2", concurrency=1, **_provider_env(model))
        killable.coordinator(name="cs2")
        client = killable.client()
        task_id = client.submit(_slow_task(killable.root))
        result = client.wait(task_id, timeout_s=120)
        assert "stream" not in model.requests[0].body
    assert result["output"] == "whole"
    assert client.tokens(task_id) == []


def test_orga_run_json_prints_no_tokens(tmp_path: Path) -> None:
    """--json output stays one JSON document (no streamed text mixed in)."""
    with FakeOpenAIServer(api_key="sk-s") as model:
        model.respond_text("short answer")
        env = cli_env(tmp_path, **_provider_env(model))
        ran = run_orga("run", str(_task(tmp_path)), "--json", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["output"] == "short answer"
