"""Prometheus metrics of the coordinator (``ORGA_METRICS_PORT``), next to Flower's own.

Two kinds of figures:

- **Counters of this process**, updated after each commit from the journal entries it wrote:
  iterations applied, steps by outcome, stagnation verdicts by level and kind, tokens used,
  observations applied and ignored (duplicates or stale fences). Sum them over coordinators.
- **Gauges read from Redis at scrape time**, the same whichever coordinator serves them: tasks
  by status (the commit script keeps ``orga:stats:status``), escalations waiting, the
  observation stream's pending entries and lag behind the consumer group, dead letters and
  rejected submissions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import redis
from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.machine import Effects
from coordinator.state import TaskRecord
from shared import keys

__all__ = ["CoordinatorMetrics", "RedisStateCollector", "serve_metrics"]


class CoordinatorMetrics:
    """The counters one coordinator process updates."""

    def __init__(self, registry: CollectorRegistry) -> None:
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
            "orga_tokens", "Model tokens used, by kind", ["kind"], registry=registry
        )
        self.observations = Counter(
            "orga_observations",
            "Stream messages handled, by result (applied or ignored as stale or duplicate)",
            ["result"],
            registry=registry,
        )

    def record(self, _record: TaskRecord, effects: Effects) -> None:
        """Count what one commit did."""
        self.observations.labels(result="applied").inc()
        for entry in effects.journal:
            event = entry.event
            if event.type == "ReasoningComplete":
                self.iterations.inc()
                self.tokens.labels(kind="prompt").inc(event.usage.prompt_tokens)
                self.tokens.labels(kind="completion").inc(event.usage.completion_tokens)
            elif event.type == "StagnationDetected":
                kind = event.kind.value if event.kind else "none"
                self.stagnation.labels(level=event.level.value, kind=kind).inc()
        for fields in effects.events:
            name = fields.get("event", "")
            if name.startswith("step_") and name != "step_started":
                self.steps.labels(outcome=name.removeprefix("step_")).inc()

    def ignored(self) -> None:
        """A message whose fence was stale or already applied."""
        self.observations.labels(result="ignored").inc()


class RedisStateCollector(Collector):
    """Gauges read from Redis when Prometheus scrapes."""

    def __init__(self, redis_url: str) -> None:
        self._redis = redis.Redis.from_url(redis_url, decode_responses=True)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One scrape."""
        client = self._redis
        tasks = GaugeMetricFamily("orga_tasks", "Tasks by status", labels=["status"])
        counts = cast("dict[str, str]", client.hgetall(keys.status_counts_key))
        for status, count in sorted(counts.items()):
            tasks.add_metric([status], float(count))
        yield tasks
        yield _gauge(
            "orga_escalations_waiting",
            "Reviews waiting for a human",
            client.hlen(keys.open_reviews_key),
        )
        pending, lag = observation_backlog(client)
        yield _gauge(
            "orga_observation_pending",
            "Observations delivered to a coordinator but not yet applied",
            pending,
        )
        yield _gauge(
            "orga_observation_lag", "Observations not yet delivered to any coordinator", lag
        )
        yield _gauge(
            "orga_dead_letters",
            "Entries on the dead-letter stream",
            client.xlen(keys.dead_letter_stream),
        )
        yield _gauge(
            "orga_rejected_tasks",
            "Entries on the rejected stream",
            client.xlen(keys.rejected_stream),
        )


def observation_backlog(client: redis.Redis) -> tuple[int, int]:
    """``(pending, lag)`` of the coordinators' group on the observations stream.

    Lag is counted from the group's last delivered id (Redis 6.2 has no ``lag`` field), up to
    10,000 entries.
    """
    try:
        groups: list[dict[str, Any]] = client.xinfo_groups(keys.observations_stream)
    except redis.ResponseError:
        return 0, 0
    group = next((g for g in groups if g.get("name") == keys.coordinator_group), None)
    if group is None:
        return 0, 0
    last = str(group.get("last-delivered-id", "0-0"))
    behind = cast(
        "list[Any]", client.xrange(keys.observations_stream, min=f"({last}", count=10_000)
    )
    return int(group.get("pending", 0)), len(behind)


def _gauge(name: str, documentation: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(cast("int", value)))


def serve_metrics(port: int, redis_url: str) -> CoordinatorMetrics:
    """Start the HTTP endpoint (a daemon thread) and return the counters to update."""
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url))
    metrics = CoordinatorMetrics(registry)
    start_http_server(port, registry=registry)
    return metrics
