"""Process settings, read once from the environment (prefix ``ORGA_``) at the process edge.

Library code never reads ``os.environ``: the CLI, the Celery app and the coordinator build one
:class:`OrgaSettings` and pass it down. Defaults are the production values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared import keys
from shared.errors import ConfigError
from shared.webhooks import WebhookSubscription

__all__ = [
    "AMQP_SCHEMES",
    "BROKER_SOCKET_TIMEOUT_S",
    "OrgaSettings",
    "TelemetrySettings",
    "celery_broker_url",
    "celery_config",
    "is_amqp",
    "node_urls",
]


class OrgaSettings(BaseSettings):
    """Runtime settings of the coordinator, the workers and the CLI.

    A validation error names the field (``max_redeliveries`` for ``ORGA_MAX_REDELIVERIES``:
    the variable is ``ORGA_`` and the field's name in capitals) and what is wrong, never the
    value given: a URL (``ORGA_WEBHOOKS``' entries, ``ORGA_REDIS_URL``) may carry a password
    or a token, and the process prints the error at start. pydantic-settings names the
    variable only for a field given an alias (``validation_alias``), which would also change
    how the settings are built by name, so the field's name it is."""

    model_config = SettingsConfigDict(env_prefix="ORGA_", extra="ignore", hide_input_in_errors=True)

    redis_url: str | None = Field(
        default=None,
        description="Redis for state, streams and the Celery broker; unset: `orga run` starts "
        "a private one",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery's broker, when it is not ORGA_REDIS_URL: another Redis "
        "(`redis://`, `rediss://`) or RabbitMQ (`amqp://`, `amqps://`, `pyamqp://`; the queues "
        "are quorum queues)",
    )
    redis_cluster: bool = Field(
        default=False,
        description="ORGA_REDIS_URL names a node of a Redis Cluster (the others are "
        "discovered; several comma-separated survive one being down at start); needs "
        "ORGA_PARTITIONS > 1 to spread the state and ORGA_BROKER_URL (Celery cannot use a "
        "cluster as its broker)",
    )
    workspace_root: str = Field(
        default_factory=lambda: str(Path.home() / ".orga" / "workspaces"),
        description="Where tasks without an explicit workspace get theirs (one folder per task)",
    )
    observation_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="When the coordinator first looks at an unanswered dispatch, and how often "
        "after that: it is re-sent only when its worker stopped heartbeating, or when it never "
        "started and is no longer queued (docs/deploy.md, Deadlines)",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, description="How often a worker says the calls it runs are alive"
    )
    heartbeat_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A started call whose worker has been silent this long is lost and re-sent",
    )
    start_to_close_s: float = Field(
        default=900.0,
        gt=0,
        description="A started call still running after this long is abandoned and re-sent",
    )
    max_redeliveries: int = Field(default=3, ge=0)
    outage_deadline_s: float = Field(
        default=1800.0,
        ge=0,
        description="How long a task waits out an outage of its model's provider or its policy "
        "engine (reported by a worker once its own retries are spent), re-sending the call "
        "with back-off and using up no attempt, before it fails naming the outage",
    )
    outage_backoff_s: float = Field(
        default=15.0,
        gt=0,
        description="The first wait before a call held for an outage is sent again (then "
        "doubling, at most 300 s)",
    )
    lease_ttl_s: float = Field(default=float(keys.lease_ttl_s), gt=0)
    partition_lease_ttl_s: float = Field(
        default=float(keys.partition_lease_ttl_s),
        gt=0,
        description="A coordinator renews its partition leases every third of this; a dead "
        "coordinator's partitions are taken over this long after its last renewal",
    )
    tick_interval_s: float = Field(default=0.5, gt=0)
    claim_idle_ms: int = Field(default=30_000, ge=100)
    visibility_timeout_s: int = Field(
        default=3600,
        description="Deprecated, no effect: the workers' Redis broker runs without kombu's ack "
        "emulation, so there is no visibility timeout; the coordinator re-sends a lost dispatch "
        "(ORGA_OBSERVATION_DEADLINE_S). Accepted so that existing deployments still start; a "
        "worker started with it set logs `broker.visibility_timeout_ignored`",
    )
    journal_maxlen: int = Field(default=10_000, ge=100)
    events_maxlen: int = Field(default=100_000, ge=1000)
    worker_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Overrides the concurrency of a worker of any role (`-c` wins over it)",
    )
    reasoning_concurrency: int = Field(
        default=200,
        ge=1,
        description="Model calls one reasoning worker process holds in flight (asyncio tasks on "
        "one event loop; each waiting call costs its request, not a thread or a process)",
    )
    reasoning_processes: int = Field(
        default=1,
        ge=1,
        description="Reasoning worker processes `orga worker` starts (for --role all or "
        "reasoning, and the embedded runtime): each holds ORGA_REASONING_CONCURRENCY calls in "
        "flight on one event loop and can use one CPU; one by default (200 calls in flight at "
        "2.5 to 3 ms of its CPU each), more when its CPU saturates (docs/deploy.md)",
    )
    worker_fork: bool = Field(
        default=True,
        description="`orga worker` starting several workers forks them from its supervisor, "
        "which imported their modules first, so they share those pages (issue 27's memory); "
        "false: each is a `python -m orga.worker_main` process of its own",
    )
    tool_concurrency: int = Field(
        default=2,
        ge=1,
        description="Tool calls one tool worker runs at once (threads of its one process; "
        "prefork: one process each)",
    )
    tool_pool: Literal["threads", "prefork"] = Field(
        default="threads",
        description="The Celery pool of the tool worker `orga worker` starts (`-P`): threads, "
        "one process whose ORGA_TOOL_CONCURRENCY threads hand each call to its event loop (a "
        "call's work is a command's processes or a worker thread either way); prefork, one "
        "process per call, for tools that burn CPU in Python or may crash the interpreter (a "
        "pool process that dies is replaced, the tool worker stays up); about 35 MB more",
    )
    http_max_connections: int = Field(
        default=512,
        ge=1,
        description="Connections one worker process keeps to each model endpoint (host and "
        "port), in its one aiohttp session (workers/http_pool.py)",
    )
    metrics_port: int | None = Field(default=None, description="Prometheus endpoint port")
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the Prometheus endpoint binds (0.0.0.0: every interface)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    task_events: bool = Field(
        default=True,
        description="Workers send Celery task events (as with `-E`), which Flower needs to "
        "list tasks and show their runtimes; false saves the events' broker messages, about "
        "1.5 ms of CPU per model call (`make bench` measures it; docs/performance.md)",
    )
    inline_dispatch: bool = Field(
        default=True,
        description="When the broker is the state Redis (no ORGA_BROKER_URL of its own), the "
        "coordinator's commit pushes each dispatch onto its Celery queue itself, in the script "
        "that writes the state awaiting it, instead of through the outbox and its relay: one "
        "Redis command and the relay's send less per model call (docs/performance.md); false: "
        "through the outbox, as with any other broker",
    )
    log_each_task: bool = Field(
        default=False,
        description="Workers log Celery's two INFO lines per task (received, succeeded or "
        "retried) and httpx's one per tool HTTP request; off, those loggers log warnings and "
        "errors only (a failed task is still logged): the lines cost about 0.3 ms of CPU per "
        "model call (docs/performance.md)",
    )
    allow_private_network: bool = Field(
        default=False,
        description="Let web_fetch, and the MCP servers over HTTP that tasks declare, reach "
        "loopback and private addresses",
    )
    mcp_servers: Path | None = Field(
        default=None,
        description="A JSON or YAML file of MCP servers every task may use (a list of "
        "`{name, command, env, cwd}` or `{name, url, headers}`); read by the workers at start",
    )
    mcp_idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A task's MCP server process or HTTP session unused this long is closed "
        "once its task is no longer active (a later call starts it again)",
    )
    mcp_list_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a reasoning worker waits for a tool worker to start a task's "
        "MCP servers and list their tools",
    )
    allow_inline_tools: bool = Field(
        default=True,
        description="Honour `tool_dispatch: inline` (tools then run in the reasoning worker, "
        "next to the model key); false sends every call to the tools queue",
    )
    inline_read_tools: bool = Field(
        default=True,
        description="Reasoning workers run an iteration's calls themselves when every one is "
        "of a read-only tool (file_read, file_list, recall_knowledge) and the task has "
        "`tool_dispatch: auto` (the default): one Celery task per iteration instead of two. "
        "Those tools run no code and write nothing; false sends them to the tools queue",
    )
    chain_tools: bool = Field(
        default=True,
        description="Reasoning workers send an iteration's approved calls straight to the tools "
        "queue, with the observation that lists them (one coordinator step less per "
        "iteration); false: the coordinator dispatches every call",
    )
    stream_tokens: bool = Field(
        default=False,
        description="Reasoning workers ask the model for a streamed answer and publish its text "
        "as it comes to the task's tokens stream (`orga run`, `orga journal --follow`, the "
        "inbox and the API's events show it); it about doubles the runtime's CPU per model "
        "call (docs/performance.md), so a deployment opts in; `orga run` on the embedded "
        "runtime streams unless this is set to false",
    )
    max_delegation_depth: int = Field(
        default=3,
        ge=0,
        description="How deep sub-agents nest: a task's children are at depth 1, theirs at 2; a "
        "delegate call that would go deeper gets a tool error (0: no delegation)",
    )
    max_children_per_task: int = Field(
        default=10,
        ge=0,
        description="How many sub-agent tasks one task may create in its life; a delegate call "
        "past it gets a tool error",
    )
    allow_task_base_url: bool = Field(
        default=False,
        description="Let a task's provider.base_url replace ORGA_BASE_URL (the API key is sent "
        "there, so only for trusted submitters)",
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Partitions of the deployment's state (each task's keys carry its "
        "partition's hash tag); fixed when the deployment is created: every process must be "
        "started with the same number",
    )
    retention_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=60,
        description="Finished tasks (state, journal) are deleted this long after they end",
    )
    inbox_token: SecretStr | None = Field(
        default=None,
        description="`orga inbox`: reviewers log in with this token (or send it as "
        "`Authorization: Bearer TOKEN`); the inbox refuses to start without it or "
        "ORGA_INBOX_BASIC_AUTH",
    )
    inbox_basic_auth: SecretStr | None = Field(
        default=None,
        description="`orga inbox`: HTTP basic auth accounts, `user:password` separated by commas; "
        "the user name is recorded as who decided a review",
    )
    inbox_secret: SecretStr | None = Field(
        default=None,
        description="`orga inbox`: signs its session and CSRF cookies; unset: a random one per "
        "process (reviewers log in again after a restart; set it when several inbox processes "
        "serve one address)",
    )
    inbox_secure_cookies: Literal["auto"] | bool = Field(
        default="auto",
        description="`orga inbox`: mark its cookies `Secure` (sent over HTTPS only): `auto`, "
        "when the request came over HTTPS (uvicorn's TLS, or `X-Forwarded-Proto` from a proxy "
        "in uvicorn's FORWARDED_ALLOW_IPS); `true` always (behind a TLS proxy uvicorn does not "
        "trust); `false` never",
    )
    api_tokens: SecretStr | None = Field(
        default=None,
        description="`orga api`: bearer tokens it accepts (`Authorization: Bearer TOKEN`), "
        "separated by commas, each of 16 characters or more; the API refuses to start without",
    )
    webhooks: list[WebhookSubscription] = Field(
        default_factory=list,
        description="Webhooks (JSON): a list of {url, events: [review_opened, task_finished, "
        "task_failed, budget_exhausted], secret?}; the coordinators post each event, signed "
        "with HMAC-SHA256 when a secret is given",
    )
    webhook_deadline_s: float = Field(
        default=3600.0,
        gt=0,
        description="A webhook post not accepted (2xx) within this time of its event is "
        "dead-lettered to the partition's dead-letter stream",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, description="One webhook post's timeout (connect, send and answer)"
    )
    webhook_claim_idle_ms: int = Field(
        default=60_000,
        ge=100,
        description="A webhook post left pending this long by a coordinator that stopped is "
        "taken over by another (or by itself, restarted)",
    )

    @model_validator(mode="after")
    def _leases_renewed_in_time(self) -> OrgaSettings:
        """The partition leases are renewed every third of their TTL, checked each tick: a
        tick as long as that third would let a live coordinator's leases lapse."""
        ttl, tick = self.partition_lease_ttl_s, self.tick_interval_s
        if ttl <= 3 * tick:
            raise ValueError(
                f"ORGA_PARTITION_LEASE_TTL_S={ttl:g} must be more than 3 x "
                f"ORGA_TICK_INTERVAL_S={tick:g} (the leases are renewed every third of their "
                f"TTL, checked each tick): raise ORGA_PARTITION_LEASE_TTL_S above {3 * tick:g} "
                "or lower ORGA_TICK_INTERVAL_S"
            )
        return self


class TelemetrySettings(BaseSettings):
    """OpenTelemetry's standard variables, read at the process edge (``OTEL_*``).

    ``OTEL_TRACES_EXPORTER`` lists the exporters (``console``, ``otlp``, ``none``); without it
    spans go to OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces variant) is set,
    and nowhere otherwise. The OTLP exporter reads its own variables (headers, timeout).
    """

    model_config = SettingsConfigDict(env_prefix="OTEL_", extra="ignore")

    traces_exporter: str | None = None
    exporter_otlp_endpoint: str | None = None
    exporter_otlp_traces_endpoint: str | None = None
    service_name: str | None = None
    sdk_disabled: bool = False
    instrumentation_genai_capture_message_content: bool = False
    """``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``: the GenAI spans carry the
    messages, tool arguments and results (off: names, models and token counts only)."""

    def exporters(self) -> list[str]:
        """The exporters to build, in order (empty: tracing stays a no-op)."""
        if self.sdk_disabled:
            return []
        if self.traces_exporter is not None:
            names = [n.strip().lower() for n in self.traces_exporter.split(",") if n.strip()]
            return [n for n in names if n != "none"]
        endpoint = self.exporter_otlp_traces_endpoint or self.exporter_otlp_endpoint
        return ["otlp"] if endpoint else []


BROKER_SOCKET_TIMEOUT_S = 30.0
"""How long one broker command may wait for Redis before it fails (and is retried)."""


AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})
"""Broker URL schemes that mean RabbitMQ (kombu's py-amqp transport)."""


def is_amqp(broker_url: str) -> bool:
    """Whether ``broker_url`` names a RabbitMQ broker (``amqp://``, ``amqps://``,
    ``pyamqp://``) rather than a Redis one."""
    scheme, _, _ = broker_url.partition("://")
    return scheme.lower() in AMQP_SCHEMES


_NEXT_NODE = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://|[^,/@:\s]+:\d+(?:/|,|\s*$))")
"""A comma that starts another node: a URL (``redis://``, ``rediss://``) or a bare
``host:port``; not one inside a password (no ``://`` and an ``@`` after it)."""


def node_urls(url: str) -> list[str]:
    """The parts of a URL naming several nodes (``redis://:pw@a:7000/0,redis://b:7000/0``,
    or ``…,b:7000``), split only where another node begins: a password may hold a comma."""
    return [part.strip() for part in _NEXT_NODE.split(url) if part.strip()]


def celery_broker_url(settings: OrgaSettings) -> str:
    """Celery's broker: ``ORGA_BROKER_URL``, else ``ORGA_REDIS_URL`` on a standalone Redis.
    ConfigError when neither is set, and on a Redis Cluster without ``ORGA_BROKER_URL``:
    Celery cannot use a cluster as its broker (celery/celery#2852)."""
    if settings.broker_url:
        return settings.broker_url
    if settings.redis_cluster:
        raise ConfigError(
            "ORGA_REDIS_CLUSTER=true needs ORGA_BROKER_URL: Celery cannot use a Redis Cluster "
            "as its broker (celery/celery#2852); set ORGA_BROKER_URL to a standalone Redis "
            "(redis://host:6379/0) or RabbitMQ (amqp://user:pass@host:5672//)"
        )
    if settings.redis_url is None:
        raise ConfigError(
            "ORGA_REDIS_URL is not set: the workers and the coordinator need the Redis that "
            "holds the state (e.g. ORGA_REDIS_URL=redis://127.0.0.1:6379/0); `orga run` sets "
            "it for you"
        )
    return settings.redis_url


def celery_config(settings: OrgaSettings, broker_url: str) -> dict[str, Any]:
    """The Celery configuration shared by the worker app and the coordinator's client app.

    JSON only (never pickle), late acknowledgement with redelivery when a worker dies, one
    message prefetched per process, separate queues for reasoning and for tools (a worker
    without ``-Q`` serves both). On RabbitMQ (:func:`is_amqp`) the two queues are quorum
    queues on topic exchanges (Celery then applies its prefetch per consumer, as quorum queues
    require, and delays retries with RabbitMQ's native delayed delivery) and every publish
    waits for the broker's confirm.
    """
    amqp = is_amqp(broker_url)
    return {
        "broker_url": broker_url,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": keys.reasoning_queue,
        # Declared, so that a worker started without -Q (`celery -A orga worker`) consumes
        # both; -Q picks some of them. (A dict: Celery builds the kombu queues from it.)
        "task_queues": {
            queue: _amqp_queue(queue) if amqp else {"exchange": queue, "routing_key": queue}
            for queue in (keys.reasoning_queue, keys.tools_queue)
        },
        "task_routes": {
            keys.reason_task_name: {"queue": keys.reasoning_queue},
            keys.tool_task_name: {"queue": keys.tools_queue},
        },
        "broker_transport_options": (
            _amqp_transport_options() if amqp else _redis_transport_options(settings)
        ),
        "worker_detect_quorum_queues": True,
        "broker_connection_retry_on_startup": True,
        # Task events (Flower's task list): on unless ORGA_TASK_EVENTS=false, which saves
        # their broker messages (`-E` still turns them on for one worker).
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
    }


def _amqp_queue(queue: str) -> dict[str, Any]:
    """A RabbitMQ queue: durable and replicated (quorum), bound to a topic exchange of its own
    name (Celery's native delayed delivery, which retries with a countdown use on quorum
    queues, cannot route through a direct exchange)."""
    return {
        "exchange": queue,
        "exchange_type": "topic",
        "routing_key": queue,
        "queue_arguments": {"x-queue-type": "quorum"},
    }


def _amqp_transport_options() -> dict[str, Any]:
    """py-amqp's: a publish returns once RabbitMQ has confirmed it (a quorum queue confirms
    once a majority of its replicas wrote it), and a connection attempt fails after
    :data:`BROKER_SOCKET_TIMEOUT_S`. A half-open connection is found by AMQP heartbeats
    (Celery's ``broker_heartbeat``, 120 s)."""
    return {"confirm_publish": True, "connect_timeout": BROKER_SOCKET_TIMEOUT_S}


def _redis_transport_options(settings: OrgaSettings) -> dict[str, Any]:
    """kombu's Redis transport's. No ack emulation (kombu's documented ``ack_emulation``
    option): a fetch is one ``BRPOP`` and an ack sends nothing, with no unacked hash, no
    index and no visibility timeout; what a worker loses (killed holding messages it fetched)
    the coordinator re-sends, before any visibility timeout would have (docs/deploy.md §4.1,
    ``workers/broker.py``). Socket timeouts: a half-open connection to the broker fails
    a command (which Celery and kombu retry on a new connection) instead of blocking its
    caller for the kernel's TCP timeout (about 15 minutes). kombu's BRPOP waits 1 s at most."""
    return {
        "ack_emulation": False,
        "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
        "socket_keepalive": True,
    }
