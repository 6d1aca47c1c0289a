"""``orga coordinator`` runs ``python -P -m orga.coordinator_main`` in its place (execve).

``python -m`` puts the working directory first on ``sys.path``; the ``orga`` console script
does not. Run from a directory that holds a package named like one of the project's top-level
packages (``shared``, ``workers``, ``coordinator``: common names), the coordinator would run
that directory's code instead of the installed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tripwire(module: Path, marker: Path) -> None:
    """Write ``module``, which records the command line that imported it in ``marker`` and
    exits 42."""
    module.write_text(
        f"import pathlib, sys\npathlib.Path({str(marker)!r}).write_text(' '.join(sys.orig_argv))\n"
        "sys.exit(42)\n"
    )


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``cwd`` against a Redis where nothing listens: it stops at its start."""
    env = {**env, "ORGA_REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("ORGA_METRICS_PORT", None)
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_coordinator_does_not_import_from_the_working_directory(tmp_path: Path) -> None:
    """A ``shared`` package in the working directory is not the coordinator's ``shared``."""
    shadow = tmp_path / "shared"
    shadow.mkdir()
    marker = tmp_path / "imported"
    _tripwire(shadow / "__init__.py", marker)
    # -P: the command line itself does not look in the working directory (as the console
    # script `orga`, whose sys.path[0] is its bin directory); only what it runs could.
    done = _run(
        [sys.executable, "-P", "-m", "orga.cli", "coordinator"],
        tmp_path,
        {**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert not marker.exists(), (
        f"the coordinator imported {shadow} from its working directory "
        f"(exit {done.returncode}): {done.stdout[-300:]} {done.stderr[-300:]}"
    )


def test_an_installed_coordinator_keeps_the_standard_library_first(tmp_path: Path) -> None:
    """Installed (``pip install``: the project's packages in site-packages, next to every other
    distribution's), the directory ``orga`` came from is site-packages: first on PYTHONPATH it
    goes before the standard library, so any installed module named like a standard one (the
    PyPI backports ``asyncio``, ``pathlib``, ``typing``, ``enum34``...) replaces it in the
    coordinator alone. Here site-packages is a copy of the project's packages and a ``json``
    module; it is on ``sys.path`` after the standard library, as site-packages is."""
    import shutil

    site = tmp_path / "site-packages"
    for package in ("orga", "shared", "coordinator", "workers"):
        shutil.copytree(
            REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    marker = tmp_path / "imported"
    _tripwire(site / "json.py", marker)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    start = (
        f"import sys; sys.path.append({str(site)!r}); sys.argv = ['orga', 'coordinator']; "
        "from orga.cli import main; main()"
    )
    done = _run([sys.executable, "-P", "-c", start], tmp_path, env)
    assert not marker.exists(), (
        f"{marker.read_text()!r} imported {site / 'json.py'} in place of the standard library's "
        f"json (exit {done.returncode}): {done.stdout[-300:]} {done.stderr[-300:]}"
    )
