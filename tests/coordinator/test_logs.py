"""Coordinator logging: event lines keep their fields; URLs lose their passwords."""

from __future__ import annotations

import logging

from coordinator.logs import EventFormatter, redact_url


def test_event_lines_keep_their_fields() -> None:
    """Fields passed with ``extra`` appear as key=value after the event name."""
    record = logging.makeLogRecord(
        {"name": "orga", "levelname": "INFO", "msg": "task.rejected", "task_id": "t1"}
    )
    line = EventFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO task.rejected task_id='t1'"


def test_passwords_are_redacted_from_urls() -> None:
    """A Redis URL printed in a banner or a log never shows its password."""
    assert redact_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("redis://user:pw@h/1") == "redis://user:***@h/1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_every_nodes_password_is_redacted_from_a_cluster_url() -> None:
    """A cluster's URL naming several nodes shows none of their passwords, one holding a
    comma included."""
    url = "redis://:pw1@a:7000/0,redis://:p,w2@b:7000/0, c:7002"
    assert redact_url(url) == "redis://:***@a:7000/0,redis://:***@b:7000/0,c:7002"
