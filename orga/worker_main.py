"""``python -m orga.worker_main [options]``: ``celery -A orga worker [options]`` without
Celery's command-line group, which is what ``orga worker`` and ``orga run`` start.

``celery``'s command group imports every one of its subcommands (``amqp`` brings
``click_repl`` and ``prompt_toolkit``, ``shell``, ``multi``...) and every plugin of the
``celery.commands`` entry point group (Flower: tornado, humanize, its views): about 12 MB of
each worker's main process (docs/performance.md, issue 27) that a worker never uses. This runs
Celery's own ``worker`` command (:mod:`celery.bin.worker`, the same options, the same checks,
the same exit codes) on :data:`orga.celery.app`, as the group would after ``-A orga``. Options
of the group itself (``-b``, ``--config``, ``--workdir``...) are not taken: the orga settings
configure the app, and ``python -m celery -A orga worker`` still works for anything else.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

__all__ = ["PRELOAD", "PROG_NAME", "main", "preload"]

PROG_NAME = "celery -A orga worker"
"""What usage and error messages call the command (it is Celery's)."""

PRELOAD = (
    "celery.bin.worker",
    "celery.apps.worker",
    "celery.worker.consumer",
    "celery.concurrency.prefork",
    "celery.concurrency.thread",  # a tool worker's pool (ORGA_TOOL_POOL)
    # what Celery imports as the app is built and the worker starts, not at import
    "celery.app.amqp",
    "celery.app.control",
    "celery.app.events",
    "celery.app.log",
    "celery.app.routes",
    "celery.backends.base",
    "celery.events.state",
    "celery.fixups.django",
    "celery.worker.autoscale",
    "celery.worker.components",
    "celery.worker.consumer.delayed_delivery",
    "celery.worker.strategy",
    "kombu.mixins",
    "kombu.pidbox",
    "billiard.popen_fork",  # a tool worker's pool
    "billiard.sharedctypes",
    "billiard.synchronize",
    "certifi",  # the HTTP clients' TLS context
    "encodings.idna",
    "kombu.transport.redis",
    "orga.redis_client",
    "shared.aio",
    "shared.pricing",
    "shared.settings",
    "workers.app_config",
    "workers.broker",
    "workers.events",
    "workers.key_handoff",
    "workers.pool",
    "workers.redis_policy",
    "workers.tasks",
    "workers.telemetry",
)
"""What a worker of either role imports before its app exists: the modules
:func:`preload` imports in a supervisor that forks its workers (:mod:`orga.supervisor`).
Not :mod:`orga.celery`: importing it builds the app, which reads the process's settings and
its model keys, and those are each worker's own."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run Celery's ``worker`` command on the orga app with ``argv`` (``sys.argv[1:]``)."""
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    from orga.celery import app

    args = list(sys.argv[1:] if argv is None else argv)
    context = CLIContext(app=app, no_color=None, workdir=None, quiet=False)
    # standalone_mode: click turns usage errors into exit code 2 and the command's
    # ctx.exit(worker.exitcode) into a SystemExit, as `celery` does.
    worker.main(args=args, obj=context, prog_name=PROG_NAME, standalone_mode=True)
    return 0  # not reached: the command exits


def preload(prices: bool) -> None:
    """Import :data:`PRELOAD` (and load the price table when ``prices``: a reasoning worker
    loads it at its start) without building the app, so that workers forked afterwards share
    these modules' pages. Reads no setting, opens no connection, starts no thread."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    with contextlib.suppress(ImportError):  # the reasoning worker's loop, where installed
        importlib.import_module("uvloop")
    if prices:
        from shared.pricing import preload as preload_prices

        preload_prices()


if __name__ == "__main__":
    sys.exit(main())
