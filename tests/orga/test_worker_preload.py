"""What ``orga worker``'s supervisor imports before it forks the workers
(:func:`orga.worker_main.preload`): every worker inherits what those imports leave behind, so
they must leave modules only: no thread, no open file or socket, no Celery app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, os, sys, threading
def fds():
    return sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
before = fds()
from orga import worker_main
worker_main.preload(prices=True)
print(json.dumps({
    "threads": [t.name for t in threading.enumerate()],
    "new_fds": [fd for fd in fds() if fd not in before],
    "app": "orga.celery" in sys.modules,
    "imported": [m for m in worker_main.PRELOAD if m not in sys.modules],
}))
"""


def test_the_preload_leaves_modules_only() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    environ.update(PYTHONPATH=str(REPO), CELERY_CUSTOM_WORKER_POOL="workers.pool:LoopPool")
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=environ, cwd=REPO, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    found = json.loads(out.splitlines()[-1])
    assert found["threads"] == ["MainThread"]
    assert found["new_fds"] == []  # the descriptors listdir opened are closed again
    assert found["app"] is False  # the app reads each worker's settings and keys: not here
    assert found["imported"] == []
