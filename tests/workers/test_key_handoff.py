"""The model keys go to a reasoning worker through a socket of its own, never an environment."""

from __future__ import annotations

import os
import socket

import pytest

from workers import key_handoff

ENVIRON = {"PATH": "/usr/bin", "ORGA_API_KEY": "sk-1", "OPENAI_API_KEY": " ", "X": "y"}


def test_keys_leave_the_environment_and_arrive_through_the_socket() -> None:
    """Blank keys are no keys; the environment keeps everything else; the socket gives the
    keys once, then end of file."""
    keys = key_handoff.model_keys(ENVIRON)
    assert keys == {"ORGA_API_KEY": "sk-1"}
    assert key_handoff.without_keys({**ENVIRON, key_handoff.KEYS_FD_VARIABLE: "5"}) == {
        "PATH": "/usr/bin",
        "X": "y",
    }
    fd = key_handoff.send(keys)
    assert os.get_inheritable(fd)
    assert key_handoff.receive(fd) == keys
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)  # closed by receive


def test_a_key_socket_cannot_be_opened_again_through_proc() -> None:
    """Unlike a pipe or a file, another process of the same user cannot open the socket a
    process holds through /proc/PID/fd/N (ENXIO)."""
    fd = key_handoff.send({"ORGA_API_KEY": "sk-1"})
    try:
        with pytest.raises(OSError, match="No such device or address"):
            open(f"/proc/{os.getpid()}/fd/{fd}", "rb")  # noqa: SIM115
    finally:
        os.close(fd)


@pytest.mark.parametrize("value", ["x", "3,y"])
def test_a_bad_descriptor_list_is_named(value: str) -> None:
    """ORGA_MODEL_KEYS_FD that is not numbers: the error names the value."""
    with pytest.raises(ValueError, match=repr(value)):
        key_handoff.fds({key_handoff.KEYS_FD_VARIABLE: value})


def test_a_socket_holding_something_else_is_refused() -> None:
    """A socket that does not hold a JSON object of strings is refused, saying what to do."""
    reader, writer = socket.socketpair()
    with writer:
        writer.sendall(b"[1]")
    with pytest.raises(ValueError, match="mapping"):
        key_handoff.receive(reader.detach())


def test_a_key_under_another_letter_case_is_a_key_too() -> None:
    """The settings read ``orga_api_key`` as the key (pydantic-settings ignores case), so the
    hand-off takes it out of the environment too, under its upper-case name; an upper-case
    spelling wins over another one."""
    environ = {"PATH": "/usr/bin", "orga_api_key": "sk-low", "Openai_Api_Key": "sk-mixed"}
    assert key_handoff.model_keys(environ) == {
        "ORGA_API_KEY": "sk-low",
        "OPENAI_API_KEY": "sk-mixed",
    }
    assert key_handoff.without_keys(environ) == {"PATH": "/usr/bin"}
    both = {"orga_api_key": "sk-low", "ORGA_API_KEY": "sk-up"}
    assert key_handoff.model_keys(both) == {"ORGA_API_KEY": "sk-up"}


def test_the_serving_sides_secrets_leave_a_workers_environment_in_any_case() -> None:
    """API tokens, webhooks and the inbox's credentials (in any letter case) and the secrets
    socket's variable are in no environment :func:`without_keys` makes for a worker; the
    command's own hand-off finds them under their upper-case names."""
    environ = {
        "PATH": "/usr/bin",
        "ORGA_API_TOKENS": "tok-a,tok-b",
        "orga_webhooks": '[{"url": "https://x.test", "secret": "s"}]',
        "ORGA_INBOX_TOKEN": "inbox",
        "Orga_Inbox_Basic_Auth": "ann:pw",
        "ORGA_INBOX_SECRET": "session",
        "ORGA_INBOX_SECURE_COOKIES": "auto",
        key_handoff.SECRETS_FD_VARIABLE: "7",
    }
    assert key_handoff.without_keys(environ) == {
        "PATH": "/usr/bin",
        "ORGA_INBOX_SECURE_COOKIES": "auto",
    }
    assert set(key_handoff.process_secrets(environ)) == key_handoff.PROCESS_SECRET_VARIABLES
    fd = key_handoff.send(key_handoff.process_secrets(environ))
    received = key_handoff.receive(fd, key_handoff.SECRETS_FD_VARIABLE)
    assert received["ORGA_API_TOKENS"] == "tok-a,tok-b"


def test_connection_urls_leave_the_environment_and_arrive_through_their_socket() -> None:
    """ORGA_REDIS_URL and ORGA_BROKER_URL (any letter case) are not in an environment handed
    to a worker, nor is the variable naming their socket; the socket gives them once, at the
    process edge, and the variable is removed."""
    environ = {
        "PATH": "/usr/bin",
        "orga_redis_url": "redis://:lower@h/0",
        "ORGA_REDIS_URL": "redis://:pw-1@h/0",
        "ORGA_BROKER_URL": "amqp://u:pw-2@h//",
        "ORGA_BASE_URL": "http://model",
        key_handoff.CONNECTION_FD_VARIABLE: "7",
    }
    urls = key_handoff.connection_urls(environ)
    assert urls == {"ORGA_REDIS_URL": "redis://:pw-1@h/0", "ORGA_BROKER_URL": "amqp://u:pw-2@h//"}
    assert key_handoff.without_keys(environ) == {
        "PATH": "/usr/bin",
        "ORGA_BASE_URL": "http://model",
    }
    process_environ = {key_handoff.CONNECTION_FD_VARIABLE: str(key_handoff.send(urls))}
    assert key_handoff.received_connection_urls(process_environ) == urls
    assert process_environ == {}
    assert key_handoff.received_connection_urls(process_environ) == {}  # none: read from env


def test_a_connection_socket_holding_something_else_is_refused_saying_what() -> None:
    fd = key_handoff.send({"ORGA_API_KEY": "sk-1"})
    with pytest.raises(ValueError, match=r"holds \['ORGA_API_KEY'\], not connection URLs"):
        key_handoff.received_connection_urls({key_handoff.CONNECTION_FD_VARIABLE: str(fd)})
    with pytest.raises(ValueError, match="'x' is not a file descriptor"):
        key_handoff.received_connection_urls({key_handoff.CONNECTION_FD_VARIABLE: "x"})
