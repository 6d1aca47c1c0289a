"""Which workers ``orga worker`` starts, and how the supervisor gets their commands."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from orga import supervisor
from orga.topology import POOL_PATH, Role, WorkerCommand, supervisor_exec, worker_commands
from shared.settings import OrgaSettings
from workers import key_handoff

ENVIRON = {"PATH": "/usr/bin", "ORGA_API_KEY": "sk-very-secret", "ORGA_REDIS_URL": "redis://x"}


def _settings(**values: object) -> OrgaSettings:
    return OrgaSettings.model_validate(values)


def _queue(argv: list[str]) -> str:
    return argv[argv.index("-Q") + 1]


def _name(argv: list[str]) -> str | None:
    return argv[argv.index("-n") + 1] if "-n" in argv else None


def _close(commands: Sequence[WorkerCommand]) -> None:
    for command in commands:
        for fd in command.pass_fds:
            os.close(fd)


def test_by_default_all_is_one_reasoning_process_and_one_tool_worker() -> None:
    """One reasoning process by default: on the 2-core box it holds 200 calls in flight at a
    fraction of one CPU, and a second costs its memory for nothing (docs/performance.md)."""
    commands = worker_commands(Role.ALL, _settings(), ENVIRON)
    assert [c.role for c in commands] == [Role.REASONING, Role.TOOLS]
    _close(commands)


def test_all_starts_the_reasoning_processes_and_one_tool_worker() -> None:
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=2), ENVIRON)
    roles = [c.role for c in commands]
    assert roles == [Role.REASONING, Role.REASONING, Role.TOOLS]
    names = [_name(c.argv) for c in commands]
    assert len(set(names)) == 3, names
    assert all(n is not None and n.endswith("@%h") for n in names)
    reasoning, tools = commands[0], commands[2]
    assert _queue(reasoning.argv) == "orga.reasoning"
    assert reasoning.env["CELERY_CUSTOM_WORKER_POOL"] == POOL_PATH
    assert _queue(tools.argv) == "orga.tools"
    assert all("sk-very-secret" not in c.env.values() for c in commands)
    assert tools.key_fd is None and key_handoff.KEYS_FD_VARIABLE not in tools.env
    for command in commands[:2]:  # each reasoning worker reads the key from its own socket
        assert command.env[key_handoff.KEYS_FD_VARIABLE] == str(command.key_fd)
        assert command.key_fd is not None
        assert key_handoff.receive(command.key_fd) == {"ORGA_API_KEY": "sk-very-secret"}


def test_no_socket_without_a_key_and_given_sockets_are_used() -> None:
    """Without keys no socket is made; the sockets a process kept for its reasoning workers
    (after it dropped its keys) go one to each, and a count that does not match is refused."""
    keyless = {k: v for k, v in ENVIRON.items() if k != "ORGA_API_KEY"}
    two = _settings(reasoning_processes=2)
    assert all(c.key_fd is None for c in worker_commands(Role.ALL, two, keyless))
    commands = worker_commands(Role.ALL, two, keyless, key_fds=[7, 9])
    assert [c.key_fd for c in commands] == [7, 9, None]
    with pytest.raises(ValueError, match="1 model key sockets for 2 reasoning workers"):
        worker_commands(Role.ALL, two, keyless, key_fds=[7])


def test_one_reasoning_process_keeps_the_names_of_before() -> None:
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=1), ENVIRON)
    assert [c.role for c in commands] == [Role.REASONING, Role.TOOLS]
    assert [(_name(c.argv) or "").split("-")[0] for c in commands] == ["reasoning", "tools"]
    single = worker_commands(Role.REASONING, _settings(reasoning_processes=1), ENVIRON, name="r@h")
    assert [_name(c.argv) for c in single] == ["r@h"]
    # unnamed, one worker of one role still gets a name of its own, not Celery's celery@host
    # (a reasoning and a tool worker started apart on one host must differ)
    unnamed = [
        *worker_commands(Role.REASONING, _settings(), ENVIRON),
        *worker_commands(Role.TOOLS, _settings(), ENVIRON),
    ]
    names = [_name(c.argv) or "" for c in unnamed]
    assert names[0].startswith("reasoning-") and names[1].startswith("tools-"), names
    assert all(n.endswith("@%h") for n in names)
    _close(unnamed)
    _close([*commands, *single])


def test_the_reasoning_role_starts_as_many_processes_as_asked() -> None:
    commands = worker_commands(Role.REASONING, _settings(reasoning_processes=3), ENVIRON)
    assert [c.role for c in commands] == [Role.REASONING] * 3
    assert len({_name(c.argv) for c in commands}) == 3
    embedded = worker_commands(Role.ALL, _settings(), ENVIRON, prefix="embedded-")
    assert all((_name(c.argv) or "").startswith("embedded-") for c in embedded)
    _close([*commands, *embedded])


def test_the_supervisor_gets_the_commands_but_no_secret() -> None:
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=2), ENVIRON)
    argv, env = supervisor_exec(commands, ENVIRON)
    assert argv[1:] == ["-m", "orga.supervisor"]
    assert "ORGA_API_KEY" not in env and "sk-very-secret" not in "".join(env.values())
    children = supervisor.decode(env[supervisor.COMMANDS_VARIABLE], env)
    assert [c.argv for c in children] == [c.argv for c in commands]
    assert [c.env for c in children] == [c.env for c in commands]
    assert [c.pass_fds for c in children] == [c.pass_fds for c in commands]
    assert all(supervisor.COMMANDS_VARIABLE not in c.env for c in children)
    _close(commands)


def test_the_supervisor_forks_the_workers_only_when_asked_and_all_are_workers() -> None:
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=2), ENVIRON)
    _, forked = supervisor_exec(commands, ENVIRON, fork=True)
    _, started = supervisor_exec(commands, ENVIRON, fork=False)
    assert forked[supervisor.FORK_VARIABLE] == "1"
    assert supervisor.FORK_VARIABLE not in started
    children = supervisor.decode(forked[supervisor.COMMANDS_VARIABLE], forked)
    assert supervisor.forkable(children)
    assert all(supervisor.FORK_VARIABLE not in c.env for c in children)
    other = [*commands, WorkerCommand(Role.TOOLS, ["/bin/true"], {})]
    _, env = supervisor_exec(other, ENVIRON, fork=True)
    assert supervisor.FORK_VARIABLE not in env  # a command that is no worker: started
    _close(commands)


@pytest.mark.parametrize("text", ["", "{}", "[]", '[{"argv": ["x"]}]', "[1]"])
def test_the_supervisor_refuses_what_orga_worker_did_not_write(text: str) -> None:
    with pytest.raises(ValueError, match=supervisor.COMMANDS_VARIABLE):
        supervisor.decode(text, ENVIRON)


def test_every_worker_gets_the_connection_urls_through_a_socket_of_its_own() -> None:
    """No worker's environment, nor the supervisor's, holds ORGA_REDIS_URL or ORGA_BROKER_URL
    (a password in them): each worker, tool workers too, reads them from its own socket."""
    environ = {
        **ENVIRON,
        "ORGA_REDIS_URL": "redis://:state-pw@h:6379/0",
        "ORGA_BROKER_URL": "redis://:broker-pw@b:6379/0",
    }
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=2), environ)
    _, env = supervisor_exec(commands, environ)
    try:
        assert [c.role for c in commands] == [Role.REASONING, Role.REASONING, Role.TOOLS]
        fds = [c.connection_fd for c in commands]
        assert None not in fds and len(set(fds)) == 3
        for command in commands:
            assert "pw@" not in "".join(command.env.values())
            assert not {"ORGA_REDIS_URL", "ORGA_BROKER_URL"} & set(command.env)
            assert command.connection_fd in command.pass_fds
            named = command.env[key_handoff.CONNECTION_FD_VARIABLE]
            assert named == str(command.connection_fd)
        assert "pw@" not in "".join(env.values())
        assert not {"ORGA_REDIS_URL", "ORGA_BROKER_URL"} & set(env)
        tool = commands[-1]
        assert tool.key_fd is None and tool.pass_fds == (tool.connection_fd,)
        received = key_handoff.received_connection_urls(dict(tool.env))
        assert received == {
            "ORGA_REDIS_URL": "redis://:state-pw@h:6379/0",
            "ORGA_BROKER_URL": "redis://:broker-pw@b:6379/0",
        }
    finally:
        for command in commands[:-1]:
            for fd in command.pass_fds:
                os.close(fd)
        if commands[-1].key_fd is not None:
            os.close(commands[-1].key_fd)


def _pool(argv: list[str]) -> str:
    return argv[argv.index("-P") + 1]


def test_the_tool_worker_runs_the_thread_pool_unless_prefork_is_asked() -> None:
    """The tool worker runs Celery's thread pool by default, ``ORGA_TOOL_POOL`` concurrency
    threads in one process (issue 27's memory); ``prefork`` is still one setting away, and an
    operator's ``-P`` wins over both. The reasoning workers keep their loop pool."""
    keyless = {k: v for k, v in ENVIRON.items() if k != "ORGA_API_KEY"}
    default = worker_commands(Role.ALL, _settings(), keyless)
    assert [_pool(c.argv) for c in default] == ["custom", "threads"]
    assert default[1].argv[default[1].argv.index("-c") + 1] == "2"
    prefork = worker_commands(Role.TOOLS, _settings(tool_pool="prefork"), keyless)
    assert [_pool(c.argv) for c in prefork] == ["prefork"]
    given = worker_commands(Role.TOOLS, _settings(), keyless, ["-P", "solo"])
    assert given[0].argv[-2:] == ["-P", "solo"]
    with pytest.raises(ValueError, match="tool_pool"):
        _settings(tool_pool="gevent")
    _close([*default, *prefork, *given])
