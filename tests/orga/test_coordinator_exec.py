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


def test_the_coordinator_does_not_import_from_the_working_directory(tmp_path: Path) -> None:
    """A ``shared`` package in the working directory is not the coordinator's ``shared``."""
    shadow = tmp_path / "shared"
    shadow.mkdir()
    marker = tmp_path / "imported"
    (shadow / "__init__.py").write_text(
        f"import pathlib, sys\npathlib.Path({str(marker)!r}).write_text('x')\nsys.exit(42)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ORGA_REDIS_URL": "redis://127.0.0.1:1/0",  # nothing listens: it stops at its start
    }
    env.pop("ORGA_METRICS_PORT", None)
    # -P: the command line itself does not look in the working directory (as the console
    # script `orga`, whose sys.path[0] is its bin directory); only what it runs could.
    done = subprocess.run(
        [sys.executable, "-P", "-m", "orga.cli", "coordinator"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not marker.exists(), (
        f"the coordinator imported {shadow} from its working directory "
        f"(exit {done.returncode}): {done.stdout[-300:]} {done.stderr[-300:]}"
    )
