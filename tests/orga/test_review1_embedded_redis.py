"""Review finding (branch review1): test_embedded_redis's and test_model_key_isolation's
check that the password is not on redis-server's command line reads /proc/PID/cmdline after
the server answered PING, when Redis has already overwritten its argv with its title
(``redis-server 127.0.0.1:PORT``). Put the password back on the command line and that check
still passes: it cannot fail. What would: the argv handed to Popen."""

from __future__ import annotations

from pathlib import Path

import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.orga.test_embedded_redis import real_binary  # noqa: F401 - the fixture


class _ArgvPassword(EmbeddedRedis):
    """The regression the test is meant to catch: requirepass on the command line."""

    def _command(self) -> list[str]:
        command = [a for a in super()._command() if a != "-"]
        return [*command, "--requirepass", self.password or ""]


def test_the_cmdline_check_cannot_see_a_password_on_the_command_line(real_binary: str) -> None:  # noqa: F811
    password = "pw-on-the-command-line-3f0a"
    with _ArgvPassword(password=password, binary=real_binary) as server:
        assert server.pid is not None
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    # the existing assertion passes although the password WAS on the command line:
    assert password.encode() not in cmdline


def test_the_argv_handed_to_redis_server_holds_no_password(real_binary: str) -> None:  # noqa: F811
    """The check that can fail (passes on stage)."""
    password = "pw-not-on-any-command-line-7c1e"
    server = EmbeddedRedis(password=password, binary=real_binary)
    with server:
        assert password not in " ".join(server._command())
    with pytest.raises(AssertionError), _ArgvPassword(password=password, binary=real_binary) as bad:
        assert password not in " ".join(bad._command())
