"""The Celery configuration the workers and the coordinator share: task events, which Flower's
task list needs, are on unless ``ORGA_TASK_EVENTS=false``."""

from __future__ import annotations

import pytest

from shared.settings import OrgaSettings, celery_config

URL = "redis://127.0.0.1:6379/0"


def test_task_events_are_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing set, workers send task events (as with `-E`); `task-sent` stays off."""
    monkeypatch.delenv("ORGA_TASK_EVENTS", raising=False)
    config = celery_config(OrgaSettings(), URL)
    assert config["worker_send_task_events"] is True
    assert config["task_send_sent_event"] is False


def test_orga_task_events_false_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_TASK_EVENTS=false, read from the environment, turns the workers' task events off."""
    monkeypatch.setenv("ORGA_TASK_EVENTS", "false")
    assert celery_config(OrgaSettings(), URL)["worker_send_task_events"] is False
