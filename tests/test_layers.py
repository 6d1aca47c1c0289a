"""The layer rule of docs/architecture.md §1, read from the source with ``ast`` (nothing is
imported): ``shared`` imports none of the other packages and no Celery, Redis or network
client; the coordinator never imports the workers; neither imports the process assembly,
``orga``; inside the coordinator only the transport modules import Celery or kombu."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

NETWORK = ("socket", "ssl", "http.client", "http.server", "urllib.request", "requests", "aiohttp")
"""Network clients and servers of the standard library and the usual packages."""
OUR_OTHER_PACKAGES = ("coordinator", "workers", "orga")
BROKER = ("celery", "kombu", "billiard")
TRANSPORT_MODULES = frozenset({"coordinator.transport", "coordinator.relay"})
"""The coordinator's transport: the modules behind :class:`coordinator.transport.Transport`."""


@dataclass(frozen=True, slots=True)
class Rule:
    """Modules of ``package`` (but those in ``exempt``) import none of ``forbidden`` (a name
    and its submodules); ``why`` is the rule as the docs state it."""

    package: str
    forbidden: tuple[str, ...]
    why: str
    exempt: frozenset[str] = frozenset()


RULES = (
    Rule(
        "shared",
        (*OUR_OTHER_PACKAGES, *BROKER, "redis", "httpx", "starlette", "uvicorn", *NETWORK),
        "shared/ holds what both processes agree on, the wire models and pure primitives: it "
        "imports no other package of ours, no Celery, no Redis and no network client",
    ),
    Rule(
        "coordinator",
        ("workers", "orga"),
        "the coordinator never imports worker code (it sends tasks by name) nor the process "
        "assembly in orga/, which imports it",
    ),
    Rule(
        "coordinator",
        BROKER,
        "inside the coordinator only the transport modules (behind coordinator.transport's "
        "Transport) import Celery or kombu; declare a new one in TRANSPORT_MODULES",
        exempt=TRANSPORT_MODULES,
    ),
    Rule(
        "workers",
        ("coordinator", "orga"),
        "the workers never import the coordinator nor the process assembly in orga/, which "
        "imports them (the Celery app is orga.celery; workers.tasks are shared tasks)",
    ),
)
"""The layers. ``orga`` (process assembly) may import every other package."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One forbidden import: where, what, and the rule it breaks."""

    path: Path
    line: int
    module: str
    imported: str
    rule: Rule

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.module} imports {self.imported!r}, forbidden in "
            f"{self.rule.package}/: {self.rule.why}"
        )


def module_name(path: Path, root: Path) -> str:
    """``coordinator/inbox/app.py`` → ``coordinator.inbox.app``; a package is its folder."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """Every module name ``tree`` imports, with its line: ``import``, ``from`` (relative ones
    resolved, and ``from a import b`` also as ``a.b``, which may be a module), at any depth
    (functions, ``if TYPE_CHECKING``), and ``importlib.import_module`` / ``__import__`` of a
    constant name."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _absolute(name: str | None, level: int, package: str) -> str:
    if level == 0:
        return name or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*base, name] if name else base)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _matches(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(f"{forbidden}.")


def violations(root: Path, rules: tuple[Rule, ...] = RULES) -> tuple[list[Violation], int]:
    """The forbidden imports under ``root``, and how many modules were read."""
    found: list[Violation] = []
    read = 0
    for rule in rules:
        for path in sorted((root / rule.package).rglob("*.py")):
            module = module_name(path, root)
            if module in rule.exempt:
                continue
            read += 1
            tree = ast.parse(path.read_bytes(), filename=str(path))
            seen: set[tuple[int, str]] = set()
            for line, name in imported_names(tree, module, path.name == "__init__.py"):
                bad = next((f for f in rule.forbidden if _matches(name, f)), None)
                if bad is not None and (line, bad) not in seen:
                    seen.add((line, bad))
                    found.append(Violation(path.relative_to(root), line, module, name, rule))
    return found, read


def test_no_module_imports_across_the_layers() -> None:
    """Every module of shared/, coordinator/ and workers/ keeps the layer rule (names the
    module, the line and the rule otherwise)."""
    found, read = violations(ROOT)
    assert read > 100, f"only {read} modules read under {ROOT}: is the package tree there?"
    assert not found, "forbidden imports:\n" + "\n".join(map(str, found))


def _plant(root: Path, relative: str, source: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


@pytest.mark.parametrize(
    ("relative", "source", "line", "imported"),
    [
        ("coordinator/bad.py", "import os\nfrom workers.tasks import handle\n", 2, "workers.tasks"),
        ("coordinator/sub/bad.py", "import workers\n", 1, "workers"),
        ("coordinator/bad.py", "from orga import cli\n", 1, "orga"),
        (
            "coordinator/bad.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workers import x\n",
            3,
            "workers",
        ),
        (
            "coordinator/bad.py",
            "def f():\n    import importlib\n    return importlib.import_module('workers.x')\n",
            3,
            "workers.x",
        ),
        ("coordinator/service2.py", "from celery import Celery\n", 1, "celery"),
        ("workers/bad.py", "from coordinator.store import TaskStore\n", 1, "coordinator.store"),
        ("workers/bad.py", "from orga.celery import app\n", 1, "orga.celery"),
        ("workers/tools/bad.py", "from ...orga import celery\n", 1, "orga"),
        ("shared/bad.py", "import redis.asyncio\n", 1, "redis.asyncio"),
        ("shared/bad.py", "from urllib import request\n", 1, "urllib.request"),
        ("shared/bad.py", "from . import coordinator_like\nimport httpx\n", 2, "httpx"),
    ],
)
def test_the_checker_catches_a_planted_forbidden_import(
    tmp_path: Path, relative: str, source: str, line: int, imported: str
) -> None:
    """A forbidden import planted in a temporary tree is reported with its module, line and
    rule; the allowed imports beside it are not."""
    _plant(tmp_path, relative, source)
    _plant(tmp_path, "shared/fine.py", "import json\nfrom urllib.parse import quote\n")
    _plant(tmp_path, "coordinator/relay.py", "from celery import Celery\n")
    _plant(tmp_path, "workers/fine.py", "from shared import keys\nfrom celery import Celery\n")
    _plant(tmp_path, "orga/fine.py", "import coordinator\nimport workers\n")

    found, _read = violations(tmp_path)

    assert [(str(v.path), v.line, v.imported) for v in found] == [(relative, line, imported)]
    message = str(found[0])
    assert relative in message and f":{line}:" in message
    assert found[0].rule.why in message
