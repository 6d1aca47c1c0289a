"""Prometheus metrics of the coordinator (``ORGA_METRICS_PORT``), next to Flower's own.

Three kinds of figures:

- **Counters of this process**, updated after each commit from the journal entries it wrote:
  iterations applied, steps by outcome, stagnation verdicts by level and kind, observations
  applied and ignored (duplicates or stale fences). Sum them over coordinators.
- **Latencies and provider trouble of this process**, fed by the coordinator with what it
  already has: the ``duration_ms`` of each observation it applies (model calls, tool calls),
  each model call's tokens and cost by provider and model, and OpenTelemetry's GenAI
  histograms ``gen_ai_client_token_usage`` and ``gen_ai_client_operation_duration_seconds``,
  the time from a dispatch to the commit that applied its answer, the length of an iteration,
  and the provider errors and rate-limit waits the workers report (:meth:`observed`,
  :meth:`iteration_finished`, :meth:`provider_error`, :meth:`rate_limit_wait`).
- **Bounded labels.** A label whose values a task or a model can choose (``model`` and the
  GenAI ``gen_ai_request_model``/``gen_ai_response_model``, ``provider``, ``tool``,
  ``service``) keeps the first :data:`LABEL_VALUES_LIMIT` distinct values this process sees
  (per label); every later value is counted as ``other`` (:class:`BoundedLabel`), and
  ``orga_metric_label_overflow_total{label}`` counts the observations folded so. A task that
  names a fresh model on every call costs at most that many series, not one per call.
- **Gauges read from Redis at scrape time**, the same whichever coordinator serves them: tasks
  by status (the commit script keeps ``orga:stats:status``), escalations waiting, the
  observation stream's pending entries and how far the coordinators are behind it, dead
  letters and rejected submissions. ``orga_redis_up`` says whether Redis answered: a scrape
  while Redis is down still answers (200) with this process's figures and ``orga_redis_up 0``.
- **The Celery queues' depths, read from the broker at scrape time**
  (:class:`QueueDepthCollector`): ``orga_queue_depth{queue}``, asked of the broker through the
  transport's :class:`~coordinator.transport.QueueDepths` (kombu's passive ``queue_declare``,
  on Redis and RabbitMQ alike), in a thread of its own, waited for at most 3 s; a broker that
  does not answer leaves the last depths read, with ``orga_broker_up 0``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.machine import Effects
from coordinator.queues import BROKER_TIMEOUT_S, QUEUES, WARN_EVERY_S
from coordinator.state import TaskRecord
from coordinator.transport import QueueDepths
from shared import keys
from shared.genai import OPERATION_DURATION_BUCKETS_S, TOKEN_USAGE_BUCKETS
from shared.inference import ModelCall, Usage
from shared.protocol import (
    ChildFinishedMessage,
    ReasonedMessage,
    ToolObservedMessage,
    WorkerFailedMessage,
)

__all__ = [
    "DEFAULT_METRICS_HOST",
    "LABEL_VALUES_LIMIT",
    "OTHER_LABEL_VALUE",
    "BoundedLabel",
    "CoordinatorMetrics",
    "QueueDepthCollector",
    "RedisStateCollector",
    "observation_backlog",
    "serve_metrics",
]

log = logging.getLogger(__name__)

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where the endpoint binds unless told otherwise (``ORGA_METRICS_HOST``)."""

MODEL_CALL_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
TOOL_CALL_BUCKETS_S = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
ITERATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
DISPATCH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)

Message = ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | ChildFinishedMessage

LABEL_VALUES_LIMIT = 64
"""Distinct values one caller-controlled label keeps per process (then ``other``)."""
OTHER_LABEL_VALUE = "other"


class BoundedLabel:
    """The first ``limit`` distinct values of one label seen by this process pass as they
    are; any later value is :data:`OTHER_LABEL_VALUE` (a value already seen stays itself)."""

    __slots__ = ("_lock", "_seen", "limit", "overflowed")

    def __init__(self, limit: int = LABEL_VALUES_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"a label's limit must be at least 1, got {limit}")
        self.limit = limit
        self.overflowed = 0
        """Values turned into ``other`` so far."""
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
            self.overflowed += 1
        return OTHER_LABEL_VALUE


class CoordinatorMetrics:
    """The counters and histograms one coordinator process updates; the labels a task or a
    model chooses are bounded to ``label_limit`` values each (:class:`BoundedLabel`)."""

    def __init__(self, registry: CollectorRegistry, label_limit: int = LABEL_VALUES_LIMIT) -> None:
        self._bounded = {
            name: BoundedLabel(label_limit) for name in ("provider", "model", "tool", "service")
        }
        self._counters(registry)
        self._histograms(registry)

    def _label(self, name: str, value: str) -> str:
        """``value`` of the bounded label ``name``, or ``other`` past its limit (counted)."""
        shown = self._bounded[name](value)
        if shown != value:
            self.label_overflow.labels(label=name).inc()
        return shown

    def _counters(self, registry: CollectorRegistry) -> None:
        self.iterations = Counter(
            "orga_iterations", "Reasoning iterations applied", registry=registry
        )
        self.steps = Counter(
            "orga_steps", "Steps that ended, by outcome", ["outcome"], registry=registry
        )
        self.stagnation = Counter(
            "orga_stagnation_verdicts",
            "Stagnation detector escalations, by level and kind",
            ["level", "kind"],
            registry=registry,
        )
        self.tokens = Counter(
            "orga_tokens",
            "Model tokens used, by kind (prompt, completion), provider and model (every model "
            "call: the tasks', their plans' and their critics')",
            ["kind", "provider", "model"],
            registry=registry,
        )
        self.cost = Counter(
            "orga_cost_usd",
            "What the model calls cost in US dollars, by provider and model (calls of models "
            "with no known price count 0; shared/pricing.py)",
            ["provider", "model"],
            registry=registry,
        )
        self.observations = Counter(
            "orga_observations",
            "Stream messages handled, by result (applied or ignored as stale or duplicate)",
            ["result"],
            registry=registry,
        )
        self.provider_errors = Counter(
            "orga_provider_errors",
            "Failed model requests reported by the workers, by provider and HTTP status "
            "(or connect, timeout)",
            ["provider", "status"],
            registry=registry,
        )
        self.refused_observations = Counter(
            "orga_observations_refused",
            "Well-formed observations that no dispatch of their task could have sent, by reason "
            "(unknown_task, unknown_step, never_dispatched, nonce_mismatch)",
            ["reason"],
            registry=registry,
        )
        self.state_losses = Counter(
            "orga_state_lost",
            "Times this coordinator found Redis without its consumer groups (data lost) and "
            "recreated them",
            registry=registry,
        )
        self.outages = Counter(
            "orga_service_unavailable",
            "Outages a worker reported (a provider or policy engine down past the worker's "
            "retries), by kind, service and outcome (held: the call is sent again later; "
            "gave_up: the task failed naming the outage)",
            ["kind", "service", "outcome"],
            registry=registry,
        )
        self.rate_limit_waits = Counter(
            "orga_rate_limit_waits",
            "Times a worker waited for a provider's rate limit, by provider",
            ["provider"],
            registry=registry,
        )
        self.label_overflow = Counter(
            "orga_metric_label_overflow",
            "Observations whose label value was counted as 'other': the label (model, "
            "provider, tool, service) already had its limit of distinct values in this process",
            ["label"],
            registry=registry,
        )
        self.rate_limit_wait_seconds = Counter(
            "orga_rate_limit_wait_seconds",
            "Time workers spent waiting for a provider's rate limit, by provider",
            ["provider"],
            registry=registry,
        )

    def _histograms(self, registry: CollectorRegistry) -> None:
        self.model_call_seconds = Histogram(
            "orga_model_call_duration_seconds",
            "Reason and Gate of one iteration in a reasoning worker: the model call with its "
            "retries (iterations that ran their tools inline are not counted)",
            buckets=MODEL_CALL_BUCKETS_S,
            registry=registry,
        )
        self.tool_call_seconds = Histogram(
            "orga_tool_call_duration_seconds",
            "One tool call in a worker, by tool",
            ["tool"],
            buckets=TOOL_CALL_BUCKETS_S,
            registry=registry,
        )
        self.iteration_seconds = Histogram(
            "orga_iteration_duration_seconds",
            "One iteration, from its reasoning dispatch to the commit that applied its last "
            "tool result (or its answer)",
            buckets=ITERATION_BUCKETS_S,
            registry=registry,
        )
        # OpenTelemetry's GenAI client metrics, under their Prometheus names.
        self.genai_tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens used by one model call (gen_ai.client.token.usage), by token type",
            [
                "gen_ai_operation_name",
                "gen_ai_provider_name",
                "gen_ai_request_model",
                "gen_ai_response_model",
                "gen_ai_token_type",
            ],
            buckets=TOKEN_USAGE_BUCKETS,
            registry=registry,
        )
        self.genai_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "One model call, its retries included (gen_ai.client.operation.duration)",
            [
                "gen_ai_operation_name",
                "gen_ai_provider_name",
                "gen_ai_request_model",
                "gen_ai_response_model",
            ],
            buckets=OPERATION_DURATION_BUCKETS_S,
            registry=registry,
        )
        self.dispatch_seconds = Histogram(
            "orga_dispatch_to_applied_seconds",
            "From a dispatch to the commit that applied its answer, by message kind (queue "
            "wait, run time, observation stream and coordinator)",
            ["kind"],
            buckets=DISPATCH_BUCKETS_S,
            registry=registry,
        )

    # -- after each commit -----------------------------------------------------------------

    def record(self, record: TaskRecord, effects: Effects) -> None:
        """Count what one commit did: iterations, tokens, stagnation, steps; an iteration's
        time when its observations are collected; the provider's waits and failures."""
        self.observations.labels(result="applied").inc()
        provider = record.spec.provider.kind or "default"
        for entry in effects.journal:
            event = entry.event
            if event.type == "ObservationsCollected" and record.iteration_started_at:
                self.iteration_finished(record.iteration_started_at, record.updated_at)
            elif event.type == "ProviderWaited":
                for wait in event.waits:
                    self._waited(wait.provider, wait.status, wait.wait_s, wait.shared)
            elif event.type == "DispatchFailed" and event.fence.count("/") == 3:
                # task/step/iteration/attempt: a reasoning dispatch (a call adds its id)
                self.provider_error(provider, event.error_kind)
            elif event.type == "ServiceUnavailable":
                outcome = "held" if event.retry_at is not None else "gave_up"
                service = self._label("service", event.service)
                self.outages.labels(kind=event.error_kind, service=service, outcome=outcome).inc()
            elif event.type == "ReasoningComplete":
                self.iterations.inc()
            elif event.type == "StagnationDetected":
                kind = event.kind.value if event.kind else "none"
                self.stagnation.labels(level=event.level.value, kind=kind).inc()
        for fields in effects.events:
            name = fields.get("event", "")
            if name.startswith("step_") and name != "step_started":
                self.steps.labels(outcome=name.removeprefix("step_")).inc()

    def refused(self, reason: str) -> None:
        """An observation that is wrong, not merely late (see ``orga_observations_refused``)."""
        self.refused_observations.labels(reason=reason).inc()

    def state_lost(self) -> None:
        """Redis lost its data; this coordinator recreated the consumer groups."""
        self.state_losses.inc()

    def ignored(self) -> None:
        """A message whose fence was stale or already applied."""
        self.observations.labels(result="ignored").inc()

    # -- latencies -------------------------------------------------------------------------

    def observed(
        self, message: Message, dispatched_at: float | None = None, now: float | None = None
    ) -> None:
        """An observation this coordinator applied (its commit succeeded).

        Its ``duration_ms`` feeds the model-call or tool-call histogram (with the tool calls
        a reasoned message carries in ``acted``); ``dispatched_at`` (epoch seconds, when the
        dispatch it answers was committed) feeds dispatch-to-applied, measured to ``now``
        (default: the current time).
        """
        if isinstance(message, ReasonedMessage):
            self._reasoned(message)
        elif isinstance(message, ToolObservedMessage):
            self._tool(message)
        if dispatched_at is not None:
            elapsed = (time.time() if now is None else now) - dispatched_at
            self.dispatch_seconds.labels(kind=message.kind).observe(max(elapsed, 0.0))

    def _reasoned(self, message: ReasonedMessage) -> None:
        if message.duration_ms > 0:
            self.model_call_seconds.observe(message.duration_ms / 1000)
        call = message.model_call
        if call is not None:
            self.model_called(call, message.usage)
        for acted in message.acted or ():
            self._tool(acted)

    def model_called(self, call: ModelCall, usage: Usage) -> None:
        """One model call: its tokens and cost by provider and model, and the GenAI
        histograms."""
        provider = self._label("provider", call.provider)
        model = self._label("model", call.model)
        response_model = self._label("model", call.response_model) if call.response_model else model
        self.tokens.labels(kind="prompt", provider=provider, model=model).inc(usage.prompt_tokens)
        self.tokens.labels(kind="completion", provider=provider, model=model).inc(
            usage.completion_tokens
        )
        self.cost.labels(provider=provider, model=model).inc(usage.cost_usd)
        labels = ("chat", provider, model, response_model)
        self.genai_duration.labels(*labels).observe(call.duration_ms / 1000)
        self.genai_tokens.labels(*labels, "input").observe(usage.prompt_tokens)
        self.genai_tokens.labels(*labels, "output").observe(usage.completion_tokens)

    def _tool(self, message: ToolObservedMessage) -> None:
        if message.duration_ms > 0:
            tool = self._label("tool", message.observation.source or "unknown")
            self.tool_call_seconds.labels(tool=tool).observe(message.duration_ms / 1000)

    def iteration_finished(self, started_at: float, now: float | None = None) -> None:
        """An iteration ended: ``started_at`` is when its reasoning was dispatched (epoch s)."""
        elapsed = (time.time() if now is None else now) - started_at
        self.iteration_seconds.observe(max(elapsed, 0.0))

    # -- provider trouble reported by the workers ------------------------------------------

    def provider_error(self, provider: str, status: int | str) -> None:
        """A model request failed: ``status`` is the HTTP status, or ``connect``/``timeout``."""
        provider = self._label("provider", provider)
        self.provider_errors.labels(provider=provider, status=str(status)).inc()

    def _waited(self, provider: str, status: int, seconds: float, shared: bool) -> None:
        """A model call waited: a provider error it rode out (``status``; 0 a timeout), a
        rate limit (429, or another call's 429 on the same key)."""
        if not shared:
            self.provider_error(provider, status or "timeout")
        if shared or status == 429:
            self.rate_limit_wait(provider, seconds)

    def rate_limit_wait(self, provider: str, seconds: float) -> None:
        """A worker waited ``seconds`` for a provider's rate limit (a 429, Retry-After)."""
        provider = self._label("provider", provider)
        self.rate_limit_waits.labels(provider=provider).inc()
        self.rate_limit_wait_seconds.labels(provider=provider).inc(max(seconds, 0.0))


class RedisStateCollector(Collector):
    """Gauges read from Redis when Prometheus scrapes, and ``orga_redis_up``."""

    def __init__(
        self,
        redis_url: str,
        timeout_s: float = 2.0,
        partitions: int = 1,
        connect: Callable[..., redis.Redis] | None = None,
    ) -> None:
        """``connect``: builds the state's client (a RedisCluster on a cluster); None: a
        standalone Redis at ``redis_url``."""
        self._partitions = partitions
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
        }
        self._redis = connect(**options) if connect else redis.Redis.from_url(redis_url, **options)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One scrape: every gauge when Redis answers, only ``orga_redis_up 0`` when not."""
        try:
            gauges = list(self._gauges(self._redis))
        except redis.RedisError as exc:
            log.warning("metrics.redis_unavailable", extra={"error": str(exc)})
            yield _gauge("orga_redis_up", "Whether Redis answered this scrape", 0)
            return
        yield _gauge("orga_redis_up", "Whether Redis answered this scrape", 1)
        yield from gauges

    def _gauges(self, client: redis.Redis) -> Iterable[GaugeMetricFamily]:
        parts = range(self._partitions)  # every gauge is the sum over the partitions
        tasks = GaugeMetricFamily("orga_tasks", "Tasks by status", labels=["status"])
        counts: dict[str, float] = {}
        for p in parts:
            stored = cast("dict[str, str]", client.hgetall(keys.status_counts_key(p)))
            for status, count in keys.status_counts(stored).items():
                counts[status] = counts.get(status, 0.0) + float(count)
        for status, total in sorted(counts.items()):
            tasks.add_metric([status], total)
        yield tasks
        yield _gauge(
            "orga_escalations_waiting",
            "Reviews waiting for a human",
            _total(client.hlen(keys.open_reviews_key(p)) for p in parts),
        )
        pending, undelivered, lag_s = observation_backlog(client, partitions=self._partitions)
        yield _gauge(
            "orga_observation_pending",
            "Observations delivered to a coordinator but not yet applied (up to 10,000)",
            pending,
        )
        yield _gauge(
            "orga_observations_undelivered",
            "Observations not yet delivered to any coordinator (counted up to 10,000)",
            undelivered,
        )
        yield _gauge(
            "orga_observation_lag_seconds",
            "Age of the oldest observation not yet delivered to any coordinator (0: none)",
            lag_s,
        )
        yield _gauge(
            "orga_dead_letters",
            "Entries on the dead-letter stream",
            _total(client.xlen(keys.dead_letter_stream(p)) for p in parts),
        )
        yield _partition_gauge(client, self._partitions)
        yield _gauge(
            "orga_rejected_tasks",
            "Entries on the rejected stream",
            _total(client.xlen(keys.rejected_stream(p)) for p in parts),
        )


class QueueDepthCollector(Collector):
    """``orga_queue_depth{queue}`` and ``orga_broker_up``, asked of the broker at each scrape.

    The depths come from ``depths`` (:class:`~coordinator.transport.QueueDepths`; the relay's
    :class:`~coordinator.relay.CeleryPublisher`: kombu's passive ``queue_declare``, whose reply
    counts the messages ready, on Redis as on RabbitMQ), called in a thread of its own and
    waited for at most ``timeout_s``: a hung broker socket does not hold the scrape, and a call
    still hanging is waited for again, never doubled. A broker that fails or does not answer in
    time leaves the last depths read (none before the first answer) and ``orga_broker_up 0``,
    logged once a minute as ``metrics.queue_depth_unavailable``.
    """

    def __init__(
        self,
        depths: QueueDepths,
        queues: Sequence[str] = QUEUES,
        timeout_s: float = BROKER_TIMEOUT_S,
    ) -> None:
        self._depths = depths
        self._queues = list(queues)
        self._timeout_s = timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orga-queue-depths")
        self._lock = threading.Lock()
        self._call: Future[Mapping[str, int] | None] | None = None
        self._last: dict[str, int] = {}
        self._warned_at = -WARN_EVERY_S

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One scrape: the depths the broker gives now, else the last ones read."""
        with self._lock:  # scrapes may come together; one broker call at a time
            answered = self._read()
            depths = dict(self._last)
        gauge = GaugeMetricFamily(
            "orga_queue_depth",
            "Messages waiting in each Celery queue, as the broker says (the last depths read "
            "when it does not answer)",
            labels=["queue"],
        )
        for queue, depth in sorted(depths.items()):
            gauge.add_metric([queue], float(depth))
        yield gauge
        yield _gauge(
            "orga_broker_up",
            f"Whether the broker told the queues' depths for this scrape (within "
            f"{self._timeout_s:g}s)",
            int(answered),
        )

    def _read(self) -> bool:
        call = self._call
        if call is None:
            call = self._call = self._thread.submit(self._depths.queue_depths, self._queues)
        try:
            depths = call.result(timeout=self._timeout_s)
        except Exception as exc:  # the broker's error, or no answer in time (TimeoutError)
            if call.done():
                self._call = None
            self._warn(exc, call.done())
            return False
        self._call = None
        if depths is None:  # a transport that cannot tell
            return False
        self._last = {queue: int(depths.get(queue, 0)) for queue in self._queues}
        return True

    def _warn(self, exc: BaseException, done: bool) -> None:
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        error = (f"{type(exc).__name__}: {str(exc)[:300]}" if done
                 else f"no answer within {self._timeout_s:g}s")  # fmt: skip
        log.warning("metrics.queue_depth_unavailable", extra={"error": error, "kept": self._last})

    def close(self) -> None:
        """Stop the thread (a call in progress ends on its own)."""
        self._thread.shutdown(wait=False)


def _partition_gauge(client: redis.Redis, partitions: int) -> GaugeMetricFamily:
    """``orga_partitions_held{coordinator}``: partition leases by holder (``""``: unheld)."""
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.get(keys.partition_lease_key(p))
    counts: dict[str, int] = {}
    for owner in cast("list[str | None]", pipe.execute()):
        counts[owner or ""] = counts.get(owner or "", 0) + 1
    gauge = GaugeMetricFamily(
        "orga_partitions_held",
        'Partitions whose streams and relay each coordinator serves (coordinator "": no one)',
        labels=["coordinator"],
    )
    for owner, count in sorted(counts.items()):
        gauge.add_metric([owner], float(count))
    return gauge


def observation_backlog(
    client: redis.Redis, now: float | None = None, partitions: int = 1
) -> tuple[int, int, float]:
    """``(pending, undelivered, lag_s)`` of the coordinators' group on the observations streams
    of every partition (summed; the largest lag)."""
    totals = [_backlog(client, keys.observations_stream(p), now) for p in range(partitions)]
    return (
        sum(t[0] for t in totals),
        sum(t[1] for t in totals),
        max((t[2] for t in totals), default=0.0),
    )


def _backlog(client: redis.Redis, stream: str, now: float | None) -> tuple[int, int, float]:
    """``(pending, undelivered, lag_s)`` of the coordinators' group on one observations stream.

    ``pending`` counts the delivered entries still on the stream, up to 10,000: an observation
    dropped (or an outage report applied) is deleted at once, the others applied together
    about ``delete_applied_s`` (0.25 s) after their commit, so ``pending`` also holds those
    applied in the last quarter-second; on Redis 7.0.4 and later a deleted entry's delivery
    is left pending until a coordinator's next claim drops it (the coordinators' tick,
    whatever its idle time), so the group's pending count also holds those deleted since the
    last tick (before 7.0.4 it is acknowledged too: none).
    ``undelivered`` is counted from the group's last delivered id (Redis 6.2 has no ``lag``
    field), up to 10,000 entries; ``lag_s`` is the age of the oldest of them, read from its
    stream id (the time it was added), 0.0 when there is none.
    """
    try:
        groups: list[dict[str, Any]] = client.xinfo_groups(stream)
    except redis.ResponseError:
        return 0, 0, 0.0
    group = next((g for g in groups if g.get("name") == keys.coordinator_group), None)
    if group is None:
        return 0, 0, 0.0
    last = str(group.get("last-delivered-id", "0-0"))
    behind = cast("list[Any]", client.xrange(stream, min=f"({last}", count=10_000))
    lag_s = 0.0
    if behind:
        added_ms = int(str(behind[0][0]).split("-", 1)[0])
        lag_s = max((time.time() if now is None else now) - added_ms / 1000, 0.0)
    return _still_pending(client, stream), len(behind), lag_s


def _still_pending(client: redis.Redis, stream: str) -> int:
    """How many of the group's pending entries (up to 10,000) are still on the stream."""
    rows = cast(
        "list[dict[str, Any]]",
        client.xpending_range(stream, keys.coordinator_group, min="-", max="+", count=10_000),
    )
    if not rows:
        return 0
    ids = [str(row["message_id"]) for row in rows]
    kept = cast("list[Any]", client.xrange(stream, min=ids[0], max=ids[-1], count=10_000))
    return len({str(i) for i, _f in kept}.intersection(ids))


def _total(values: Iterable[Any]) -> int:
    return sum(int(v) for v in values)


def _gauge(name: str, documentation: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(cast("int", value)))


def serve_metrics(
    port: int,
    redis_url: str,
    *,
    host: str = DEFAULT_METRICS_HOST,
    partitions: int = 1,
    connect: Callable[..., redis.Redis] | None = None,
    queue_depths: QueueDepths | None = None,
) -> CoordinatorMetrics:
    """Start the HTTP endpoint on ``host:port`` (a daemon thread); return what to update.
    ``queue_depths``: where the queues' depths are asked (None: no queue gauge)."""
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url, partitions=partitions, connect=connect))
    if queue_depths is not None:
        registry.register(QueueDepthCollector(queue_depths))
    metrics = CoordinatorMetrics(registry)
    start_http_server(port, addr=host, registry=registry)
    return metrics
