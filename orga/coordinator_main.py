"""``python -m orga.coordinator_main``: the coordinator process of a deployment, which ``orga
coordinator`` becomes once it has checked its settings (``execve``: the same process id).

The ``orga`` command line imports Typer, Rich, the HTTP API's client (httpx), the embedded
runtime and the workers' topology: about 6 MB that a coordinator, which runs for days, never
uses (issue 27, memory of the default deployment; docs/performance.md). This module imports
what the coordinator runs and nothing of the command line: its settings from the environment,
read once here, its Redis clients, the relay to the broker, the metrics endpoint when
``ORGA_METRICS_PORT`` is set, the webhooks' deliverer (and httpx) when ``ORGA_WEBHOOKS`` is.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import TYPE_CHECKING

from coordinator.liveness import LivenessSettings
from coordinator.logs import configure_logging
from coordinator.machine import MachineSettings
from coordinator.metrics import CoordinatorMetrics, serve_metrics
from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator, CoordinatorSettings
from orga.redis_client import RedisClients
from shared import aio
from shared.errors import OrgaError
from shared.redaction import Redactor, redact_url, secret_values
from shared.settings import OrgaSettings, TelemetrySettings
from workers.telemetry import configure_tracing

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from coordinator.webhooks import WebhookDeliverer

__all__ = ["ERROR_EXIT_CODE", "PROCESS_NAME", "coordinator_settings", "main", "webhook_deliverer"]

PROCESS_NAME = "orga-coordinator"
"""The process's name (``/proc/PID/comm``): its command line is the interpreter's."""

ERROR_EXIT_CODE = 1
"""The exit code of a coordinator refused at start (an ``OrgaError``: a cluster without
``ORGA_BROKER_URL``, a Redis that may evict keys, a tracing exporter that is not installed),
as ``orga coordinator``'s before it ran this module."""


def coordinator_settings(settings: OrgaSettings) -> CoordinatorSettings:
    """The coordinator's timings from the process settings."""
    return CoordinatorSettings(
        lease_ttl_s=settings.lease_ttl_s,
        partition_lease_ttl_s=settings.partition_lease_ttl_s,
        tick_interval_s=settings.tick_interval_s,
        claim_idle_ms=settings.claim_idle_ms,
        journal_maxlen=settings.journal_maxlen,
        events_maxlen=settings.events_maxlen,
        retention_s=settings.retention_s,
        partitions=settings.partitions,
        machine=MachineSettings(
            observation_deadline_s=settings.observation_deadline_s,
            max_redeliveries=settings.max_redeliveries,
            outage_deadline_s=settings.outage_deadline_s,
            outage_backoff_s=settings.outage_backoff_s,
            workspace_root=settings.workspace_root,
            allow_inline_tools=settings.allow_inline_tools,
            inline_read_tools=settings.inline_read_tools,
            chain_tools=settings.chain_tools,
            max_delegation_depth=settings.max_delegation_depth,
            max_children_per_task=settings.max_children_per_task,
            journal_redactor=Redactor(secret_values(settings)),
            liveness=LivenessSettings(
                heartbeat_timeout_s=settings.heartbeat_timeout_s,
                start_to_close_s=settings.start_to_close_s,
                heartbeat_interval_s=settings.heartbeat_interval_s,
            ),
        ),
    )


def webhook_deliverer(settings: OrgaSettings, redis: Redis) -> WebhookDeliverer | None:
    """The deliverer of ``ORGA_WEBHOOKS`` that runs next to a coordinator (None: none set)."""
    if not settings.webhooks:
        return None
    from coordinator.webhooks import WebhookDeliverer  # httpx: only where webhooks are set

    return WebhookDeliverer(
        redis,
        list(settings.webhooks),
        partitions=settings.partitions,
        deadline_s=settings.webhook_deadline_s,
        timeout_s=settings.webhook_timeout_s,
        claim_idle_ms=settings.webhook_claim_idle_ms,
        redactor=Redactor(secret_values(settings)),
    )


def main() -> int:
    """Run a coordinator against ``ORGA_REDIS_URL`` until SIGTERM; an ``OrgaError`` at start
    is said on stderr (``error: ...``), exit code :data:`ERROR_EXIT_CODE`."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(PROCESS_NAME)  # `ps -o comm`, `top`, `pgrep orga-coordinator` (Linux)
    settings = OrgaSettings()
    url = settings.redis_url
    if not url:
        sys.stderr.write("error: set ORGA_REDIS_URL (`orga coordinator` runs this module)\n")
        return ERROR_EXIT_CODE
    configure_logging(settings.log_level)
    try:
        configure_tracing(TelemetrySettings(), "orga-coordinator")
        clients = RedisClients.from_settings(settings)  # a cluster without a broker: refused
        metrics = _serve_metrics(settings, url, clients)
        aio.run(_run(settings, url, clients, metrics))  # a Redis that evicts keys: refused
    except OrgaError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return ERROR_EXIT_CODE
    return 0


def _serve_metrics(
    settings: OrgaSettings, url: str, clients: RedisClients
) -> CoordinatorMetrics | None:
    """The metrics endpoint on ``ORGA_METRICS_PORT`` (None: unset), with the queues' depths
    asked of the broker, whichever it is (``orga_queue_depth``)."""
    port, host = settings.metrics_port, settings.metrics_host
    if not port:
        return None
    depths = CeleryPublisher.from_settings(
        settings.model_copy(update={"redis_url": url}), broker_depths=True
    )
    return serve_metrics(
        port, url, host=host, partitions=settings.partitions, connect=clients.sync,
        queue_depths=depths,
    )  # fmt: skip


async def _run(
    settings: OrgaSettings, url: str, clients: RedisClients, metrics: CoordinatorMetrics | None
) -> None:
    client = clients.asyncio()
    node = Coordinator(
        client,
        settings=coordinator_settings(settings),
        metrics=metrics,
        publisher=CeleryPublisher.from_settings(settings.model_copy(update={"redis_url": url})),
    )
    where = (
        f", metrics on http://{settings.metrics_host}:{settings.metrics_port}/metrics"
        if metrics
        else ""
    )
    webhooks = webhook_deliverer(settings, client)
    if webhooks is not None:
        where += f", {len(settings.webhooks)} webhook(s)"
    print(f"coordinator {node.name} on {redact_url(url)}{where}", flush=True)
    # SIGTERM (systemd, Kubernetes): finish the batches in hand and hand the partitions
    # over at once (their leases released), instead of after ORGA_PARTITION_LEASE_TTL_S.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, node.stop)
    if webhooks is None:
        await node.run()
        return
    delivering = asyncio.create_task(webhooks.run())
    try:
        await node.run()
    finally:
        webhooks.stop()
        with contextlib.suppress(Exception):  # posts in flight stay pending for another
            await asyncio.wait_for(delivering, 5)


if __name__ == "__main__":
    sys.exit(main())
