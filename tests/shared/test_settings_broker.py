"""``ORGA_BROKER_URL``: Celery's broker is ORGA_REDIS_URL unless it names another Redis or a
RabbitMQ, where the queues are quorum queues and the project's Redis transport is not used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared import keys
from shared.settings import OrgaSettings, celery_config, is_amqp

REPO = Path(__file__).resolve().parents[2]
AMQP = "amqp://guest:guest@rabbit:5672//"
REDIS = "redis://127.0.0.1:6379/0"


def test_the_broker_url_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_BROKER_URL is a setting read at the process edge, unset by default."""
    monkeypatch.delenv("ORGA_BROKER_URL", raising=False)
    assert OrgaSettings().broker_url is None
    monkeypatch.setenv("ORGA_BROKER_URL", AMQP)
    assert OrgaSettings().broker_url == AMQP


@pytest.mark.parametrize(
    ("url", "amqp"),
    [(AMQP, True), ("amqps://h//", True), ("pyamqp://h//", True), (REDIS, False),
     ("rediss://h:6380/0", False), ("AMQP://h//", True)],
)  # fmt: skip
def test_amqp_urls_are_told_from_redis_ones(url: str, amqp: bool) -> None:
    """amqp://, amqps:// and pyamqp:// name RabbitMQ; redis:// and rediss:// do not."""
    assert is_amqp(url) is amqp


def test_on_rabbitmq_both_queues_are_quorum_queues_with_confirmed_publishes() -> None:
    """On an amqp:// broker, orga.reasoning and orga.tools are quorum queues on topic exchanges
    of their names, publishes wait for the broker's confirm, JSON only."""
    config = celery_config(OrgaSettings(redis_url=REDIS), AMQP)
    assert config["broker_url"] == AMQP
    for queue in (keys.reasoning_queue, keys.tools_queue):
        assert config["task_queues"][queue] == {
            "exchange": queue,
            "exchange_type": "topic",
            "routing_key": queue,
            "queue_arguments": {"x-queue-type": "quorum"},
        }
    assert config["broker_transport_options"]["confirm_publish"] is True
    assert "visibility_timeout" not in config["broker_transport_options"]
    assert config["accept_content"] == ["json"] and config["task_serializer"] == "json"
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]


def test_on_redis_the_queues_are_plain_and_kombus_ack_emulation_is_off() -> None:
    """On a redis:// broker the queues are plain and kombu's Redis transport runs without ack
    emulation: no visibility timeout is passed, whatever ORGA_VISIBILITY_TIMEOUT_S says."""
    config = celery_config(OrgaSettings(redis_url=REDIS, visibility_timeout_s=1234), REDIS)
    assert config["task_queues"][keys.tools_queue] == {
        "exchange": keys.tools_queue,
        "routing_key": keys.tools_queue,
    }
    options = config["broker_transport_options"]
    assert options["ack_emulation"] is False
    assert "visibility_timeout" not in options
    assert options["socket_timeout"] > 0 and options["socket_keepalive"] is True


def _worker_transport(**env: str) -> str:
    """The broker URL and kombu transport class of ``orga.celery.app`` built from ``env``."""
    code = (
        "from orga.celery import app\n"
        "connection = app.connection_for_write()\n"
        "print(app.conf.broker_url, type(connection.transport).__module__)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True, text=True, timeout=60, check=True, cwd=REPO,
    )  # fmt: skip
    return done.stdout.strip()


def test_the_workers_app_uses_the_broker_url_and_its_transport() -> None:
    """The workers' Celery app takes ORGA_BROKER_URL as its broker, with kombu's py-amqp
    transport for RabbitMQ and the project's Redis transport (workers.broker) otherwise, and
    ORGA_REDIS_URL when ORGA_BROKER_URL is unset."""
    other_redis = "redis://127.0.0.1:6390/1"
    assert _worker_transport(ORGA_REDIS_URL=REDIS) == f"{REDIS} workers.broker"
    assert _worker_transport(ORGA_REDIS_URL=REDIS, ORGA_BROKER_URL=other_redis) == (
        f"{other_redis} workers.broker"
    )
    assert _worker_transport(ORGA_REDIS_URL=REDIS, ORGA_BROKER_URL=AMQP) == (
        f"{AMQP} kombu.transport.pyamqp"
    )
