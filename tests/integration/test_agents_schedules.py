"""The agent registry and schedules end to end: the real ``orga`` entry point in a subprocess,
a real Redis, real Celery workers and real coordinator processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from coordinator.client import OrgaClient
from coordinator.schedules import Scheduler
from shared import keys
from shared.schedule import Schedule, fire_key, fire_task_id
from tests.integration.harness import (
    REPO,
    Cluster,
    clean_env,
    on_16_partitions,
    wait_until,
)

pytestmark = pytest.mark.integration

ORGA = Path(sys.executable).with_name("orga")
AGENT = REPO / "examples" / "agents" / "calculator-fixer.yaml"
AGENT_TASK = REPO / "examples" / "agents" / "task.yaml"
SCHEDULED_TASK = REPO / "examples" / "schedule" / "task.yaml"


def _orga(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.update(ORGA_REDIS_URL=cluster.redis_url, ORGA_WORKSPACE_ROOT=str(cluster.workspaces))
    env.update(ORGA_PARTITIONS=str(cluster.partitions), COLUMNS="200")
    return subprocess.run(
        [str(ORGA), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return done.stdout


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- agents ----------------------------------------------------------------------------------


def test_a_registered_agent_runs_a_task_that_names_it(cluster: Cluster, tmp_path: Path) -> None:
    """A task naming a registered agent completes with the profile's fields and its override."""
    assert "agent calculator-fixer registered" in _ok(_orga(cluster, "agents", "add", str(AGENT)))
    listed = json.loads(_ok(_orga(cluster, "agents", "list", "--json")))
    assert [a["name"] for a in listed] == ["calculator-fixer"]
    shown = json.loads(_ok(_orga(cluster, "agents", "show", "calculator-fixer")))
    assert shown["provider"]["script"] == str(REPO / "examples" / "bugfix" / "script.yaml")

    result = json.loads(_ok(_orga(cluster, "run", str(AGENT_TASK), "--json", "--timeout", "90")))
    assert result["status"] == "completed", cluster.logs()
    assert len(result["milestones"]) == 3
    spec = cluster.client().record(result["task_id"]).spec
    assert spec.agent == "calculator-fixer" and spec.agent_id == "calculator-fixer"
    assert spec.provider.kind == "scripted"
    assert spec.system_prompt is not None and spec.system_prompt.startswith("You fix small bugs")
    assert spec.limits.max_iterations == 10
    assert spec.limits.tool_timeout.total_seconds() == 30

    again = _orga(cluster, "agents", "add", str(AGENT))
    assert again.returncode == 1
    assert "'calculator-fixer' is already registered" in _one_line(again.stderr)
    _ok(_orga(cluster, "agents", "add", str(AGENT), "--replace"))


def test_a_task_naming_an_unknown_agent_is_rejected_at_intake(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The coordinator refuses it, naming the agent and the known ones; `orga run` exits 2."""
    _orga(cluster, "agents", "add", str(AGENT), "--replace")
    task = tmp_path / "task.yaml"
    task.write_text("goal: g\nagent: calculator-fixr\n", encoding="utf-8")
    done = _orga(cluster, "run", str(task), "--timeout", "30")
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = _one_line(done.stderr)
    assert "agent: 'calculator-fixr' is not a registered agent" in message
    assert "known agents: 'calculator-fixer'" in message


def test_agent_file_typos_and_unknown_names_are_refused(cluster: Cluster, tmp_path: Path) -> None:
    """A typo in a profile exits 2 naming the field; show and remove of an unknown name exit 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: typo\nsytem_prompt: hello\n", encoding="utf-8")
    done = _orga(cluster, "agents", "add", str(bad))
    assert done.returncode == 2
    assert _one_line(done.stderr) == (
        f"invalid agent: {bad}: sytem_prompt: Extra inputs are not permitted (got 'hello')"
    )
    for command in ("show", "remove"):
        missing = _orga(cluster, "agents", command, "nobody")
        assert missing.returncode == 1, missing.stderr
        assert "no agent 'nobody'" in _one_line(missing.stderr)


# -- schedules -------------------------------------------------------------------------------


def test_schedule_commands_add_list_pause_resume_run_remove(cluster: Cluster) -> None:
    """Every `orga schedule` command works as the README shows; `run` submits a task that runs."""
    added = _ok(
        _orga(cluster, "schedule", "add", "cli-demo", "--cron", "*/15 * * * *",
              "--timezone", "Europe/Lisbon", "--catch-up", "once", "--overlap", "queue",
              str(SCHEDULED_TASK))
    )  # fmt: skip
    assert added.startswith("schedule cli-demo added; first fire at ")
    (row,) = [r for r in json.loads(_ok(_orga(cluster, "schedule", "list", "--json")))
              if r["name"] == "cli-demo"]  # fmt: skip
    assert (row["cron"], row["timezone"], row["catch_up"], row["overlap"]) == (
        "*/15 * * * *", "Europe/Lisbon", "once", "queue"
    )  # fmt: skip
    assert row["next_at"] > time.time() and not row["paused"]
    _ok(_orga(cluster, "schedule", "pause", "cli-demo"))
    assert "paused" in _ok(_orga(cluster, "schedule", "list"))
    assert "resumed; next fire at" in _ok(_orga(cluster, "schedule", "resume", "cli-demo"))

    task_id = _ok(_orga(cluster, "schedule", "run", "cli-demo")).strip()
    result = cluster.client().wait(task_id, timeout_s=60)
    assert result["status"] == "completed", cluster.logs()
    spec = cluster.client().record(task_id).spec
    assert spec.metadata["schedule"] == "cli-demo"

    _ok(_orga(cluster, "schedule", "remove", "cli-demo"))
    gone = _orga(cluster, "schedule", "remove", "cli-demo")
    assert gone.returncode == 1 and "no schedule 'cli-demo'" in _one_line(gone.stderr)


def test_schedule_input_errors_exit_2_with_the_fix(cluster: Cluster) -> None:
    """A bad cron, a cron that never fires, an unknown zone and a bad catch-up or overlap name
    the value and the fix (no traceback)."""
    cases = {
        ("--cron", "61 * * * *"): "not a cron expression of five fields",
        ("--cron", "0 0 30 2 *"): "cron '0 0 30 2 *' never fires: no date has a day of the month",
        ("--cron", "* * * * *", "--timezone", "Mars/Olympus"): "not a known IANA time zone",
        ("--cron", "* * * * *", "--catch-up", "twice"): "catch_up: Input should be 'skip'",
        ("--cron", "* * * * *", "--overlap", "twice"): "overlap: Input should be 'allow'",
    }
    for options, expected in cases.items():
        done = _orga(cluster, "schedule", "add", "bad", *options, str(SCHEDULED_TASK))
        assert done.returncode == 2, (options, done.stderr)
        assert expected in _one_line(done.stderr), done.stderr


def _scheduled_tasks(client: OrgaClient, name: str) -> dict[str, list[str]]:
    """The tasks a schedule made, by fire time."""
    found: dict[str, list[str]] = {}
    for row in client.list_tasks(limit=500):
        metadata = client.record(row["task_id"]).spec.metadata
        if metadata.get("schedule") == name:
            found.setdefault(metadata["schedule_fire_at"], []).append(row["task_id"])
    return found


def _intake_read(client: OrgaClient) -> bool:
    """Whether the coordinators have read every intake entry (of every partition) and
    acknowledged it."""
    for p in range(client.partition_count):
        groups = cast("list[dict[str, Any]]", client.redis.xinfo_groups(keys.intake_stream(p)))
        names = (keys.coordinator_group, keys.coordinator_group.encode())
        group = next(g for g in groups if g["name"] in names)
        if group["lag"] != 0 or group["pending"] != 0:
            return False
    return True


def test_two_coordinator_processes_fire_a_due_schedule_once(cluster: Cluster) -> None:
    """Two `orga coordinator` processes make one task of a schedule's due fire."""
    cluster.coordinator(name="c2")
    _ok(_orga(cluster, "schedule", "add", "every-minute", "--cron", "* * * * *",
              str(SCHEDULED_TASK)))  # fmt: skip
    client = cluster.client()
    raw = client.redis.hget(keys.schedules_key, "every-minute")
    schedule = Schedule.model_validate_json(str(raw))
    due = schedule.last_fire_at_or_before(time.time())
    client.redis.zadd(keys.schedules_due_key, {"every-minute": due})  # this minute's fire is due
    wait_until(lambda: client.redis.hexists(keys.schedule_fires_key, "every-minute"), 30, "a fire")
    _ok(_orga(cluster, "schedule", "pause", "every-minute"))
    fired = json.loads(str(client.redis.hget(keys.schedule_fires_key, "every-minute")))
    assert fired["fire_at"] >= due
    assert fired["task_id"] == fire_task_id(fire_key("every-minute", fired["fire_at"]))
    assert client.wait(fired["task_id"], timeout_s=60)["status"] == "completed", cluster.logs()
    # the fire's other submissions (the second coordinator's) are read and answered by now
    wait_until(lambda: _intake_read(client), 30, "every intake entry read and acknowledged")
    by_fire = _scheduled_tasks(client, "every-minute")
    assert fired["task_id"] in [t for ids in by_fire.values() for t in ids]
    assert all(len(ids) == 1 for ids in by_fire.values()), by_fire
    _ok(_orga(cluster, "schedule", "remove", "every-minute"))


@on_16_partitions
def test_a_fire_submitted_by_two_schedulers_makes_one_task(cluster: Cluster) -> None:
    """One fire submitted by two clock-driven schedulers is one task at the real intake."""
    schedule = Schedule.model_validate(
        {"name": "clocked", "cron": "0 * * * *", "task": json.loads(SCHEDULED_TASK_JSON)}
    )
    due = schedule.next_fire_after(time.time() + 7 * 24 * 3600)  # a fire next week

    async def fire_twice() -> list[list[str]]:
        client = Redis.from_url(cluster.redis_url)
        try:
            await client.hset(keys.schedules_key, "clocked", schedule.model_dump_json())
            await client.zadd(keys.schedules_due_key, {"clocked": due})
            first = Scheduler(client, clock=lambda: due + 2, partitions=cluster.partitions)
            second = Scheduler(client, clock=lambda: due + 3, partitions=cluster.partitions)
            return list(await asyncio.gather(first.fire_due(), second.fire_due()))
        finally:
            await client.aclose()

    submitted = asyncio.run(fire_twice())
    task_id = fire_task_id(fire_key("clocked", due))
    assert {t for ids in submitted for t in ids} == {task_id}
    client = cluster.client()
    assert client.wait(task_id, timeout_s=60)["status"] == "completed", cluster.logs()
    entries = [f for _id, f in client.redis.xrange(keys.intake_stream(client.partition(task_id)))
               if f.get("task_id") == task_id]  # fmt: skip
    assert len(entries) == sum(len(ids) for ids in submitted)
    if len(entries) == 2:
        wait_until(lambda: _duplicates(client, task_id) == 1, 30, "the duplicate event")
    assert list(_scheduled_tasks(client, "clocked").values()) == [[task_id]]
    client.redis.hdel(keys.schedules_key, "clocked")
    client.redis.zrem(keys.schedules_due_key, "clocked")


def _duplicates(client: OrgaClient, task_id: str) -> int:
    events: list[tuple[str, dict[str, Any]]] = client.events()
    return sum(1 for _id, e in events if e.get("event") == "duplicate" and e["task_id"] == task_id)


SCHEDULED_TASK_JSON = json.dumps(
    {"goal": "clocked fire", "provider": {"kind": "scripted", "replies": ["fired"]},
     "steps": [{"id": "s", "instruction": "answer"}]}
)  # fmt: skip


# -- the embedded runtime ------------------------------------------------------------------


def _embedded(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.update(ORGA_HOME=str(tmp_path / "home"), ORGA_WORKSPACE_ROOT=str(tmp_path / "ws"))
    return subprocess.run(
        [str(ORGA), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=180,
        check=False,
    )  # fmt: skip


def test_agents_and_schedules_work_on_the_embedded_runtime(tmp_path: Path) -> None:
    """Without ORGA_REDIS_URL, agents and schedules persist in ORGA_HOME; `orga run` uses them."""
    _ok(_embedded(tmp_path, "agents", "add", str(AGENT)))
    result = json.loads(_ok(_embedded(tmp_path, "run", str(AGENT_TASK), "--json")))
    assert result["status"] == "completed"
    assert len(result["milestones"]) == 3
    _ok(_embedded(tmp_path, "schedule", "add", "every-minute", "--cron", "* * * * *",
                  str(SCHEDULED_TASK)))  # fmt: skip
    (row,) = json.loads(_ok(_embedded(tmp_path, "schedule", "list", "--json")))
    assert row["name"] == "every-minute" and row["goal"] == "Record the time of this fire."
