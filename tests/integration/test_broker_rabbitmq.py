"""RabbitMQ as the broker (``ORGA_BROKER_URL=amqp://...``): the project's Celery workers, real
processes, on a private RabbitMQ node (``tests.rabbitmq_server``; ``ORGA_TEST_AMQP_URL`` may
name a running one instead), with the state and the observations on a private Redis.

The tasks are published as any Celery client publishes them: ``send_task`` of the project's
Celery configuration (:func:`shared.settings.celery_config`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import kombu
import pytest
import redis
from amqp.exceptions import NotFound, PreconditionFailed
from celery import Celery
from redis.asyncio import Redis as AsyncRedis

from coordinator.queues import QueueGauge
from coordinator.relay import CeleryPublisher
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.actions import ToolCallAction
from shared.loop_types import LoopConfig
from shared.protocol import Fence, ToolObservedMessage, ToolRequest, decode_entry
from shared.settings import OrgaSettings, celery_config
from tests.ci import require
from tests.integration.harness import (
    PARTITIONS,
    REPO,
    Cluster,
    Process,
    _environment,
    run_orga,
    wait_until,
)
from tests.rabbitmq_server import RabbitMQServer, RabbitMQUnavailableError

pytestmark = pytest.mark.integration

QUEUES = (keys.reasoning_queue, keys.tools_queue)


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[RabbitMQServer | str]:
    """A private RabbitMQ node for the module, or the URL in ``ORGA_TEST_AMQP_URL``."""
    configured = os.environ.get("ORGA_TEST_AMQP_URL")
    if configured:
        yield configured
        return
    server = RabbitMQServer()
    try:
        server.start()
    except RabbitMQUnavailableError as error:
        server.cleanup()
        require("a RabbitMQ node (Debian's rabbitmq-server)", str(error))
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def amqp_url(rabbitmq: RabbitMQServer | str) -> str:
    """The broker's URL, with the project's queues emptied (they outlive a test)."""
    url = rabbitmq if isinstance(rabbitmq, str) else rabbitmq.url
    with kombu.Connection(url) as connection:
        for queue in QUEUES:
            channel = connection.channel()
            try:
                channel.queue_purge(queue)
            except NotFound:
                pass  # not declared yet: nothing to empty
            finally:
                channel.close()
    return url


@pytest.fixture
def cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """Room for workers on an emptied Redis, stopped at the end."""
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    running = Cluster(private_redis.url, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _publisher(cluster: Cluster, amqp_url: str) -> Celery:
    """A Celery client with the project's configuration on ``amqp_url``."""
    settings = OrgaSettings(redis_url=cluster.redis_url, broker_url=amqp_url)
    return Celery("orga-test-client", config_source=celery_config(settings, amqp_url))


def _command_call(cluster: Cluster, command: str) -> ToolRequest:
    """A ``run_command`` call of a task of its own, in a workspace of its own."""
    task_id = f"rabbit-{uuid.uuid4().hex[:8]}"
    workspace = cluster.workspaces / task_id
    workspace.mkdir(parents=True)
    return ToolRequest(
        fence=Fence(task_id=task_id, step_id="s", iteration=1, attempt=0, call_id="c1",
                    nonce=uuid.uuid4().hex[:8]),
        agent_id="a",
        action=ToolCallAction(call_id="c1", name="run_command",
                              arguments=json.dumps({"command": command})),
        workspace=str(workspace),
        config=LoopConfig(),
    )  # fmt: skip


def _observations(cluster: Cluster, task_id: str) -> list[ToolObservedMessage]:
    """The ``tool_observed`` answers to ``task_id`` on the observations stream."""
    with redis.Redis.from_url(cluster.redis_url, decode_responses=True) as raw:
        entries = raw.xrange(keys.observations_stream(keys.partition_of(task_id, PARTITIONS)))
    found = []
    for _, fields in entries:
        message = decode_entry(fields)
        if isinstance(message, ToolObservedMessage) and message.fence.task_id == task_id:
            found.append(message)
    return found


def _observed(cluster: Cluster, request: ToolRequest, timeout_s: float = 60.0) -> str:
    """Wait for the one answer to ``request``; its observation's content."""
    task_id = request.fence.task_id
    wait_until(lambda: _observations(cluster, task_id), timeout_s, f"{task_id}'s observation")
    (answer,) = _observations(cluster, task_id)
    assert answer.fence == request.fence
    return answer.observation.content


def _worker(cluster: Cluster, amqp_url: str, name: str, concurrency: int = 2) -> Process:
    """``celery -A orga worker -Q orga.reasoning,orga.tools`` with RabbitMQ as its broker."""
    return cluster.worker(concurrency=concurrency, name=name, ORGA_BROKER_URL=amqp_url)


def _kill_worker(worker: Process) -> None:
    """SIGKILL the worker and its pool processes at once, as a lost machine."""
    for pid in worker.children():
        os.kill(pid, signal.SIGKILL)
    worker.kill()


def test_the_queues_are_quorum_queues(cluster: Cluster, amqp_url: str) -> None:
    """A worker on RabbitMQ declares orga.reasoning and orga.tools as quorum queues: declaring
    either as a classic queue is refused, the node naming its type."""
    _worker(cluster, amqp_url, "w1")
    with kombu.Connection(amqp_url) as connection:
        for queue in QUEUES:
            channel = connection.channel()
            with pytest.raises(PreconditionFailed, match="current is 'quorum'"):
                channel.queue_declare(
                    queue, durable=True, auto_delete=False, arguments={"x-queue-type": "classic"}
                )


def test_a_published_call_is_run_and_observed(cluster: Cluster, amqp_url: str) -> None:
    """A tool call sent with Celery's send_task to RabbitMQ is consumed by a worker, and its
    observation reaches the observations stream in Redis."""
    _worker(cluster, amqp_url, "w1")
    request = _command_call(cluster, "echo answered-through-rabbitmq")
    _publisher(cluster, amqp_url).send_task(keys.tool_task_name, args=[request.model_dump_json()])
    assert "answered-through-rabbitmq" in _observed(cluster, request), cluster.logs()


def test_a_call_whose_worker_is_killed_is_run_by_another(cluster: Cluster, amqp_url: str) -> None:
    """A worker killed (SIGKILL) while it runs a call never acknowledged it: the quorum queue
    delivers it again, to the other worker, which runs it and answers once."""
    first = _worker(cluster, amqp_url, "w1", concurrency=1)
    # Each run says it started, then waits for `go`: the first one is still running when its
    # worker is killed, however long the second worker takes to start.
    command = "echo started >> runs.txt; while [ ! -e go ]; do sleep 0.1; done; echo finished"
    request = _command_call(cluster, command)
    runs = Path(request.workspace) / "runs.txt"
    _publisher(cluster, amqp_url).send_task(keys.tool_task_name, args=[request.model_dump_json()])
    wait_until(runs.exists, 60, "the first worker to start the call")
    _worker(cluster, amqp_url, "w2", concurrency=1)
    _kill_worker(first)
    wait_until(lambda: runs.read_text().count("started") == 2, 60, "the call to run again")
    (Path(request.workspace) / "go").touch()
    assert "finished" in _observed(cluster, request), cluster.logs()
    assert runs.read_text().splitlines() == ["started", "started"]


def test_a_worker_outlives_a_restart_of_the_node(
    cluster: Cluster, amqp_url: str, rabbitmq: RabbitMQServer | str
) -> None:
    """A worker keeps running while its RabbitMQ node restarts, reconnects, and consumes the
    calls published after."""
    if isinstance(rabbitmq, str):
        pytest.skip("ORGA_TEST_AMQP_URL names a node this test cannot restart")
    worker = _worker(cluster, amqp_url, "w1")
    before = _command_call(cluster, "echo before")
    publisher = _publisher(cluster, amqp_url)
    publisher.send_task(keys.tool_task_name, args=[before.model_dump_json()])
    assert "before" in _observed(cluster, before), cluster.logs()
    rabbitmq.restart()
    assert worker.popen is not None and worker.popen.poll() is None, worker.tail()
    after = _command_call(cluster, "echo after the restart")
    publisher.send_task(keys.tool_task_name, args=[after.model_dump_json()])
    assert "after the restart" in _observed(cluster, after, timeout_s=90), cluster.logs()
    assert worker.popen.poll() is None, worker.tail()


def test_the_coordinator_reads_queue_depths_from_rabbitmq(cluster: Cluster, amqp_url: str) -> None:
    """A backlog on RabbitMQ is seen as such: the relay's publisher reads each queue's ready
    messages with a passive declare (a queue not declared yet: 0, and the next one still
    answers), the coordinator's queue gauge and `orga status` take them instead of the empty
    Redis lists; once a worker drains the queue, the depth falls to 0."""
    worker = _worker(cluster, amqp_url, "w1")  # declares the quorum queues
    worker.stop()
    settings = OrgaSettings(redis_url=cluster.redis_url, broker_url=amqp_url)
    publisher = CeleryPublisher.from_settings(settings)
    try:
        app = _publisher(cluster, amqp_url)
        requests = [_command_call(cluster, f"echo backlog-{n}") for n in range(5)]
        for request in requests:
            app.send_task(keys.tool_task_name, args=[request.model_dump_json()])
        depths = publisher.queue_depths(["orga.not-declared", keys.tools_queue, *QUEUES])
        assert depths == {"orga.not-declared": 0, keys.tools_queue: 5, keys.reasoning_queue: 0}

        async def sampled() -> int:
            gauge = QueueGauge(broker=publisher)
            async with AsyncRedis.from_url(cluster.redis_url) as client:
                assert await client.llen(keys.tools_queue) == 0  # nothing on the Redis lists
                await gauge.sample(client, now=1.0)
            return gauge.depth(keys.tools_queue)

        assert asyncio.run(sampled()) == 5
        env = _environment(cluster.redis_url, cluster.workspaces, {"ORGA_BROKER_URL": amqp_url})
        status = run_orga("status", env=env)
        assert status.returncode == 0, status.stderr
        assert "queued: orga.reasoning 0, orga.tools 5;" in status.stdout, status.stdout
        _worker(cluster, amqp_url, "w2")
        for request in requests:
            _observed(cluster, request)
        wait_until(lambda: publisher.queue_depths(QUEUES) == dict.fromkeys(QUEUES, 0), 30)
    finally:
        publisher.close()


def _metric(port: int, name: str, **labels: str) -> float | None:
    """One sample of the coordinator's /metrics (None: not there)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    wanted = f"{name}{{{label_text}}} " if labels else f"{name} "
    line = next((line for line in text.splitlines() if line.startswith(wanted)), None)
    return None if line is None else float(line.split()[-1])


def test_the_prometheus_queue_gauge_reads_rabbitmq(cluster: Cluster, amqp_url: str) -> None:
    """``orga coordinator`` with ``ORGA_METRICS_PORT`` on RabbitMQ: ``orga_queue_depth`` is the
    queues' backlog as RabbitMQ tells it (5 calls waiting in ``orga.tools`` with no worker, 0
    in ``orga.reasoning``; the Redis lists are empty), ``orga_broker_up 1``; 0 once a worker
    drained them."""
    worker = _worker(cluster, amqp_url, "w1")  # declares the quorum queues
    worker.stop()
    port = _free_port()
    cluster.coordinator(ORGA_BROKER_URL=amqp_url, ORGA_METRICS_PORT=str(port))
    app = _publisher(cluster, amqp_url)
    for n in range(5):
        request = _command_call(cluster, f"echo gauge-{n}")
        app.send_task(keys.tool_task_name, args=[request.model_dump_json()])
    wait_until(
        lambda: _metric(port, "orga_queue_depth", queue=keys.tools_queue) == 5, 30, "a depth of 5"
    )
    assert _metric(port, "orga_queue_depth", queue=keys.reasoning_queue) == 0
    assert _metric(port, "orga_broker_up") == 1
    with redis.Redis.from_url(cluster.redis_url) as raw:
        assert raw.llen(keys.tools_queue) == 0  # nothing on the Redis lists
    _worker(cluster, amqp_url, "w2")  # runs them (their answers name no task: dropped)
    wait_until(
        lambda: _metric(port, "orga_queue_depth", queue=keys.tools_queue) == 0, 60, "drained"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


EXAMPLES = REPO / "examples"


def test_tasks_run_end_to_end_with_rabbitmq_as_the_broker(cluster: Cluster, amqp_url: str) -> None:
    """A coordinator and a worker with ORGA_BROKER_URL on RabbitMQ (the coordinator's relay
    publishes every dispatch there) complete the bugfix example and the delegation example,
    whose two sub-agents are tasks of their own."""
    _worker(cluster, amqp_url, "w1", concurrency=3)
    cluster.coordinator(ORGA_BROKER_URL=amqp_url)
    for agent in ("summarizer", "checker", "editor"):
        added = cluster.orga(
            "agents", "add", str(EXAMPLES / "delegation" / "agents" / f"{agent}.yaml")
        )
        assert added.returncode == 0, added.stdout + added.stderr
    client = cluster.client()
    bugfix = client.submit(EXAMPLES / "bugfix" / "task.yaml")
    delegation = client.submit(EXAMPLES / "delegation" / "task.yaml")
    result = client.wait(bugfix, timeout_s=180)
    assert result["status"] == "completed", cluster.logs()
    assert "step:verify" in result["milestones"]
    result = client.wait(delegation, timeout_s=180)
    assert result["status"] == "completed", cluster.logs()
    children = {
        child["task_id"]: child["status"] for child in client.status(delegation)["children"]
    }
    assert children == {f"{delegation}.1": "completed", f"{delegation}.2": "completed"}
