"""Which workers ``orga worker`` starts, and how the supervisor gets their commands."""

from __future__ import annotations

import pytest

from shared.settings import OrgaSettings
from workers import supervisor
from workers.topology import POOL_PATH, Role, supervisor_exec, worker_commands

ENVIRON = {"PATH": "/usr/bin", "ORGA_API_KEY": "sk-very-secret", "ORGA_REDIS_URL": "redis://x"}


def _settings(**values: object) -> OrgaSettings:
    return OrgaSettings.model_validate(values)


def _queue(argv: list[str]) -> str:
    return argv[argv.index("-Q") + 1]


def _name(argv: list[str]) -> str | None:
    return argv[argv.index("-n") + 1] if "-n" in argv else None


def test_all_starts_the_reasoning_processes_and_one_tool_worker() -> None:
    commands = worker_commands(Role.ALL, _settings(), ENVIRON)
    roles = [c.role for c in commands]
    assert roles == [Role.REASONING, Role.REASONING, Role.TOOLS]
    names = [_name(c.argv) for c in commands]
    assert len(set(names)) == 3, names
    assert all(n is not None and n.endswith("@%h") for n in names)
    reasoning, tools = commands[0], commands[2]
    assert _queue(reasoning.argv) == "orga.reasoning"
    assert reasoning.env["CELERY_CUSTOM_WORKER_POOL"] == POOL_PATH
    assert reasoning.env["ORGA_API_KEY"] == "sk-very-secret"
    assert _queue(tools.argv) == "orga.tools"
    assert "ORGA_API_KEY" not in tools.env


def test_one_reasoning_process_keeps_the_names_of_before() -> None:
    commands = worker_commands(Role.ALL, _settings(reasoning_processes=1), ENVIRON)
    assert [c.role for c in commands] == [Role.REASONING, Role.TOOLS]
    assert [(_name(c.argv) or "").split("-")[0] for c in commands] == ["reasoning", "tools"]
    single = worker_commands(Role.REASONING, _settings(reasoning_processes=1), ENVIRON, name="r@h")
    assert [_name(c.argv) for c in single] == ["r@h"]


def test_the_reasoning_role_starts_as_many_processes_as_asked() -> None:
    commands = worker_commands(Role.REASONING, _settings(reasoning_processes=3), ENVIRON)
    assert [c.role for c in commands] == [Role.REASONING] * 3
    assert len({_name(c.argv) for c in commands}) == 3
    embedded = worker_commands(Role.ALL, _settings(), ENVIRON, prefix="embedded-")
    assert all((_name(c.argv) or "").startswith("embedded-") for c in embedded)


def test_the_supervisor_gets_the_commands_but_no_secret() -> None:
    commands = worker_commands(Role.ALL, _settings(), ENVIRON)
    argv, env = supervisor_exec(commands, ENVIRON)
    assert argv[1:] == ["-m", "workers.supervisor"]
    handed = env[supervisor.COMMANDS_VARIABLE]
    assert "sk-very-secret" not in handed
    children = supervisor.decode(handed, env)
    assert [c.argv for c in children] == [c.argv for c in commands]
    assert [c.env for c in children] == [c.env for c in commands]
    assert all(supervisor.COMMANDS_VARIABLE not in c.env for c in children)


@pytest.mark.parametrize("text", ["", "{}", "[]", '[{"argv": ["x"]}]', "[1]"])
def test_the_supervisor_refuses_what_orga_worker_did_not_write(text: str) -> None:
    with pytest.raises(ValueError, match=supervisor.COMMANDS_VARIABLE):
        supervisor.decode(text, ENVIRON)
