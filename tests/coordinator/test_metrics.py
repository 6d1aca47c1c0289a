"""Prometheus metrics: counters from commits, gauges read from a real Redis, the HTTP endpoint."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from redis.asyncio import Redis

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.metrics import (
    DEFAULT_METRICS_HOST,
    BoundedLabel,
    CoordinatorMetrics,
    QueueDepthCollector,
    RedisStateCollector,
    observation_backlog,
    serve_metrics,
)
from coordinator.relay import CeleryPublisher
from coordinator.state import TaskRecord
from coordinator.store import TaskStore
from shared import keys
from shared.actions import Observation, RespondAction
from shared.conversation import ConversationMessage
from shared.inference import ModelCall, Usage
from shared.protocol import Fence, ReasonedMessage, ToolObservedMessage
from shared.settings import OrgaSettings
from shared.task_spec import parse_task
from tests.redis_server import RedisServer


def _record(task_id: str) -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=0.0, updated_at=0.0)


async def _run_one_task(url: str, metrics: CoordinatorMetrics) -> None:
    client = Redis.from_url(url)
    store = TaskStore(client)
    record = _record("m1")
    await store.create(record)
    machine = TaskMachine(record, 1.0, MachineSettings(workspace_root="/ws"))
    effects = machine.start()
    await store.commit(machine.record, effects)
    assert record.awaiting is not None
    answer = ReasonedMessage(
        fence=record.awaiting.fence,
        new_messages=[ConversationMessage.assistant("done")],
        actions=[RespondAction(content="done")],
        terminal_output="done",
        usage=Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10, cost_usd=0.25),
        model_call=ModelCall(
            provider="openai", model="gpt-4o", response_model="gpt-4o-2024-08-06", duration_ms=700
        ),
    )
    machine = TaskMachine(record, 2.0, MachineSettings(workspace_root="/ws"))
    effects = machine.on_reasoned(answer)
    await store.commit(machine.record, effects)
    metrics.observed(answer)
    metrics.record(machine.record, effects)
    stale = TaskMachine(record, 3.0, MachineSettings(workspace_root="/ws")).on_reasoned(answer)
    assert not stale.changed
    metrics.ignored()
    await client.aclose()


def _value(text: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as exposed
    wanted = f"{name}{{{label_text}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{wanted} not in metrics:\n{text}")


def test_counters_and_gauges(redis_url: str, redis_client: Any) -> None:
    """A finished task shows in tasks-by-status; its iteration is counted, and its model
    call's tokens and cost by provider and model, with the GenAI histograms (the
    conventions' bucket boundaries)."""
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url))
    metrics = CoordinatorMetrics(registry)
    asyncio.run(_run_one_task(redis_url, metrics))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_tasks", status="completed") == 1
    assert _value(text, "orga_tasks", status="running") == 0
    assert _value(text, "orga_iterations_total") == 1
    model = {"provider": "openai", "model": "gpt-4o"}
    assert _value(text, "orga_tokens_total", kind="prompt", **model) == 7
    assert _value(text, "orga_tokens_total", kind="completion", **model) == 3
    assert _value(text, "orga_cost_usd_total", **model) == 0.25
    genai = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "gpt-4o",
        "gen_ai_response_model": "gpt-4o-2024-08-06",
    }
    duration = "gen_ai_client_operation_duration_seconds_bucket"
    assert _value(text, duration, **genai, le="0.64") == 0
    assert _value(text, duration, **genai, le="1.28") == 1
    tokens = "gen_ai_client_token_usage_bucket"
    assert _value(text, tokens, **genai, gen_ai_token_type="input", le="4.0") == 0
    assert _value(text, tokens, **genai, gen_ai_token_type="input", le="16.0") == 1
    assert _value(text, "gen_ai_client_token_usage_sum", **genai, gen_ai_token_type="output") == 3
    assert _value(text, "orga_steps_total", outcome="completed") == 1
    assert _value(text, "orga_observations_total", result="ignored") == 1
    assert _value(text, "orga_escalations_waiting") == 0


def test_observation_lag_and_pending(redis_url: str, redis_client: Any) -> None:
    """Entries not yet read count as lag; read and still on the stream ones as pending (one
    applied is deleted at once, its delivery dropped by a later claim: not pending)."""

    async def scenario() -> None:
        async with redis_client() as client:
            await client.xgroup_create(
                keys.observations_stream(0), keys.coordinator_group, mkstream=True
            )
            ids = [
                await client.xadd(keys.observations_stream(0), {"n": str(index)})
                for index in range(4)
            ]
            await client.xreadgroup(
                keys.coordinator_group, "c", {keys.observations_stream(0): ">"}, count=2
            )
            await client.xdel(keys.observations_stream(0), ids[0])  # applied

    asyncio.run(scenario())
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_observation_pending") == 1
    assert _value(text, "orga_observations_undelivered") == 2
    assert 0 < _value(text, "orga_observation_lag_seconds") < 60
    assert _value(text, "orga_redis_up") == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scrape(port: int, host: str = "127.0.0.1") -> httpx.Response:
    return httpx.get(f"http://{host}:{port}/metrics", timeout=10)


def test_http_endpoint_serves_the_metrics(redis_url: str, redis_client: Any) -> None:
    """``serve_metrics`` answers Prometheus scrapes on its port."""
    port = _free_port()
    serve_metrics(port, redis_url)
    response = _scrape(port)
    assert response.status_code == 200
    assert "orga_escalations_waiting" in response.text
    assert _value(response.text, "orga_redis_up") == 1


def test_endpoint_binds_the_configured_address_loopback_by_default(redis_url: str) -> None:
    """The endpoint listens on ORGA_METRICS_HOST (127.0.0.1 unless set), not every interface."""
    assert OrgaSettings().metrics_host == DEFAULT_METRICS_HOST == "127.0.0.1"
    assert OrgaSettings(metrics_host="0.0.0.0").metrics_host == "0.0.0.0"
    port = _free_port()
    serve_metrics(port, redis_url)
    assert _scrape(port).status_code == 200
    with pytest.raises(httpx.ConnectError):
        _scrape(port, host="127.0.0.2")  # another loopback address: nothing listens there
    other = _free_port()
    serve_metrics(other, redis_url, host="127.0.0.2")
    assert _scrape(other, host="127.0.0.2").status_code == 200
    with pytest.raises(httpx.ConnectError):
        _scrape(other)


def test_scrape_with_redis_unreachable_answers_with_redis_up_zero() -> None:
    """Redis on a closed port: the scrape answers 200 with the counters and orga_redis_up 0."""
    port = _free_port()
    metrics = serve_metrics(port, f"redis://127.0.0.1:{_free_port()}/0")
    metrics.ignored()
    response = _scrape(port)
    assert response.status_code == 200
    assert _value(response.text, "orga_redis_up") == 0
    assert _value(response.text, "orga_observations_total", result="ignored") == 1
    assert "orga_tasks" not in response.text  # no gauge is made up while Redis is away


def test_scrape_follows_a_redis_that_stops_and_comes_back(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """A real Redis stopped between scrapes: up 1, then 0 (still HTTP 200), then 1 again."""
    server = redis_server_factory(appendonly=True)
    with redis.Redis.from_url(server.url) as client:
        client.hset(keys.status_counts_key(0), "completed", 3)
    port = _free_port()
    serve_metrics(port, server.url)
    assert _value(_scrape(port).text, "orga_tasks", status="completed") == 3
    server.stop()
    down = _scrape(port)
    assert down.status_code == 200
    assert _value(down.text, "orga_redis_up") == 0
    server.start()
    back = _scrape(port).text
    assert _value(back, "orga_redis_up") == 1
    assert _value(back, "orga_tasks", status="completed") == 3


def _fence(call_id: str | None = None) -> Fence:
    return Fence(task_id="t", step_id="s", iteration=1, attempt=1, call_id=call_id)


def _tool(name: str, duration_ms: float) -> ToolObservedMessage:
    observation = Observation.tool_result(name, "ok")
    return ToolObservedMessage(fence=_fence("c1"), observation=observation, duration_ms=duration_ms)


def test_latency_histograms_are_fed_from_applied_observations() -> None:
    """Model and tool durations come from the messages, dispatch-to-applied from the times."""
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)
    reasoned = ReasonedMessage(fence=_fence(), duration_ms=1500.0)
    metrics.observed(reasoned, dispatched_at=100.0, now=102.0)
    metrics.observed(_tool("run_command", 20.0), dispatched_at=102.0, now=102.5)
    chained = ReasonedMessage(
        fence=_fence(), duration_ms=800.0, chained=["c1"], acted=[_tool("file_read", 4.0)]
    )
    metrics.observed(chained)
    inline = ReasonedMessage(fence=_fence(), duration_ms=900.0, acted=[_tool("grep", 7.0)])
    metrics.observed(inline)  # its duration stops before the tools it ran: a model call
    metrics.iteration_finished(started_at=100.0, now=103.0)
    text = generate_latest(registry).decode()
    assert _value(text, "orga_model_call_duration_seconds_count") == 3
    assert _value(text, "orga_model_call_duration_seconds_sum") == pytest.approx(3.2)
    assert _value(text, "orga_tool_call_duration_seconds_count", tool="run_command") == 1
    assert _value(text, "orga_tool_call_duration_seconds_count", tool="file_read") == 1
    assert _value(text, "orga_tool_call_duration_seconds_sum", tool="grep") == 0.007
    assert _value(text, "orga_dispatch_to_applied_seconds_sum", kind="reasoned") == 2.0
    assert _value(text, "orga_dispatch_to_applied_seconds_sum", kind="tool_observed") == 0.5
    assert _value(text, "orga_iteration_duration_seconds_sum") == 3.0
    assert _value(text, "orga_iteration_duration_seconds_bucket", le="5.0") == 1


def test_provider_errors_and_rate_limit_waits_are_counted() -> None:
    """Provider errors by provider and status; rate-limit waits as a count and a total time."""
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)
    metrics.provider_error("openai", 429)
    metrics.provider_error("openai", 429)
    metrics.provider_error("anthropic", "timeout")
    metrics.rate_limit_wait("openai", 2.5)
    metrics.rate_limit_wait("openai", 1.5)
    text = generate_latest(registry).decode()
    assert _value(text, "orga_provider_errors_total", provider="openai", status="429") == 2
    assert _value(text, "orga_provider_errors_total", provider="anthropic", status="timeout") == 1
    assert _value(text, "orga_rate_limit_waits_total", provider="openai") == 2
    assert _value(text, "orga_rate_limit_wait_seconds_total", provider="openai") == 4.0


def test_a_task_minting_model_names_costs_a_bounded_number_of_series() -> None:
    """Models named by tasks: the first ``label_limit`` distinct names keep their series, any
    later one counts as ``other`` in orga_tokens, orga_cost_usd and the GenAI histograms (a
    name already seen keeps its own); the folded observations are counted by label."""
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry, label_limit=3)
    usage = Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12, cost_usd=0.5)
    for n in range(50):
        call = ModelCall(provider="openai", model=f"minted-{n}", response_model=f"minted-{n}")
        metrics.model_called(call, usage)
    metrics.model_called(ModelCall(provider="openai", model="minted-1"), usage)
    for n in range(10):
        metrics.observed(_tool(f"tool-{n}", 5.0))
    text = generate_latest(registry).decode()
    models = {
        line.split('model="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("orga_cost_usd_total{")
    }
    assert models == {"minted-0", "minted-1", "minted-2", "other"}
    assert _value(text, "orga_cost_usd_total", provider="openai", model="other") == 47 * 0.5
    assert _value(text, "orga_cost_usd_total", provider="openai", model="minted-1") == 1.0
    assert _value(text, "orga_tokens_total", kind="prompt", provider="openai", model="other") == 470
    assert (
        _value(text, "gen_ai_client_operation_duration_seconds_count",
               gen_ai_operation_name="chat", gen_ai_provider_name="openai",
               gen_ai_request_model="other", gen_ai_response_model="other")
        == 47
    )  # fmt: skip
    series = [
        line for line in text.splitlines() if line.startswith("gen_ai_client_token_usage_count")
    ]
    assert len(series) == 4 * 2  # 3 models and other, input and output
    tools = {
        line.split('tool="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("orga_tool_call_duration_seconds_count")
    }
    assert tools == {"tool-0", "tool-1", "tool-2", "other"}
    assert _value(text, "orga_metric_label_overflow_total", label="model") == 2 * 47
    assert _value(text, "orga_metric_label_overflow_total", label="tool") == 7


def test_a_bounded_label_keeps_its_first_values() -> None:
    bound = BoundedLabel(2)
    assert [bound(v) for v in ("a", "b", "c", "a", "d", "b")] == [
        "a",
        "b",
        "other",
        "a",
        "other",
        "b",
    ]
    assert bound.overflowed == 2
    with pytest.raises(ValueError, match="at least 1, got 0"):
        BoundedLabel(0)


def test_observation_lag_is_the_age_of_the_oldest_undelivered_entry(
    redis_url: str, redis_client: Any
) -> None:
    """The lag in seconds is read from the stream id of the first entry no one has read."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        client.xgroup_create(keys.observations_stream(0), keys.coordinator_group, mkstream=True)
        old = int(time.time() * 1000) - 30_000
        client.xadd(keys.observations_stream(0), {"n": "0"}, id=f"{old}-0")
        client.xadd(keys.observations_stream(0), {"n": "1"})
        pending, undelivered, lag_s = observation_backlog(client, now=old / 1000 + 30)
    assert (pending, undelivered) == (0, 2)
    assert lag_s == pytest.approx(30.0)


def test_the_gauges_sum_every_partition(redis_url: str, redis_client: Any) -> None:
    """Tasks by status, reviews waiting, dead letters and the observation backlog are read
    from every partition and summed."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        for p in (0, 3):
            client.hset(keys.status_counts_key(p), mapping={"running": 2, "completed": p})
            client.hset(keys.open_reviews_key(p), f"r{p}", "{}")
            client.xadd(keys.dead_letter_stream(p), {"n": "1"})
            client.xgroup_create(keys.observations_stream(p), keys.coordinator_group, mkstream=True)
            client.xadd(keys.observations_stream(p), {"n": "1"})
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url, partitions=4))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_tasks", status="running") == 4
    assert _value(text, "orga_tasks", status="completed") == 3
    assert _value(text, "orga_escalations_waiting") == 2
    assert _value(text, "orga_dead_letters") == 2
    assert _value(text, "orga_observations_undelivered") == 2


def test_the_partitions_held_gauge_counts_leases_by_coordinator(
    redis_url: str, redis_client: Any
) -> None:
    """orga_partitions_held{coordinator} counts each coordinator's partition leases; the
    partitions no one holds are counted under coordinator=""."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        for p in range(3):
            client.set(keys.partition_lease_key(p), "c1")
        client.set(keys.partition_lease_key(3), "c2")
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url, partitions=6))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_partitions_held", coordinator="c1") == 3
    assert _value(text, "orga_partitions_held", coordinator="c2") == 1
    assert _value(text, "orga_partitions_held", coordinator="") == 2


# -- the queue gauge -------------------------------------------------------------------------


class _Broker:
    """A stand-in broker: tells ``depths``, fails while ``down``, hangs while ``hung`` is set
    until ``release`` is."""

    def __init__(self) -> None:
        self.depths: dict[str, int] = {keys.reasoning_queue: 12, keys.tools_queue: 3}
        self.down = False
        self.hung = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def queue_depths(self, queues: Sequence[str]) -> Mapping[str, int] | None:
        self.calls += 1
        if self.hung.is_set():
            self.release.wait(30)
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return {q: self.depths[q] for q in queues if q in self.depths}


def _collect(collector: QueueDepthCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_queue_gauge_tells_the_brokers_depths_and_keeps_the_last_ones() -> None:
    """``orga_queue_depth{queue}`` is what the broker tells at each scrape; a broker that fails
    leaves the last depths read, with ``orga_broker_up 0``."""
    broker = _Broker()
    collector = QueueDepthCollector(broker)
    text = _collect(collector)
    assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 12
    assert _value(text, "orga_queue_depth", queue=keys.tools_queue) == 3
    assert _value(text, "orga_broker_up") == 1
    broker.depths = {keys.reasoning_queue: 40}  # a queue the broker does not know: 0
    text = _collect(collector)
    assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 40
    assert _value(text, "orga_queue_depth", queue=keys.tools_queue) == 0
    broker.down, broker.depths = True, {keys.reasoning_queue: 99, keys.tools_queue: 99}
    text = _collect(collector)
    assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 40  # the last read
    assert _value(text, "orga_broker_up") == 0


def test_a_hung_broker_does_not_hold_a_scrape_of_the_queue_gauge() -> None:
    """A broker that never answers: each scrape returns after the timeout with the last depths
    read and ``orga_broker_up 0``; the hung call is waited for again, not asked twice; its
    answer counts once it comes."""
    broker = _Broker()
    collector = QueueDepthCollector(broker, timeout_s=0.2)
    try:
        _collect(collector)
        broker.hung.set()
        broker.depths = {keys.reasoning_queue: 40, keys.tools_queue: 7}
        took = []
        for _ in range(2):
            started = time.monotonic()
            text = _collect(collector)
            took.append(time.monotonic() - started)
            assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 12
            assert _value(text, "orga_broker_up") == 0
        assert broker.calls == 2  # one before, one hanging: not asked again while it hangs
        assert max(took) < 2.0, took
        broker.hung.clear()
        broker.release.set()
        wait = time.monotonic() + 10
        while time.monotonic() < wait:
            text = _collect(collector)
            if _value(text, "orga_broker_up") == 1:
                break
        assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 40
    finally:
        broker.release.set()
        collector.close()


def test_the_queue_gauge_reads_a_redis_broker(redis_url: str) -> None:
    """On a Redis broker (the Celery app the relay uses, kombu's passive ``queue_declare``):
    5 calls sent with no worker read as 5 in ``orga.tools``, 0 in ``orga.reasoning``; served
    on the coordinator's endpoint by ``serve_metrics``."""
    settings = OrgaSettings(redis_url=redis_url)  # type: ignore[call-arg]
    sender = CeleryPublisher.from_settings(settings)
    depths = CeleryPublisher.from_settings(settings, broker_depths=True)
    try:
        with redis.Redis.from_url(redis_url) as client:
            client.delete(keys.reasoning_queue, keys.tools_queue)
        for n in range(5):
            sender.app.send_task(keys.tool_task_name, args=["{}"], queue=keys.tools_queue,
                                 task_id=f"depth-{n}")  # fmt: skip
        port = _free_port()
        serve_metrics(port, redis_url, queue_depths=depths)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert _value(text, "orga_queue_depth", queue=keys.tools_queue) == 5
        assert _value(text, "orga_queue_depth", queue=keys.reasoning_queue) == 0
        assert _value(text, "orga_broker_up") == 1
    finally:
        sender.close()
        depths.close()
        with redis.Redis.from_url(redis_url) as client:
            client.delete(keys.reasoning_queue, keys.tools_queue)
