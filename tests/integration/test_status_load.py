"""`orga status` shows what each task waits on: queued against running, as an operator reads it.

A real coordinator and Celery worker, a local OpenAI-compatible model that answers after a few
seconds, and the ``orga`` CLI in a subprocess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import Cluster, running_cluster, status_of, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """One worker (that may call the local model) and one coordinator."""
    worker = {"ORGA_ALLOW_TASK_BASE_URL": "true"}
    with running_cluster(private_redis.url, tmp_path, worker_env=worker) as running:
        yield running


def test_status_shows_a_slow_model_call_running_then_the_task_done(cluster: Cluster) -> None:
    """While the model thinks, the task waits on one running reasoning call; then it ends."""
    with FakeOpenAIServer() as model:
        model.respond_json(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": "gpt-test",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "done"},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            },
            delay_s=6.0,
        )
        client = cluster.client()
        task_id = client.submit(
            {
                "goal": "think slowly",
                "provider": {"kind": "openai", "base_url": model.base_url, "model": "gpt-test"},
                "steps": [{"id": "s", "instruction": "answer"}],
            }
        )
        wait_until(lambda: len(model.requests) == 1, timeout_s=60, what="the model call")
        shown = cluster.orga("status", task_id)
        assert shown.returncode == 0, shown.stderr
        dispatch = json.loads(shown.stdout)["dispatch"]
        assert dispatch == {
            "kind": "reason", "queue": "orga.reasoning", "queued": 0, "running": 1, "answered": 0
        }  # fmt: skip
        listed = cluster.orga("status")
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.splitlines() if task_id[:8] in line)
        assert "reason: 1 running" in row, listed.stdout
        assert "queued: orga.reasoning 0, orga.tools 0; running: 1" in listed.stdout
        wait_until(lambda: status_of(client, task_id) == "completed", timeout_s=60, what="done")
        assert json.loads(cluster.orga("status", task_id).stdout)["dispatch"] is None
