"""Loop behaviour only the in-process driver can show: tools registered by the embedding
process (breakers, retry, fallback), the providers' HTTP wire against local fake servers
configured in this process (compaction keeps the task in every request on it), and the
knowledge store the embedding process hands in (``auto_persist``).

These were the in-process runner's scenarios (``workers/runner.py``, retired): they now run the
one loop core, :class:`~orga.inprocess.InProcessDriver` over a :class:`WorkerCore`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from coordinator.machine import MachineSettings
from orga.inprocess import InProcessDriver, InProcessRun
from shared.conventions import InMemoryKnowledgeStore
from shared.conversation import MessageRole
from shared.inference import ToolDefinition
from shared.tokens import AnswerView
from tests.fakes.llm_server import FakeAnthropicServer, FakeOpenAIServer
from workers.providers.settings import ProviderKind, ProviderSettings
from workers.runtime import WorkerCore, local_core
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.registry import default_registry

FIXED = "def add(a, b):\n    return a + b\n"


class _ScriptedTool:
    """A tool whose behaviour per call comes from a list: 'ok', 'raise' or 'sleep'."""

    def __init__(self, name: str, behaviours: list[str]) -> None:
        self.behaviours = behaviours
        self.calls = 0
        self._definition = ToolDefinition(
            name=name, description=f"test tool {name}", parameters={"type": "object"}
        )

    @property
    def definition(self) -> ToolDefinition:
        return self._definition

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        behaviour = self.behaviours[min(self.calls, len(self.behaviours) - 1)]
        self.calls += 1
        if behaviour == "raise":
            raise ConnectionError(f"{self._definition.name} endpoint down")
        if behaviour == "sleep":
            await asyncio.sleep(5)
        return ToolOutput(content=f"{self._definition.name} answered call {self.calls}")


def _run(
    core: WorkerCore, root: Path, task: dict[str, Any], *, stream_tokens: bool = False
) -> InProcessRun:
    async def scenario() -> InProcessRun:
        settings = MachineSettings(workspace_root=str(root))
        driver = InProcessDriver(core, settings, stream_tokens=stream_tokens)
        try:
            return await driver.run(task)
        finally:
            await core.aclose()

    return asyncio.run(scenario())


def _with_tools(*tools: _ScriptedTool) -> WorkerCore:
    registry = default_registry(include_entry_points=False)
    for tool in tools:
        registry.register(tool)
    return local_core(registry=registry)


def _calling(name: str, times: int, **spec: Any) -> dict[str, Any]:
    replies: list[Any] = [{"tool_calls": [{"name": name, "arguments": {}}]}] * times
    return {
        "goal": f"use {name}",
        "provider": {"kind": "scripted", "replies": [*replies, "done"]},
        "steps": [{"id": "work", "instruction": f"call {name}"}],
        "policy": {"kind": "permissive"},
        "stagnation": {"enabled": False},
        **spec,
    }


def _tool_texts(run: InProcessRun) -> list[str]:
    return [m.content for m in run.record.conversation.messages if m.role is MessageRole.TOOL]


def test_tool_timeouts_trip_its_breaker(tmp_path: Path) -> None:
    """Three timeouts open the tool's breaker: the fourth call is refused without running."""
    slow = _ScriptedTool("slow", ["sleep"])
    task = _calling(
        "slow",
        4,
        tool_recovery={"slow": {"strategy": "retry", "max_attempts": 0}},
        limits={"tool_timeout": "50ms"},
    )
    run = _run(_with_tools(slow), tmp_path, task)
    results = _tool_texts(run)
    assert all("timed out" in text for text in results[:3]), results
    assert "Circuit open for tool 'slow'" in results[3]
    assert slow.calls == 3
    assert run.status.value == "completed"


def test_retry_then_success(tmp_path: Path) -> None:
    """The Retry strategy re-runs a failing call and journals RecoveryTriggered."""
    flaky = _ScriptedTool("flaky", ["raise", "ok"])
    recovery = {"flaky": {"strategy": "retry", "max_attempts": 2, "base_delay": "10ms"}}
    run = _run(_with_tools(flaky), tmp_path, _calling("flaky", 1, tool_recovery=recovery))
    assert _tool_texts(run) == ["flaky answered call 2"]
    assert [e.event.type for e in run.journal].count("RecoveryTriggered") == 1


def test_fallback_to_an_alternative_tool(tmp_path: Path) -> None:
    """The Fallback strategy answers with the alternative tool when the first one fails."""
    broken = _ScriptedTool("primary", ["raise"])
    backup = _ScriptedTool("backup", ["ok"])
    recovery = {"primary": {"strategy": "fallback", "alternatives": ["backup"]}}
    run = _run(
        _with_tools(broken, backup), tmp_path, _calling("primary", 1, tool_recovery=recovery)
    )
    [text] = _tool_texts(run)
    assert "backup answered" in text
    assert not text.startswith("[Error]")


GOAL = "make add() in calc.py add."
STEP = "read notes.txt until you are sure, then fix calc.py."


@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "sliding_window"},
        {"strategy": "observation_masking", "keep_recent": 4},
        {"strategy": "anchored_summary", "recent_count": 4},
    ],
    ids=lambda s: s["strategy"],
)
def test_a_long_run_under_a_small_budget_keeps_the_task_in_every_request(
    tmp_path: Path, strategy: dict[str, Any]
) -> None:
    """Under a 256-token budget every one of 41 model requests starts with the task's pins."""
    (tmp_path / "notes.txt").write_text("a note about calc.py\n" * 20)
    task = {
        "goal": GOAL,
        "system_prompt": "You are a careful engineer.",
        "provider": {"kind": "openai"},
        "steps": [{"id": "fix", "instruction": STEP}],
        "workspace": str(tmp_path),
        "context": strategy,
        "limits": {"max_iterations": 50, "context_token_budget": 256},
        "stagnation": {"enabled": False},
    }
    with FakeOpenAIServer(api_key="sk-test") as server:
        for n in range(40):
            server.respond_tool_calls([(f"call_{n}", "file_read", {"path": "notes.txt"})])
        server.respond_text("done")
        core = _served_core(ProviderKind.OPENAI, server.base_url, "sk-test")
        run = _run(core, tmp_path, task)
        bodies = [r.body["messages"] for r in server.requests]
    assert run.status.value == "completed"
    assert len(bodies) == 41
    for messages in bodies:
        assert [(m["role"], m["content"]) for m in messages[:3]] == [
            ("system", "You are a careful engineer."),
            ("user", f"Goal: {GOAL}"),
            ("user", f"Step 1 of 1 (fix): {STEP}"),
        ]
        calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
        assert {m["tool_call_id"] for m in messages if m["role"] == "tool"} <= calls
    assert max(len(m) for m in bodies) <= 12


def _bugfix_task(workspace: Path) -> dict[str, Any]:
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return {
        "goal": "make add add",
        "provider": {"kind": "openai"},
        "steps": [{"id": "fix", "instruction": "fix calc.py"}],
        "workspace": str(workspace),
        "limits": {"max_iterations": 10, "context_token_budget": 256},
    }


def _served_core(kind: ProviderKind, base_url: str, api_key: str) -> WorkerCore:
    settings = ProviderSettings(provider=kind, base_url=base_url, api_key=api_key, model="m")
    return local_core(provider_settings=settings)


def test_openai_wire_keeps_the_task_and_carries_no_pin(tmp_path: Path) -> None:
    """On the OpenAI wire the loop fixes the file; every body keeps the task and no pin field."""
    with FakeOpenAIServer(api_key="sk-test") as server:
        server.respond_tool_calls([("call_1", "file_read", {"path": "calc.py"})])
        server.respond_tool_calls([("call_2", "file_write", {"path": "calc.py", "content": FIXED})])
        for n in range(3, 7):
            server.respond_tool_calls([(f"call_{n}", "file_read", {"path": "calc.py"})])
        server.respond_text("fixed")
        core = _served_core(ProviderKind.OPENAI, server.base_url, "sk-test")
        run = _run(core, tmp_path, _bugfix_task(tmp_path))
        bodies = [r.body for r in server.requests]
    assert run.result()["output"] == "fixed"
    assert (tmp_path / "calc.py").read_text() == FIXED
    assert len(bodies) == 7
    for body in bodies:
        contents = [m.get("content") for m in body["messages"][:3]]
        assert contents[1:] == ["Goal: make add add", "Step 1 of 1 (fix): fix calc.py"]
        assert "pinned" not in json.dumps(body["messages"])
    assert [m["role"] for m in bodies[-1]["messages"]][-2:] == ["assistant", "tool"]
    assert {t["function"]["name"] for t in bodies[-1]["tools"]} >= {"file_read", "run_command"}


def test_anthropic_wire_runs_the_loop(tmp_path: Path) -> None:
    """On the Anthropic wire the loop fixes the file, with tool_result blocks and the system."""
    with FakeAnthropicServer(api_key="ak-test") as server:
        server.respond_tool_use([("call_1", "file_read", {"path": "calc.py"})])
        server.respond_tool_use([("call_2", "file_write", {"path": "calc.py", "content": FIXED})])
        server.respond_text("fixed")
        core = _served_core(ProviderKind.ANTHROPIC, server.base_url, "ak-test")
        task = _bugfix_task(tmp_path) | {"provider": {"kind": "anthropic"}}
        run = _run(core, tmp_path, task)
        last = server.requests[-1].body
    assert run.result()["output"] == "fixed"
    assert (tmp_path / "calc.py").read_text() == FIXED
    assert last["messages"][-1]["content"][0]["type"] == "tool_result"
    assert "autonomous software agent" in json.dumps(last["system"])


ANSWER = " ".join(f"word{n}" for n in range(30)) + "."


def _streamed_run(kind: str, root: Path, stream_tokens: bool) -> tuple[InProcessRun, list[Any]]:
    """A two-iteration run against the fake server of ``kind``: a call with a line of text,
    then the answer; the run and the request bodies the model got."""
    task = {
        "goal": "answer at length",
        "provider": {"kind": kind},
        "steps": [{"id": "answer", "instruction": "answer it"}],
        "workspace": str(root),
        "stagnation": {"enabled": False},
    }
    if kind == "openai":
        with FakeOpenAIServer(api_key="k", chunk_delay_s=0.01) as openai:
            openai.respond_tool_calls([("call_1", "file_list", {"path": "."})], content="Looking.")
            openai.respond_text(ANSWER)
            run = _run(_served_core(ProviderKind.OPENAI, openai.base_url, "k"), root, task,
                       stream_tokens=stream_tokens)  # fmt: skip
            return run, [r.body for r in openai.requests]
    with FakeAnthropicServer(api_key="k", chunk_delay_s=0.01) as anthropic:
        anthropic.respond_tool_use([("call_1", "file_list", {"path": "."})], text="Looking.")
        anthropic.respond_text(ANSWER)
        run = _run(_served_core(ProviderKind.ANTHROPIC, anthropic.base_url, "k"), root, task,
                   stream_tokens=stream_tokens)  # fmt: skip
        return run, [r.body for r in anthropic.requests]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_the_in_process_driver_streams_tokens_as_a_worker_does(tmp_path: Path, kind: str) -> None:
    """With stream_tokens the model is asked to stream and the run keeps the entries a worker
    writes to the task's tokens stream: each answer's pieces then stream_done, of the step and
    the iteration its ReasoningComplete carries; the answer a watcher shows is the result."""
    run, bodies = _streamed_run(kind, tmp_path, stream_tokens=True)
    assert run.result()["output"] == ANSWER
    assert [body.get("stream") for body in bodies] == [True, True]
    iterations = [e.event.iteration for e in run.journal if e.event.type == "ReasoningComplete"]
    assert iterations == [1, 2]
    done = [e for e in run.tokens if e.kind == "stream_done"]
    assert [(e.step, e.iteration, e.purpose) for e in done] == [
        ("answer", 1, "act"),
        ("answer", 2, "act"),
    ]
    assert "stream_restarted" not in [e.kind for e in run.tokens]
    assert [e.id for e in run.tokens] == [f"{n}-0" for n in range(1, len(run.tokens) + 1)]
    views: dict[int, AnswerView] = {}
    for entry in run.tokens:
        views.setdefault(entry.iteration, AnswerView()).apply(entry)
    assert (views[1].text, views[1].done) == ("Looking.", True)
    assert (views[2].text, views[2].done) == (ANSWER, True)
    assert len([e for e in run.tokens if e.iteration == 2 and e.kind == "token"]) > 1


def test_the_in_process_driver_streams_only_when_asked(tmp_path: Path) -> None:
    """Without stream_tokens (the default) the model is asked for whole answers; no tokens."""
    run, bodies = _streamed_run("openai", tmp_path, stream_tokens=False)
    assert run.result()["output"] == ANSWER
    assert all("stream" not in body for body in bodies)
    assert run.tokens == []


@pytest.mark.parametrize(("auto_persist", "kept"), [(False, 2), (True, 3)])
def test_learnings_are_persisted_only_with_auto_persist(
    tmp_path: Path, auto_persist: bool, kept: int
) -> None:
    """A seeded fact and a stored one stay; the run's summary is added only with auto_persist."""
    store = InMemoryKnowledgeStore()
    fact = {"subject": "calc", "predicate": "has", "object": "a bug in add"}
    task = {
        "goal": "remember what is wrong with calc",
        "agent_id": "keeper",
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [{"name": "store_knowledge", "arguments": fact}]}, "ok"],
        },
        "steps": [{"id": "work", "instruction": "store the fact"}],
        "knowledge": {
            "facts": [{"subject": "calc", "predicate": "is", "object": "small"}],
            "auto_persist": auto_persist,
        },
    }
    run = _run(local_core(knowledge=store), tmp_path, task)
    assert run.status.value == "completed"
    assert len(store.items("keeper")) == kept


@pytest.mark.parametrize("failure", ["http 500", "timeout", "not json", "refused"])
def test_a_failing_model_never_journals_or_logs_its_base_urls_credentials(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    """A run whose model fails (a 500 through the retries, a timeout, a reply that is not
    JSON, a refused connection) at ``http://user:secretpw@.../v1?api-key=secretkey``: the
    task's error, its journal, its events and the captured logs never hold the password or
    the query's key."""
    with FakeAnthropicServer(api_key="ak-test") as server:
        port = server.port
        if failure == "refused":
            server.stop()
        for _ in range(3):
            if failure == "http 500":
                server.respond_error(500, "upstream down")
            elif failure == "timeout":
                server.respond_json({}, delay_s=3.0)
            elif failure == "not json":
                server.respond_raw("<html>proxy login page</html>")
        settings = ProviderSettings(
            provider=ProviderKind.ANTHROPIC,
            base_url=f"http://user:secretpw@127.0.0.1:{port}/v1?api-key=secretkey",
            api_key="ak-test",
            model="m",
            timeout_s=0.3,
            max_retries=1,
            provider_retry_deadline_s=0,  # max_retries tries, then the outage is the task's
        )
        task = _bugfix_task(tmp_path) | {"provider": {"kind": "anthropic"}}
        core = local_core(provider_settings=settings)
        machine = MachineSettings(
            workspace_root=str(tmp_path), outage_deadline_s=0.5, outage_backoff_s=0.1
        )

        async def scenario() -> InProcessRun:
            try:
                return await InProcessDriver(core, machine).run(task)
            finally:
                await core.aclose()

        with caplog.at_level(logging.DEBUG):
            run = asyncio.run(scenario())
    shown = " ".join(
        [
            json.dumps(run.result(), default=str),
            run.record.model_dump_json(),
            *(entry.model_dump_json() for entry in run.journal),
            json.dumps(run.events),
            json.dumps(run.dead_letters),
            caplog.text,
            *(str(vars(record)) for record in caplog.records),
        ]
    )
    assert run.status.value == "failed", run.result()
    assert f"127.0.0.1:{port}" in json.dumps(run.result(), default=str)  # the error says where
    assert "secretpw" not in shown
    assert "secretkey" not in shown
