"""Coordinator logging: event lines keep their fields; URLs lose their passwords."""

from __future__ import annotations

import logging

import pytest

from coordinator.logs import EventFormatter, redact_url
from shared.redaction import redact_url as shared_redact_url


def test_event_lines_keep_their_fields() -> None:
    """Fields passed with ``extra`` appear as key=value after the event name."""
    record = logging.makeLogRecord(
        {"name": "orga", "levelname": "INFO", "msg": "task.rejected", "task_id": "t1"}
    )
    line = EventFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO task.rejected task_id='t1'"


def test_passwords_are_redacted_from_urls() -> None:
    """A Redis URL printed in a banner or a log never shows its password (nor its user)."""
    assert redact_url("redis://:s3cret@redis:6379/0") == "redis://redis:6379/0"
    assert redact_url("redis://user:pw@h/1") == "redis://h/1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_every_nodes_password_is_redacted_from_a_cluster_url() -> None:
    """A cluster's URL naming several nodes shows none of their passwords, one holding a
    comma included."""
    url = "redis://:pw1@a:7000/0,redis://:p,w2@b:7000/0, c:7002"
    assert redact_url(url) == "redis://a:7000/0,redis://b:7000/0,c:7002"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret-pw@redis:6379/0",
        "rediss://user:s3cret-pw@h:6380/1?ssl_cert_reqs=required&password=s3cret-pw",
        "https://hooks.example/in?token=s3cret-tok&x=1",
        "http://u:s3cret-pw@127.0.0.1:8080/v1?api-key=s3cret-tok#frag",
        "redis://:s3cret-pw@a:7000/0,redis://:s3cret,pw@b:7000/0",
        "http://h/x?token=s3cret-tok,e:123/",  # a comma in a query value is no node boundary
        "http://u:s3cret-pw@llm.test:99999/v1?key=s3cret-tok",  # bad port: cut by text
    ],
)
def test_the_logs_redact_url_is_the_shared_one(url: str) -> None:
    """One implementation: the coordinator's logs and banners and every error message show a
    URL alike, without a userinfo password or a credential-like query value."""
    shown = redact_url(url)
    assert shown == shared_redact_url(url)
    assert "s3cret" not in shown
