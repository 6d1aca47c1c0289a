"""The Celery application: ``celery -A orga worker`` (both queues; ``-Q orga.reasoning`` or
``-Q orga.tools`` for one). Celery finds it as ``orga.celery:app``, the ``proj/celery.py``
layout; the tasks are :mod:`workers.tasks`'s, which this app includes.

Settings are read here, once, at the process edge, and so are the model keys a reasoning
worker is handed through a socket, and the connection URLs (``ORGA_REDIS_URL``,
``ORGA_BROKER_URL``, which may hold a password) every worker is handed through another
(:mod:`workers.key_handoff`). JSON is the only serializer; tasks are acknowledged late and
rejected (requeued) when their worker process dies; each process
prefetches one message; reasoning and tools have their own queues so each scales on its own.
The broker is ``ORGA_BROKER_URL`` (else ``ORGA_REDIS_URL``): on Redis, kombu's Redis transport
without ack emulation, as :mod:`workers.broker` configures it; on RabbitMQ, kombu's py-amqp
transport and quorum queues.
A worker refuses to start on a Redis that may evict keys (a bootstep of the worker's blueprint,
:class:`~workers.redis_policy.EvictionCheck`).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from typing import Any

from celery import Celery, platforms
from celery.concurrency.thread import TaskPool as ThreadTaskPool
from celery.signals import (
    after_setup_logger,
    celeryd_after_setup,
    worker_before_create_process,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from orga.redis_client import RedisClients
from shared import keys
from shared.errors import ConfigError
from shared.pricing import preload as preload_prices
from shared.settings import (
    OrgaSettings,
    TelemetrySettings,
    celery_broker_url,
    celery_config,
    is_amqp,
)
from workers import key_handoff
from workers.app_config import WorkerConfig, worker_config
from workers.app_config import register as register_worker_config
from workers.broker import serve_redis_urls
from workers.events import TaskEventWindows
from workers.redis_policy import EvictionCheck
from workers.runtime import deployment_mcp_servers
from workers.telemetry import check_exporters

__all__ = [
    "PER_TASK_LOGGERS",
    "app",
    "create_app",
    "quiet_per_task_loggers",
    "received_connection_urls",
    "received_model_keys",
]

PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "httpx")
"""Loggers that write a line at INFO for every task (received; succeeded or retried) or httpx
request (a tool's; the model calls' aiohttp logs none): quiet unless ``ORGA_LOG_EACH_TASK``
is set."""


def create_app(settings: OrgaSettings | None = None) -> Celery:
    """A Celery app configured from ``settings`` (read from the environment by default)."""
    settings = settings or OrgaSettings(**received_connection_urls())
    check_exporters(TelemetrySettings())  # a typo stops the worker now, not each dispatch
    deployment_mcp_servers(settings)  # so does a bad ORGA_MCP_SERVERS file
    if settings.redis_url is None:
        raise ConfigError(
            "ORGA_REDIS_URL is not set: the workers need the Redis that the coordinator uses "
            "(e.g. ORGA_REDIS_URL=redis://127.0.0.1:6379/0); `orga run` sets it for you"
        )
    broker_url = celery_broker_url(settings)  # refused on a cluster without ORGA_BROKER_URL
    celery = Celery("orga", include=["workers.tasks"])
    celery.conf.update(celery_config(settings, broker_url))
    # redis:// is workers.broker's transport (survives Redis out of memory); amqp:// is kombu's
    serve_redis_urls()
    if "visibility_timeout_s" in settings.model_fields_set and not is_amqp(broker_url):
        logging.getLogger("orga.worker.broker").warning(
            "broker.visibility_timeout_ignored: ORGA_VISIBILITY_TIMEOUT_S=%s has no effect: the"
            " Redis broker runs without kombu's ack emulation, and the coordinator re-sends a"
            " lost dispatch after ORGA_OBSERVATION_DEADLINE_S; remove the setting",
            settings.visibility_timeout_s,
        )
    celery.conf.worker_concurrency = settings.worker_concurrency
    # The workers' state clients (a RedisCluster on ORGA_REDIS_CLUSTER), built in their process.
    # Kept beside the app, not in app.conf: `celery inspect conf` shows app.conf uncensored,
    # and the settings' and clients' reprs show the Redis URL with its password.
    clients = RedisClients.from_settings(settings)
    register_worker_config(
        celery,
        WorkerConfig(settings, received_model_keys(), clients.asyncio, clients.sync),
    )
    celery.steps["worker"].add(EvictionCheck)
    # Task events go out once per window, flushed on the hub's own timer (workers.events).
    celery.steps["consumer"].add(TaskEventWindows)
    return celery


def received_model_keys() -> dict[str, str]:
    """The model keys this process was handed through the socket that
    ``ORGA_MODEL_KEYS_FD`` names (read once: the variable is removed), else none: a worker
    started by hand reads them from its environment (:class:`ProviderSettings`)."""
    fds = key_handoff.fds(os.environ)
    os.environ.pop(key_handoff.KEYS_FD_VARIABLE, None)
    if len(fds) > 1:
        raise ConfigError(
            f"{key_handoff.KEYS_FD_VARIABLE} names {len(fds)} sockets; a worker reads one: it "
            "is set by `orga worker` and `orga run`, start the worker with those"
        )
    try:
        return key_handoff.receive(fds[0]) if fds else {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the model keys could not be read: {exc}") from exc


def received_connection_urls() -> dict[str, Any]:
    """The connection URLs (``ORGA_REDIS_URL``, ``ORGA_BROKER_URL``) this process was handed
    through the socket ``ORGA_CONNECTION_FD`` names, as settings fields (read once: the
    variable is removed), else none: a worker started by hand reads them from its
    environment."""
    try:
        urls = key_handoff.received_connection_urls(os.environ)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the connection URLs could not be read: {exc}") from exc
    return {name.removeprefix("ORGA_").lower(): value for name, value in urls.items()}


app = create_app()


def quiet_per_task_loggers(settings: OrgaSettings) -> None:
    """Unless ``settings.log_each_task``, the :data:`PER_TASK_LOGGERS` log warnings and errors
    only (a failed task is still logged, by ``celery.app.trace`` at ERROR)."""
    level = logging.NOTSET if settings.log_each_task else logging.WARNING
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(level)


@after_setup_logger.connect  # type: ignore[untyped-decorator]
def _quiet_per_task_lines(**_: Any) -> None:
    quiet_per_task_loggers(worker_config(app).settings)


@worker_init.connect  # type: ignore[untyped-decorator]
def _load_prices(sender: Any = None, **_: Any) -> None:
    """In a worker that consumes the reasoning queue, the price table, loaded as the worker
    starts, not in its first model call (every model call is priced: ``orga_cost_usd``). A tool
    worker never prices a call: it does not load the table (about 5 MB)."""
    consumed = sender.app.amqp.queues.consume_from if sender is not None else None
    if not consumed or keys.reasoning_queue in consumed:
        preload_prices()


@worker_before_create_process.connect  # type: ignore[untyped-decorator]
def _share_with_pool_processes(**_: Any) -> None:
    """Just before a prefork pool process is forked: every object the parent holds moved to
    the collector's permanent generation (:func:`gc.freeze`), so that a collection in the child
    does not write to the pages it shares with the parent (Python's documented recipe for
    ``fork`` without ``exec``). Each pool process then pays for what it allocates itself, not
    for a copy of the parent's modules. The frozen objects are never collected: they are the
    modules and the app, which live as long as the process anyway. (No event loop is made in
    the parent to share its module: a libuv loop made before a fork is not the child's.)"""
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()


SIGHUP_EXIT_CODE = 1
"""The exit code of a worker stopped by SIGHUP (:func:`_stop_on_sighup`): not 0, so that a
service manager restarting on failure (systemd's ``Restart=on-failure``) starts it again."""
SIGHUP_MESSAGE = (
    "worker: SIGHUP: warm shutdown, exit code 1 (an orga worker does not restart itself: its "
    "connection URLs and model keys were read once from sockets that are closed now; its "
    "supervisor or service manager starts it again)\n"
)


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]
def _hold_sighup(**_: Any) -> None:
    """Block SIGHUP from here, before Celery installs its own handler (a restart that
    re-executes ``sys.argv``: in an orga worker, without the connection URLs, which were read
    once from a socket that is closed now), until :func:`_stop_on_sighup` replaces that
    handler: a SIGHUP sent while the worker starts waits for it, none is lost."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


@worker_ready.connect  # type: ignore[untyped-decorator]
def _stop_on_sighup(**_: Any) -> None:
    """SIGHUP to an orga worker is a warm shutdown (the running calls finish) with exit code
    :data:`SIGHUP_EXIT_CODE`, said on stderr, instead of Celery's restart in place (docs/deploy.md,
    "Signals"). Installed once the worker is ready, over Celery's handler; a SIGHUP held since
    :func:`_hold_sighup` is delivered to it now."""
    platforms.signals["SIGHUP"] = _on_sighup
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


def _on_sighup(_signum: int, _frame: Any) -> None:
    from celery.worker import state

    os.write(2, SIGHUP_MESSAGE.encode())
    state.should_stop = SIGHUP_EXIT_CODE


COLD_SHUTDOWN_MESSAGE = (
    "worker: cold shutdown (thread pool): the running calls are cancelled, their commands "
    "killed, their messages back in their queue\n"
)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _cold_shutdown_threads(sender: Any = None, **_: Any) -> None:
    """In a thread-pool worker (the default tool worker, ``ORGA_TOOL_POOL=threads``), SIGQUIT
    and a second SIGINT are a cold shutdown that stops the worker at once, as they do a
    prefork worker: Celery's own would kill the pool's processes, which a thread pool has not
    (its ``kill_job`` raises ``NotImplementedError``, and the worker then waits for the running
    calls, minutes for a long command). Here the running calls are cancelled on the process's
    event loop instead (:func:`workers.tasks.cancel_running_calls`: their launchers kill their
    commands), then the worker stops with Celery's cold-shutdown exit code (1). A prefork
    worker keeps Celery's handlers. Installed once the worker is ready, over Celery's."""
    if not isinstance(getattr(sender, "pool", None), ThreadTaskPool):
        return
    platforms.signals["SIGQUIT"] = _on_cold_shutdown
    celery_sigint = signal.getsignal(signal.SIGINT)

    def first_sigint(signum: int, frame: Any) -> None:
        # Celery's first SIGINT is a warm shutdown that installs its cold one for the second:
        # ours replaces it.
        try:
            if callable(celery_sigint):
                celery_sigint(signum, frame)
        finally:
            platforms.signals["SIGINT"] = _on_cold_shutdown

    platforms.signals["SIGINT"] = first_sigint


def _on_cold_shutdown(_signum: int, _frame: Any) -> None:
    from celery.worker import state

    from workers.tasks import cancel_running_calls

    os.write(2, COLD_SHUTDOWN_MESSAGE.encode())
    cancel_running_calls()
    state.should_terminate = platforms.EX_FAILURE


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _ignore_sighup_in_pool_process(**_: Any) -> None:
    """A prefork pool process ignores SIGHUP (Celery resets it to the default, which kills it:
    a terminal closed or a SIGHUP to the process group would end its call, to be delivered
    again); its main process decides (:func:`_stop_on_sighup`). Unblocked, as it was held
    while the pool was forked (:func:`_hold_sighup`); the commands' launcher restores the
    default for them.

    The process's services (:func:`workers.tasks.services`: its event loop thread, Redis
    client, tool registry, tracing) are not built here but by its first task, as in a
    thread-pool worker: a pool process that runs no tool call holds none of them (issue 27,
    about 5 MB of PSS per idle tool pool process, docs/performance.md)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop_services(**_: Any) -> None:
    """A process's services closed as it stops: a prefork pool process's as it exits
    (``worker_process_shutdown``); a worker's own (``worker_shutdown``, once its pool stopped
    and its running calls finished: a thread-pool tool worker's or a reasoning worker's; a
    prefork main process has none, and only flushes its tracing)."""
    from workers.tasks import close_services

    close_services()
