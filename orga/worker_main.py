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

import sys
from collections.abc import Sequence

__all__ = ["PROG_NAME", "main"]

PROG_NAME = "celery -A orga worker"
"""What usage and error messages call the command (it is Celery's)."""


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


if __name__ == "__main__":
    sys.exit(main())
