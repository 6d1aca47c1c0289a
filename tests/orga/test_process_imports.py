"""What each long-running process imports (issue 27: memory of the default deployment).

Every module a process imports stays in its memory for its whole life, in each of the seven
processes of ``orga worker`` and ``orga coordinator``. These tests import what each process
imports, in a fresh interpreter, and name the packages it must not: those it only needs for a
feature that loads them where it is used (the MCP SDK when a task declares an MCP server, the
HTTP API's FastAPI and sse-starlette in ``orga api``, the inbox's Jinja2 in ``orga inbox``,
Celery's command-line group and its Flower plugin nowhere, the price table in a reasoning
worker only). A change that imports one of them at module level again fails here, naming the
chain that imported it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

NEVER_IN_A_WORKER_OR_COORDINATOR = (
    "mcp",  # workers/tools/mcp.py imports the SDK when a task declares an MCP server
    "fastapi",  # orga api
    "sse_starlette",  # orga api
    "starlette",  # orga api, orga inbox
    "uvicorn",  # orga api, orga inbox
    "jinja2",  # orga inbox
    "flower",  # Celery's CLI group loads it as a plugin: orga.worker_main avoids the group
    "click_repl",  # celery.bin.amqp, imported by Celery's CLI group
    "prompt_toolkit",  # click_repl's
    "celery.bin.celery",  # the group itself
    "genai_prices",  # loaded when a call is priced (a reasoning worker, at its start)
    "httpx2",  # genai_prices's and the MCP SDK's HTTP client
)


def _imported(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after ``code`` (which prints nothing)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    environ.update(
        PYTHONPATH=str(REPO),
        ORGA_REDIS_URL="redis://127.0.0.1:1/0",  # the app is built, never connected
        **(env or {}),
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def _offending(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in banned if any(m == name or m.startswith(f"{name}.") for m in modules)
    )


def _why(code: str, package: str) -> str:
    """The import chain that brought ``package`` in (``python -X importtime``)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO), "ORGA_REDIS_URL": "redis://127.0.0.1:1/0"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in result.stderr.splitlines() if "|" in line]
    for index, line in enumerate(lines):
        name = line.rsplit("|", 1)[1]
        if name.strip() == package or name.strip().startswith(f"{package}."):
            depth = len(name) - len(name.lstrip())
            chain = [name.strip()]
            for later in lines[index + 1 :]:
                later_name = later.rsplit("|", 1)[1]
                later_depth = len(later_name) - len(later_name.lstrip())
                if later_depth < depth:
                    chain.append(later_name.strip())
                    depth = later_depth
            return " <- ".join(chain)
    return "(not found by -X importtime)"


@pytest.mark.parametrize(
    ("process", "code"),
    [
        # what `python -m orga.worker_main` imports before Celery's worker starts: the app and
        # its tasks (both queues), and Celery's worker command
        (
            "worker",
            "import orga.worker_main, orga.celery, workers.tasks, celery.bin.worker",
        ),
        # what `orga coordinator` becomes (execve): the coordinator's modules, and the
        # webhooks' deliverer, imported where ORGA_WEBHOOKS is set
        (
            "coordinator",
            "import orga.coordinator_main, coordinator.webhooks",
        ),
    ],
)
def test_a_long_running_process_imports_no_feature_it_does_not_use(process: str, code: str) -> None:
    modules = _imported(code)
    found = _offending(modules, NEVER_IN_A_WORKER_OR_COORDINATOR)
    assert not found, (
        f"the {process} process imports {found} at start: "
        + "; ".join(f"{name}: {_why(code, name)}" for name in found)
        + ". Import it where it is used (docs/performance.md, issue 27)"
    )


def test_the_coordinator_runs_without_the_command_line() -> None:
    """``orga coordinator`` runs :mod:`orga.coordinator_main` in its place: none of the command
    line's packages (Typer, Rich), and no httpx unless ORGA_WEBHOOKS is set."""
    modules = _imported("import orga.coordinator_main")
    found = _offending(modules, ("typer", "rich", "httpx", "orga.cli", "orga.embedded"))
    assert not found, "; ".join(
        f"{name}: {_why('import orga.coordinator_main', name)}" for name in found
    )


def test_the_coordinator_imports_jsonschema_only_when_it_checks_an_edited_call() -> None:
    """jsonschema (with attrs, referencing and its metaschemas, about 4 MB) checks a reviewer's
    edit of a held call (:func:`shared.approval.check_arguments`): not imported at start."""
    code = "import orga.coordinator_main"
    found = _offending(_imported(code), ("jsonschema", "attrs", "referencing"))
    assert not found, "; ".join(f"{name}: {_why(code, name)}" for name in found)


def test_the_supervisor_imports_the_standard_library_only() -> None:
    modules = _imported("import orga.supervisor")
    ours = {m.split(".")[0] for m in modules} & {"shared", "workers", "coordinator", "celery"}
    assert not ours
    assert "pydantic" not in modules


def _worker_init(queues: str) -> set[str]:
    """The modules after the app's ``worker_init`` handlers ran for a worker of ``queues``."""
    code = (
        "from celery.signals import worker_init\n"
        "from orga.celery import app\n"
        f"app.amqp.queues.select({queues!r}.split(','))\n"
        "class Worker:\n"
        "    pass\n"
        "sender = Worker()\n"
        "sender.app = app\n"
        "worker_init.send(sender=sender)\n"
    )
    return _imported(code)


def test_a_tool_worker_does_not_load_the_price_table() -> None:
    assert "genai_prices" not in _worker_init("orga.tools")


def test_a_reasoning_worker_loads_the_price_table_as_it_starts() -> None:
    """Every model call is priced (``orga_cost_usd``), so the table is loaded before the
    first one, not in it."""
    assert "genai_prices" in _worker_init("orga.reasoning")
    assert "genai_prices" in _worker_init("orga.reasoning,orga.tools")


def test_a_pool_process_is_forked_from_a_frozen_parent() -> None:
    """Before a prefork pool process is forked, the parent's objects are frozen (no
    collection in the child writes to the pages it shares with its parent)."""
    code = (
        "import gc, sys\n"
        "from celery.signals import worker_before_create_process\n"
        "import orga.celery\n"
        "assert gc.get_freeze_count() == 0\n"
        "worker_before_create_process.send(sender=None)\n"
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()\n"
    )
    _imported(code)
