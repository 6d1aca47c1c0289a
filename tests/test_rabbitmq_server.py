"""The private RabbitMQ node of the broker tests says why it cannot start."""

from __future__ import annotations

import pytest

from tests.rabbitmq_server import RabbitMQServer, RabbitMQUnavailableError


def test_a_missing_rabbitmq_server_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without rabbitmq-server on the PATH, starting the node raises saying how to install it
    (the broker suite then fails under CI=true, through tests.ci.require)."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RabbitMQUnavailableError, match="install Debian's rabbitmq-server"):
        RabbitMQServer().start()
