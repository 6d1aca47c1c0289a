"""The runtime on a real Redis Cluster: 3 masters and 3 replicas started from ``redis-server``
processes by the tests (:mod:`tests.redis_cluster`), 16 partitions, Celery's broker on a private
standalone Redis (``ORGA_BROKER_URL``: Celery cannot use a cluster), real Celery worker processes
and ``orga coordinator`` processes with ``ORGA_REDIS_CLUSTER=true``.

The examples, a review decided with the ``orga`` CLI, a delegation and 50 scripted tasks
complete; ``orga status``, the inbox (HTTP) and the metrics see every partition; and each of
issue 25's hard parts holds on the cluster: a child's ``child_finished`` written by the commit
that ends it, an idempotency key checked and its task created in one step, a review's claim
written with its control entry, a client writing to its task's partition's intake, and a
schedule firing once with two coordinators.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from coordinator.client import OrgaClient
from orga.embedded_redis import EmbeddedRedis
from orga.redis_client import RedisClients
from shared import keys
from shared.schedule import Schedule, fire_key, fire_task_id
from tests.integration.harness import (
    REPO,
    Cluster,
    Process,
    _environment,
    assert_journal_is_clean,
    started_redis,
    status_of,
    wait_until,
)
from tests.redis_cluster import RedisCluster, started_or_required

pytestmark = pytest.mark.integration

PARTITIONS = 16
ORGA = Path(sys.executable).with_name("orga")
TOKEN = "cluster-inbox-token-0123456789"
RECEIVED = re.compile(r"\] received")
"""A Celery worker's log line for a message received."""
EXAMPLES = REPO / "examples"
DELEGATION_AGENTS = [
    EXAMPLES / "delegation" / "agents" / f"{name}.yaml"
    for name in ("summarizer", "checker", "editor")
]


def _scripted(goal: str, reply: str = "done", **extra: Any) -> dict[str, Any]:
    return {
        "goal": goal,
        "provider": {"kind": "scripted", "replies": [reply]},
        "steps": [{"id": "s", "instruction": "answer"}],
        **extra,
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class OnCluster(Cluster):
    """The harness's processes with the state on a Redis Cluster and the broker elsewhere."""

    def __init__(self, redis_url: str, root: Path, broker_url: str, metrics_port: int) -> None:
        super().__init__(redis_url, root)
        self.broker_url = broker_url
        self.metrics_port = metrics_port
        self._client: OrgaClient | None = None

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return _environment(self.redis_url, self.workspaces, {**self.cluster_env(), **extra})

    def cluster_env(self) -> dict[str, str]:
        return {
            "ORGA_REDIS_CLUSTER": "true",
            "ORGA_BROKER_URL": self.broker_url,
            "ORGA_PARTITIONS": str(PARTITIONS),
            "COLUMNS": "250",
        }

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of an ``orga`` command against this deployment."""
        return self._env(extra)

    def client(self) -> OrgaClient:
        if self._client is None:
            clients = RedisClients(self.redis_url, cluster=True)
            self._client = OrgaClient(
                self.redis_url,
                partitions=PARTITIONS,
                client=clients.sync(decode_responses=True),
            )
        return self._client


@pytest.fixture(scope="module")
def deployment(
    redis_cluster: RedisCluster, broker: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OnCluster]:
    """A worker and a coordinator (serving its metrics) on the cluster, 16 partitions."""
    running = OnCluster(
        redis_cluster.url, tmp_path_factory.mktemp("deployment"), broker.url, _free_port()
    )
    try:
        running.worker(concurrency=4)
        running.coordinator(ORGA_METRICS_PORT=str(running.metrics_port))
        yield running
    finally:
        running.stop()


def _ok(done: Any) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return str(done.stdout)


# -- the deployment ----------------------------------------------------------------------------


def test_a_cluster_without_a_broker_url_is_refused(redis_cluster: RedisCluster) -> None:
    """Celery cannot use a cluster as its broker: a coordinator and a worker started with
    ``ORGA_REDIS_CLUSTER=true`` and no ``ORGA_BROKER_URL`` refuse, naming the fix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    env.update(ORGA_REDIS_URL=redis_cluster.url, ORGA_REDIS_CLUSTER="true")
    for command in (["coordinator"], ["worker"]):
        refused = _run(command, env, timeout_s=60)
        assert refused.returncode != 0, refused.stdout
        said = refused.stdout + refused.stderr
        assert "ORGA_REDIS_CLUSTER=true needs ORGA_BROKER_URL" in said, said


def _run(args: list[str], env: dict[str, str], timeout_s: float = 120.0) -> Any:
    import subprocess

    return subprocess.run(
        [str(ORGA), *args], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip


def test_the_examples_complete(deployment: OnCluster) -> None:
    """The bugfix and conventions examples, and the delegation example with its agents
    registered by ``orga agents add``, complete on the cluster."""
    for agent in DELEGATION_AGENTS:
        _ok(deployment.orga("agents", "add", str(agent), "--replace"))
    client = deployment.client()
    submitted = {
        client.submit(EXAMPLES / "bugfix" / "task.yaml"): "step:verify",
        client.submit(EXAMPLES / "conventions" / "task.yaml"): None,
        client.submit(EXAMPLES / "delegation" / "task.yaml"): "step:combine",
    }
    for task_id, milestone in submitted.items():
        result = client.wait(task_id, timeout_s=180)
        assert result["status"] == "completed", (task_id, result, deployment.logs())
        if milestone:
            assert milestone in result["milestones"], result


def test_a_review_is_escalated_and_decided_with_the_cli(deployment: OnCluster) -> None:
    """The wanderer escalates; ``orga review list`` shows it and ``orga review decide --abort``
    ends it."""
    client = deployment.client()
    task_id = client.submit(EXAMPLES / "wanderer" / "task.yaml")
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 120, "the escalation")
    review_id = str(client.status(task_id)["review_id"])
    assert review_id in _ok(deployment.orga("review", "list"))
    _ok(deployment.orga("review", "decide", review_id, "--abort"))
    assert client.wait(task_id, timeout_s=60)["status"] == "aborted"


def _completed_gauge(deployment: OnCluster) -> int:
    """``orga_tasks{status="completed"}`` on the coordinator's /metrics (0 before any); the
    broker told the queue gauge its depths."""
    metrics = httpx.get(f"http://127.0.0.1:{deployment.metrics_port}/metrics", timeout=30).text
    assert re.search(r"^orga_redis_up 1\.0$", metrics, re.M), metrics[:2000]
    # the queues' depths, asked of the broker of its own (a standalone Redis)
    assert re.search(r"^orga_broker_up 1\.0$", metrics, re.M), metrics[:2000]
    assert re.search(r'^orga_queue_depth\{queue="orga.tools"\} [0-9.e+]+$', metrics, re.M)
    completed = re.search(r'^orga_tasks\{status="completed"\} ([0-9.e+]+)$', metrics, re.M)
    return 0 if completed is None else round(float(completed.group(1)))


def test_fifty_tasks_complete_and_status_inbox_and_metrics_see_every_partition(
    deployment: OnCluster,
) -> None:
    """50 scripted tasks on 16 partitions complete; ``orga status`` lists them all, the
    coordinator's metrics count them, and the inbox over HTTP shows an escalation of a
    partition other than the first."""
    client = deployment.client()
    completed_before = _completed_gauge(deployment)  # the module's other tests' tasks
    task_ids = [client.submit(_scripted(f"task {n}")) for n in range(50)]
    used = {keys.partition_of(t, PARTITIONS) for t in task_ids}
    assert len(used) > 8, used
    for task_id in task_ids:
        assert client.wait(task_id, timeout_s=180)["status"] == "completed", deployment.logs()

    listed = json.loads(_ok(deployment.orga("status", "--json")))
    statuses = {row["task_id"]: row["status"] for row in listed}
    missing = [t for t in task_ids if statuses.get(t) != "completed"]
    assert not missing, (missing, listed)  # the 50 newest tasks, every partition's merged

    # exactly these 50 more: every partition counted, none twice
    assert _completed_gauge(deployment) == completed_before + 50

    wanderer = client.submit(EXAMPLES / "wanderer" / "task.yaml", task_id=_id_in_partition(5))
    wait_until(lambda: status_of(client, wanderer) == "awaiting_review", 120, "the escalation")
    review_id = str(client.status(wanderer)["review_id"])
    with _inbox(deployment) as base_url, httpx.Client(base_url=base_url, timeout=60) as session:
        page = session.get("/login")
        csrf = re.search(r'name="csrftoken" value="([^"]+)"', page.text)
        assert csrf, page.text
        logged_in = session.post(
            "/login", data={"csrftoken": csrf.group(1), "token": TOKEN, "name": "ann"}
        )
        assert logged_in.status_code == 303, logged_in.text
        assert review_id in session.get("/").text
    _ok(deployment.orga("review", "decide", review_id, "--abort"))
    assert client.wait(wanderer, timeout_s=60)["status"] == "aborted"


def _id_in_partition(partition: int, prefix: str = "task") -> str:
    return next(
        f"{prefix}-{n}"
        for n in range(100_000)
        if keys.partition_of(f"{prefix}-{n}", PARTITIONS) == partition
    )


class _inbox:  # noqa: N801 - used as a context manager, like a function
    """``orga inbox`` (the console script) serving the deployment, with a token."""

    def __init__(self, deployment: OnCluster) -> None:
        self.port = _free_port()
        env = deployment.env(ORGA_INBOX_TOKEN=TOKEN)
        command = [str(ORGA), "inbox", "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = Process("inbox", command, env, deployment.root / "inbox.log")

    def __enter__(self) -> str:
        self.process.start()
        self.process.wait_for_log(f"review inbox on http://127.0.0.1:{self.port}/")
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.process.stop()


# -- the hard parts --------------------------------------------------------------------------


def test_a_childs_end_reaches_its_parent_in_the_commit_that_ends_it(deployment: OnCluster) -> None:
    """A delegation tree lives in its root's partition (one slot): each child's end is one
    ``child_finished`` applied by the parent, in the parent's partition."""
    for agent in DELEGATION_AGENTS:
        _ok(deployment.orga("agents", "add", str(agent), "--replace"))
    client = deployment.client()
    task_id = client.submit(EXAMPLES / "delegation" / "task.yaml", task_id=_id_in_partition(11))
    result = client.wait(task_id, timeout_s=180)
    assert result["status"] == "completed", (result, deployment.logs())
    children = [f"{task_id}.1", f"{task_id}.2"]
    assert {keys.partition_of(t, PARTITIONS) for t in [task_id, *children]} == {11}
    raw = client.redis.xrange(keys.events_stream(11))
    finished = [
        f["child_task_id"]
        for _i, f in raw  # type: ignore[union-attr]
        if f.get("event") == "child_finished" and f.get("task_id") == task_id
    ]
    assert sorted(finished) == children


def test_one_idempotency_key_submitted_twice_at_once_makes_one_task(deployment: OnCluster) -> None:
    """Two clients submit one idempotency key at the same moment, each with an id of its own
    (both drawn in the key's partition): one task is created, the other id is its alias."""
    spec = _scripted("once only", idempotency_key=f"key-{time.time_ns()}")
    clients = [deployment.client(), OrgaClient(
        deployment.redis_url, partitions=PARTITIONS,
        client=RedisClients(deployment.redis_url, cluster=True).sync(decode_responses=True),
    )]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(lambda c: c.submit(spec), clients))
    assert ids[0] != ids[1]
    client = clients[0]
    wait_until(lambda: client.resolve(ids[0]) == client.resolve(ids[1]), 60, "one task")
    real = client.resolve(ids[0])
    assert client.wait(real, timeout_s=60)["status"] == "completed"
    accepted = [
        f
        for _i, f in client.events(count=100_000)
        if f.get("event") == "accepted" and f.get("task_id") in ids
    ]
    assert len(accepted) == 1, accepted


def test_a_review_claim_is_written_with_its_control_entry(deployment: OnCluster) -> None:
    """Two operators decide one review at once: one claim, one control entry, in the task's
    partition; the other is told the review was already decided."""
    client = deployment.client()
    task_id = client.submit(EXAMPLES / "wanderer" / "task.yaml", task_id=_id_in_partition(9))
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 120, "the escalation")
    review_id = str(client.status(task_id)["review_id"])
    outcomes: list[str] = []

    def decide(decision: str) -> None:
        try:
            client.decide(review_id, decision)
            outcomes.append("sent")
        except Exception as exc:
            outcomes.append(f"refused: {exc}")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(decide, ["abort", "skip"]))
    assert sorted(o.split(":")[0] for o in outcomes) == ["refused", "sent"], outcomes
    control = [
        f
        for _i, f in client.redis.xrange(keys.control_stream(9))  # type: ignore[union-attr]
        if f.get("review_id") == review_id
    ]
    assert len(control) == 1, control
    assert client.wait(task_id, timeout_s=60)["status"] in {"aborted", "completed", "failed"}


def test_a_client_writes_to_its_tasks_partition_intake(deployment: OnCluster) -> None:
    """The client computes the task's partition and writes to that partition's intake (no
    global intake stream, no hot key): each task lands on its own partition's intake."""
    client = deployment.client()
    task_ids = [
        client.submit(_scripted("intake"), task_id=_id_in_partition(p, "in")) for p in (2, 13)
    ]
    for task_id, p in zip(task_ids, (2, 13), strict=True):
        assert client.wait(task_id, timeout_s=60)["status"] == "completed"
        on_intake = [
            f["task_id"]
            for _i, f in client.redis.xrange(keys.intake_stream(p))  # type: ignore[union-attr]
        ]
        assert task_id in on_intake
    assert not client.redis.exists("orga:intake")


def test_a_schedule_fires_once_with_two_coordinators(deployment: OnCluster) -> None:
    """Two coordinators on the cluster make one task of a due fire."""
    second = deployment.coordinator(name="c2")
    try:
        task = deployment.root / "scheduled.json"
        task.write_text(json.dumps(_scripted("scheduled")))
        _ok(deployment.orga("schedule", "add", "cl-minute", "--cron", "* * * * *", str(task)))
        client = deployment.client()
        raw = client.redis.hget(keys.schedules_key, "cl-minute")
        schedule = Schedule.model_validate_json(str(raw))
        due = schedule.last_fire_at_or_before(time.time())
        client.redis.zadd(keys.schedules_due_key, {"cl-minute": due})
        wait_until(lambda: client.redis.hexists(keys.schedule_fires_key, "cl-minute"), 30, "a fire")
        _ok(deployment.orga("schedule", "pause", "cl-minute"))
        fired = json.loads(str(client.redis.hget(keys.schedule_fires_key, "cl-minute")))
        assert fired["task_id"] == fire_task_id(fire_key("cl-minute", fired["fire_at"]))
        assert client.wait(fired["task_id"], timeout_s=60)["status"] == "completed"
        time.sleep(2)  # both coordinators had their turn
        accepted = [
            f
            for _i, f in client.events(count=100_000)
            if f.get("event") == "accepted" and f.get("task_id") == fired["task_id"]
        ]
        assert len(accepted) == 1, accepted
        _ok(deployment.orga("schedule", "remove", "cl-minute"))
    finally:
        second.stop()
        deployment.processes.remove(second)


def test_the_http_api_serves_the_cluster(deployment: OnCluster) -> None:
    """`orga api` on the cluster: one Idempotency-Key sent again once the task is accepted is
    answered with its id (a submission racing the first one is made an alias by the create
    script, tested above), and the task's
    Server-Sent Events (journal entries and status, read in one slot) end with its completion."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    token = "cluster-api-token-0123456789"
    command = [str(ORGA), "api", "--port", str(port)]
    api = Process(
        "api", command, deployment.env(ORGA_API_TOKENS=token), deployment.root / "api.log"
    )
    api.start()
    try:
        api.wait_for_log(f"API on http://127.0.0.1:{port}/v1/")
        task = {
            "goal": "say hi",
            "provider": {"kind": "scripted", "replies": ["hi from the cluster"]},
            "steps": [{"id": "s", "instruction": "say hi"}],
        }
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as c:
            first = c.post("/v1/tasks", json=task, headers={"Idempotency-Key": "cluster-k1"})
            assert first.status_code == 201, first.text
            accepted = first.json()["task_id"]
            wait_until(lambda: c.get(f"/v1/tasks/{accepted}").status_code == 200, 60, "acceptance")
            again = c.post("/v1/tasks", json=task, headers={"Idempotency-Key": "cluster-k1"})
            assert first.status_code == 201 and again.status_code == 201, (first.text, again.text)
            task_id = first.json()["task_id"]
            assert again.json()["task_id"] == task_id
            kinds: list[str] = []
            last: dict[str, Any] = {}
            with c.stream("GET", f"/v1/tasks/{task_id}/events") as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        kinds.append(line.partition(":")[2].strip())
                    elif line.startswith("data:") and kinds and kinds[-1] == "status":
                        last = json.loads(line.partition(":")[2])
            assert "journal" in kinds and kinds[-1] == "status", kinds
            assert last["status"] == "completed", last
            assert c.get(f"/v1/tasks/{task_id}/result").json()["output"] == "hi from the cluster"
    finally:
        api.stop()
    assert deployment.client().wait(task_id, timeout_s=10)["status"] == "completed"


def _queue_worker(running: OnCluster, queue: str, **env: str) -> Process:
    """A Celery worker of one queue of the deployment."""
    name = f"worker-{queue.rsplit('.', 1)[-1]}"
    command = [
        sys.executable, "-m", "celery", "-A", "orga", "worker", "-Q", queue, "-c", "1",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"{name}-{os.getpid()}@%h",
    ]  # fmt: skip
    worker = Process(name, command, running.env(**env), running.root / f"{name}.log").start()
    running.processes.append(worker)
    worker.wait_for_log("ready.")
    return worker


def test_a_reasoning_answered_with_its_chained_call_waits_for_the_tools_queue(
    tmp_path: Path,
) -> None:
    """Issue 25's chaos loss (51 of 100 tasks, "no observation after 4 dispatches"). A
    reasoning that chains its one approved call hands its ``reasoned`` answer to that call
    (``CompleteReasoning``) and is marked answered at once; nothing reaches the observations
    stream until a tool worker runs the call. While the call waits in the tools queue, the
    coordinator must see queueing (that queue's depth, read from the broker), not an answer
    lost: it judged the reasoning "answered and never applied" at twice the heartbeat timeout
    and re-sent it, each re-send chaining one more call behind the others, until the task
    failed. Here the tools queue has no worker for 4 observation deadlines, then one: the
    task completes with one reasoning and one run of its call."""
    cluster = started_or_required(RedisCluster(directory=tmp_path / "cluster"))
    broker = started_redis(tmp_path / "broker")
    (tmp_path / "deployment").mkdir()
    running = OnCluster(cluster.url, tmp_path / "deployment", broker.url, _free_port())
    # a deadline of 6 s; an answered dispatch judged after 2 x 1 s
    timing = {"ORGA_HEARTBEAT_TIMEOUT_S": "1", "ORGA_HEARTBEAT_INTERVAL_S": "0.25"}
    try:
        running.coordinator(**timing)
        _queue_worker(running, keys.reasoning_queue, ORGA_LOG_EACH_TASK="true", **timing)
        client = running.client()
        call = {"name": "run_command", "arguments": {"command": "echo ran >> effects.log"}}
        task = _scripted("chained", **{"limits": {"max_iterations": 4}})
        task["provider"]["replies"] = [{"tool_calls": [call]}, "done"]
        task_id = client.submit(task)
        with redis.Redis.from_url(broker.url) as queues:
            wait_until(lambda: queues.llen(keys.tools_queue) == 1, 60, "the chained call queued")
        # 4 deadlines (the 4 dispatches after which the task used to fail), with other tasks'
        # observations read from its partition's stream meanwhile, as under load: the stream's
        # progress then says its answer is not in it, unread or unapplied
        partition = keys.partition_of(task_id, PARTITIONS)
        others = []
        for _ in range(13):
            other = next(
                t for t in (uuid.uuid4().hex for _ in range(1000))
                if keys.partition_of(t, PARTITIONS) == partition
            )  # fmt: skip
            others.append(client.submit(_scripted("beside"), task_id=other))
            time.sleep(2)
        assert all(client.wait(t, timeout_s=30)["status"] == "completed" for t in others)
        assert status_of(client, task_id) == "running", running.logs()
        seen = [f for _i, f in client.events(count=100_000) if f.get("task_id") == task_id]
        kinds = [f["event"] for f in seen]
        assert "dispatch_lost" not in kinds and "redispatched" not in kinds, seen
        waiting = [f for f in seen if f["event"] == "no_consumer"]
        assert waiting and keys.tools_queue in waiting[-1]["reason"], seen

        tools = _queue_worker(running, keys.tools_queue, ORGA_LOG_EACH_TASK="true", **timing)
        assert client.wait(task_id, timeout_s=60)["status"] == "completed", running.logs()
        assert_journal_is_clean(client.journal(task_id))
        seen = [f for _i, f in client.events(count=100_000) if f.get("task_id") == task_id]
        kinds = [f["event"] for f in seen]
        assert "dispatch_lost" not in kinds and "redispatched" not in kinds, seen
        assert len(RECEIVED.findall(tools.log.read_text("utf-8", "replace"))) == 1
        effects = list(running.workspaces.glob(f"{task_id}*/**/effects.log"))
        assert [e.read_text().splitlines() for e in effects] == [["ran"]], effects
    finally:
        running.stop()
        broker.close()
        cluster.close()
