"""The benchmark's Celery app: the orga worker, plus the no-op tool and a raw no-op task.

Start it exactly like the production worker, with this module as the app::

    ORGA_REDIS_URL=redis://... celery -A bench.noop_worker worker \\
        -Q orga.reasoning,orga.tools,bench.noop -c 2 --without-gossip --without-mingle

Everything else (JSON, late acknowledgement, prefetch of one, task events on unless
``ORGA_TASK_EVENTS=false``, the queues) is the production configuration of
:mod:`workers.celery`. Two additions only:

- ``noop`` and ``slow`` join the tool registry of every worker process (``orga_extra_tools``),
  so a task can call a tool that costs nothing, or one that takes a fixed time;
- ``bench.noop`` is a Celery task that does nothing and *stores its result* in a result
  backend on the same Redis, so a client can time a bare round trip (send, run, result back)
  with the same broker, worker and settings. The orga tasks keep ignoring results.
"""

from __future__ import annotations

from typing import Any

from bench.noop_tool import RAW_QUEUE, RAW_TASK_NAME, NoopTool, SlowTool
from workers.celery import app

__all__ = ["app", "noop"]

app.conf.orga_extra_tools = [NoopTool(), SlowTool()]
app.conf.result_backend = app.conf.broker_url
app.conf.task_routes = {**app.conf.task_routes, RAW_TASK_NAME: {"queue": RAW_QUEUE}}


@app.task(name=RAW_TASK_NAME, ignore_result=False)  # type: ignore[untyped-decorator]
def noop(*_: Any) -> None:
    """Nothing: the round trip is the measurement."""
