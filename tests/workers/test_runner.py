"""The in-process ORGA loop end to end: real tools in a temporary workspace, scripted, function
and HTTP providers against local fake servers (Symbiont §13.8 and §13.16, plus our fixes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shared.actions import Allow, Deny, GateDecision, ProposedAction, ToolCallAction
from shared.context_manager import (
    AnchoredSummary,
    ContextStrategy,
    DefaultContextManager,
    ObservationMasking,
    SlidingWindow,
)
from shared.conventions import InMemoryKnowledgeStore, KnowledgeItem
from shared.conversation import Conversation, ConversationMessage, MessageRole
from shared.events import JournalEntry
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ToolCall,
    ToolDefinition,
    Usage,
)
from shared.journal import BufferedJournal
from shared.loop_types import Fallback, LoopConfig, Retry, TerminationKind
from shared.pre_hydration import PreHydrationConfig
from shared.stagnation import StagnationConfig
from tests.fakes.llm_server import FakeAnthropicServer, FakeOpenAIServer
from workers.circuit_breaker import CircuitBreakerRegistry, InMemoryBreakerStore
from workers.executor import ToolExecutor
from workers.gates.base import GateContext
from workers.gates.permissive import PermissiveGate
from workers.gates.tool_filter import ToolFilterGate
from workers.knowledge import KnowledgeBridge, KnowledgeConfig
from workers.providers.anthropic import AnthropicProvider
from workers.providers.function import FunctionProvider
from workers.providers.openai_compat import OpenAICompatProvider
from workers.providers.scripted import ScriptedProvider
from workers.runner import (
    CommandMilestones,
    ExecutorDispatcher,
    ReasoningLoopRunner,
    local_dispatcher,
)
from workers.tools.base import ToolContext, ToolOutput

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
CHECK = "python3 -c 'from calc import add; assert add(2, 3) == 5'"


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / "calc.py").write_text(BUGGY)
    return tmp_path


def _conversation(task: str = "Fix calc.py so that add adds.") -> Conversation:
    conversation = Conversation.with_system("You are a careful engineer.")
    conversation.push(ConversationMessage.user(task))
    return conversation


def _run(
    runner: ReasoningLoopRunner, config: LoopConfig | None = None, task: str | None = None
) -> Any:
    conversation = _conversation(task) if task else _conversation()
    return asyncio.run(runner.run("agent-1", conversation, config or LoopConfig(max_iterations=10)))


def _events(journal: BufferedJournal) -> list[str]:
    return [entry.event.type for entry in journal.entries()]


BUGFIX_SCRIPT: list[Any] = [
    {
        "text": "Let me look.",
        "tool_calls": [{"name": "file_read", "arguments": {"path": "calc.py"}}],
    },
    {"tool_calls": [{"name": "file_write", "arguments": {"path": "calc.py", "content": FIXED}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": CHECK}}]},
    "add now adds; the check passes.",
]


def test_agent_reads_edits_and_runs_a_command(tmp_path: Path) -> None:
    """A scripted agent fixes a file with real tools; the journal has the whole ORGA shape."""
    workspace = _workspace(tmp_path)
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(BUGFIX_SCRIPT),
        executor=local_dispatcher(),
        journal=journal,
        workspace=workspace,
    )
    result = _run(runner)
    assert result.termination_reason.kind is TerminationKind.COMPLETED
    assert result.output == "add now adds; the check passes."
    assert result.iterations == 4
    assert (workspace / "calc.py").read_text() == FIXED
    tool_messages = [m for m in result.conversation.messages if m.role is MessageRole.TOOL]
    assert "exit code: 0" in tool_messages[-1].content
    events = _events(journal)
    assert events[0] == "Started"
    assert events[-1] == "Terminated"
    assert events.count("ReasoningComplete") == 4
    sequences = [e.sequence for e in journal.entries()]
    assert sequences == list(range(len(sequences)))
    assert result.conversation.messages[2].content == "Let me look."


def test_text_with_tool_calls_is_kept(tmp_path: Path) -> None:
    """Unlike Symbiont, the text that comes with tool calls stays in the conversation."""
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies([*BUGFIX_SCRIPT[:1], "done"]),
        executor=local_dispatcher(),
        workspace=_workspace(tmp_path),
    )
    result = _run(runner)
    assistant = [m for m in result.conversation.messages if m.role is MessageRole.ASSISTANT]
    assert assistant[0].content == "Let me look."
    assert assistant[0].tool_calls


def test_simple_text_response_terminates(tmp_path: Path) -> None:
    """One text reply completes the loop with that output (Symbiont 13.8)."""
    provider = FunctionProvider(
        lambda _c, _o: InferenceResponse(content="The answer is 42.", usage=Usage(total_tokens=30))
    )
    runner = ReasoningLoopRunner(provider=provider, executor=local_dispatcher(), workspace=tmp_path)
    result = _run(runner)
    assert result.output == "The answer is 42."
    assert result.iterations == 1
    assert result.total_usage.total_tokens == 30


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (InferenceResponse(content="", finish_reason=FinishReason.REFUSAL), "refused"),
        (InferenceResponse(content="  "), "no-progress turn"),
    ],
)
def test_refusal_and_empty_turn_end_with_an_error(
    tmp_path: Path, response: InferenceResponse, message: str
) -> None:
    """A refusal or an empty reply is an error termination, with a Terminated event."""
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=FunctionProvider(lambda _c, _o: response),
        executor=local_dispatcher(),
        journal=journal,
        workspace=tmp_path,
    )
    result = _run(runner)
    assert result.termination_reason.kind is TerminationKind.ERROR
    assert message in (result.termination_reason.message or "")
    assert _events(journal)[-1] == "Terminated"


def test_max_iterations_keeps_partial_output(tmp_path: Path) -> None:
    """Hitting the iteration limit journals Terminated and returns what the run had."""
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(
            [{"text": "still looking", "tool_calls": [{"name": "file_list", "arguments": {}}]}],
            on_exhausted="repeat_last",
        ),
        executor=local_dispatcher(),
        journal=journal,
        workspace=tmp_path,
    )
    result = _run(runner, LoopConfig(max_iterations=3))
    assert result.termination_reason.kind is TerminationKind.MAX_ITERATIONS
    assert result.iterations == 3
    assert result.output == "still looking"
    assert _events(journal)[-1] == "Terminated"


def test_timeout_returns_partial_work(tmp_path: Path) -> None:
    """On timeout the conversation, iterations and usage so far come back (Symbiont: nothing)."""
    calls = 0

    async def slow(_conversation: Conversation, _options: InferenceOptions) -> InferenceResponse:
        nonlocal calls
        calls += 1
        if calls > 1:
            await asyncio.sleep(10)
        return InferenceResponse(
            content="listing",
            tool_calls=[ToolCall(id="c1", name="file_list", arguments="{}")],
            usage=Usage(total_tokens=7),
        )

    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=FunctionProvider(slow),
        executor=local_dispatcher(),
        journal=journal,
        workspace=tmp_path,
    )
    result = _run(runner, LoopConfig(timeout=0.5))
    assert result.termination_reason.kind is TerminationKind.TIMEOUT
    assert result.iterations == 1
    assert result.total_usage.total_tokens == 7
    assert len(result.conversation) > 2
    assert _events(journal)[-1] == "Terminated"


def test_max_tokens_terminates(tmp_path: Path) -> None:
    """The token budget is checked before each call."""
    runner = ReasoningLoopRunner(
        provider=FunctionProvider(
            lambda _c, _o: InferenceResponse(
                tool_calls=[ToolCall(id="c", name="file_list", arguments="{}")],
                usage=Usage(total_tokens=600),
            )
        ),
        executor=local_dispatcher(),
        workspace=tmp_path,
    )
    result = _run(runner, LoopConfig(max_total_tokens=1000))
    assert result.termination_reason.kind is TerminationKind.MAX_TOKENS
    assert result.iterations == 2


class _DenyFirst:
    """Denies the first tool call, allows everything else."""

    def __init__(self) -> None:
        self.seen = 0

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        if isinstance(action, ToolCallAction):
            self.seen += 1
            if self.seen == 1:
                return Deny(reason="Not authorized for first call")
        return Allow()


def test_policy_denial_is_fed_back(tmp_path: Path) -> None:
    """A denied call reaches the model as a tool result ``[Policy denied] <reason>``."""
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(
            [{"tool_calls": [{"name": "file_list", "arguments": {}}]}, "I couldn't use the tool."]
        ),
        executor=local_dispatcher(),
        gate=_DenyFirst(),
        journal=journal,
        workspace=tmp_path,
    )
    result = _run(runner)
    assert result.output == "I couldn't use the tool."
    denied = [m for m in result.conversation.messages if m.role is MessageRole.TOOL]
    assert denied[0].content == "[Policy denied] Not authorized for first call"
    evaluated = [e.event for e in journal.entries() if e.event.type == "PolicyEvaluated"]
    assert evaluated[0].denied_count == 1  # type: ignore[union-attr]


def test_default_gate_denies_destructive_commands(tmp_path: Path) -> None:
    """The default gate refuses ``rm -rf /`` and the model is told why."""
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(
            [{"tool_calls": [{"name": "run_command", "arguments": {"command": "rm -rf /"}}]}, "ok"]
        ),
        executor=local_dispatcher(),
        workspace=tmp_path,
    )
    result = _run(runner)
    tool = next(m for m in result.conversation.messages if m.role is MessageRole.TOOL)
    assert tool.content.startswith("[Policy denied]")


def test_schema_failure_is_fed_back(tmp_path: Path) -> None:
    """Arguments that fail the tool's JSON Schema never reach the gate or the tool."""
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(
            [{"tool_calls": [{"name": "file_read", "arguments": {"nope": 1}}]}, "ok"]
        ),
        executor=local_dispatcher(),
        workspace=tmp_path,
    )
    result = _run(runner)
    tool = next(m for m in result.conversation.messages if m.role is MessageRole.TOOL)
    assert tool.content.startswith("[Schema validation failed] tool 'file_read'")


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


def _dispatcher(*tools: _ScriptedTool, **tool_recovery: Any) -> ExecutorDispatcher:
    executor = ToolExecutor(
        {t.definition.name: t for t in tools},
        CircuitBreakerRegistry(InMemoryBreakerStore()),
        sleep=lambda _s: asyncio.sleep(0),
    )
    return ExecutorDispatcher(executor, tool_recovery or None)


def _calls(name: str, count: int) -> list[Any]:
    return [{"tool_calls": [{"name": name, "arguments": {}}]} for _ in range(count)] + ["done"]


def test_tool_timeout_trips_its_breaker(tmp_path: Path) -> None:
    """Three timeouts open the breaker: the fourth call is refused without running the tool."""
    slow = _ScriptedTool("slow", ["sleep"])
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(_calls("slow", 4)),
        executor=_dispatcher(slow, slow=Retry(max_attempts=0)),
        gate=PermissiveGate(),
        workspace=tmp_path,
    )
    result = _run(runner, LoopConfig(tool_timeout=0.05, max_iterations=10))
    results = [m.content for m in result.conversation.messages if m.role is MessageRole.TOOL]
    assert all("timed out" in text for text in results[:3])
    assert "Circuit open for tool 'slow'" in results[3]
    assert slow.calls == 3


def test_retry_then_success(tmp_path: Path) -> None:
    """The Retry strategy re-runs a failing call and journals RecoveryTriggered."""
    flaky = _ScriptedTool("flaky", ["raise", "ok"])
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(_calls("flaky", 1)),
        executor=_dispatcher(flaky, flaky=Retry(max_attempts=2)),
        gate=PermissiveGate(),
        journal=journal,
        workspace=tmp_path,
    )
    result = _run(runner)
    tool = next(m for m in result.conversation.messages if m.role is MessageRole.TOOL)
    assert "flaky answered call 2" in tool.content
    assert "RecoveryTriggered" in _events(journal)


def test_fallback_to_an_alternative_tool(tmp_path: Path) -> None:
    """The Fallback strategy answers with the alternative tool when the first one fails."""
    broken = _ScriptedTool("primary", ["raise"])
    backup = _ScriptedTool("backup", ["ok"])
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(_calls("primary", 1)),
        executor=_dispatcher(broken, backup, primary=Fallback(alternatives=["backup"])),
        gate=PermissiveGate(),
        workspace=tmp_path,
    )
    result = _run(runner)
    tool = next(m for m in result.conversation.messages if m.role is MessageRole.TOOL)
    assert "backup answered" in tool.content
    assert not tool.content.startswith("[Error]")


def test_stagnation_stops_the_run_and_keeps_milestones(tmp_path: Path) -> None:
    """A wandering run after a verified milestone is escalated; the milestone is kept."""
    workspace = _workspace(tmp_path)
    (workspace / "notes.txt").write_text("nothing useful here\n" * 50)
    fix = [
        {"tool_calls": [{"name": "file_write", "arguments": {"path": "calc.py", "content": FIXED}}]}
    ]
    wander = [
        {
            "tool_calls": [
                {"name": "file_read", "arguments": {"path": "notes.txt", "end_line": 50 + i}}
            ]
        }
        for i in range(1, 80)
    ]
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(fix + wander),
        executor=local_dispatcher(),
        workspace=workspace,
        milestone_probe=CommandMilestones({"tests pass": CHECK}, workspace),
    )
    config = LoopConfig(max_iterations=100, stagnation=StagnationConfig())
    result = _run(runner, config)
    assert result.termination_reason.kind in (TerminationKind.ESCALATED, TerminationKind.STAGNATED)
    assert result.milestones == ["tests pass"]
    assert result.iterations < 80


def test_pre_hydration_goes_through_the_gate(tmp_path: Path) -> None:
    """References are resolved as tool calls that the gate may refuse (Symbiont bypasses it)."""
    (tmp_path / "spec.md").write_text("the spec says: add must add")
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(["read it"]),
        executor=local_dispatcher(),
        gate=ToolFilterGate.allow(["file_read"]),
        journal=journal,
        workspace=tmp_path,
    )
    hydration = PreHydrationConfig(resolution_tools={"file": "file_read", "url": "web_fetch"})
    config = LoopConfig(pre_hydration=hydration)
    task = "Use ./spec.md and https://example.com/ref.html"
    result = asyncio.run(runner.run("agent-1", _conversation(task), config))
    context = next(m for m in result.conversation.messages if "[PRE_HYDRATED_CONTEXT]" in m.content)
    assert "the spec says" in context.content
    assert "(1 reference could not be resolved)" in context.content
    event = next(e.event for e in journal.entries() if e.event.type == "PreHydrationComplete")
    assert (event.references_resolved, event.references_failed) == (1, 1)  # type: ignore[union-attr]


def _file_tool_turns(server: Any, tool_call: Any) -> None:
    tool_call([("call_1", "file_read", {"path": "calc.py"})])
    tool_call([("call_2", "file_write", {"path": "calc.py", "content": FIXED})])


def test_openai_compatible_provider_against_fake_server(tmp_path: Path) -> None:
    """The loop works against a server speaking the OpenAI chat-completions wire format."""
    workspace = _workspace(tmp_path)
    with FakeOpenAIServer(api_key="sk-test") as server:
        _file_tool_turns(server, server.respond_tool_calls)
        server.respond_text("fixed")
        provider = OpenAICompatProvider(base_url=server.base_url, api_key="sk-test", model="gpt-4o")
        runner = ReasoningLoopRunner(
            provider=provider, executor=local_dispatcher(), workspace=workspace
        )
        result = _run(runner)
        last = server.requests[-1].body
    assert result.output == "fixed"
    assert (workspace / "calc.py").read_text() == FIXED
    assert [m["role"] for m in last["messages"]][-2:] == ["assistant", "tool"]
    assert {t["function"]["name"] for t in last["tools"]} >= {"file_read", "run_command"}


def test_anthropic_provider_against_fake_server(tmp_path: Path) -> None:
    """The loop works against a server speaking the Anthropic Messages wire format."""
    workspace = _workspace(tmp_path)
    with FakeAnthropicServer(api_key="ak-test") as server:
        _file_tool_turns(server, server.respond_tool_use)
        server.respond_text("fixed")
        provider = AnthropicProvider(base_url=server.base_url, api_key="ak-test")
        runner = ReasoningLoopRunner(
            provider=provider, executor=local_dispatcher(), workspace=workspace
        )
        result = _run(runner)
        last = server.requests[-1].body
    assert result.output == "fixed"
    assert (workspace / "calc.py").read_text() == FIXED
    assert last["messages"][-1]["content"][0]["type"] == "tool_result"
    assert "careful engineer" in json.dumps(last["system"])


def test_journal_entries_serialise(tmp_path: Path) -> None:
    """Every journal entry of a run survives a JSON round trip (it goes to Redis later)."""
    journal = BufferedJournal()
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(BUGFIX_SCRIPT),
        executor=local_dispatcher(),
        journal=journal,
        workspace=_workspace(tmp_path),
    )
    _run(runner)
    for entry in journal.entries():
        assert JournalEntry.model_validate_json(entry.model_dump_json()) == entry


def _knowledge_runner(
    tmp_path: Path, replies: list[Any], auto_persist: bool
) -> tuple[ReasoningLoopRunner, InMemoryKnowledgeStore]:
    store = InMemoryKnowledgeStore(
        {
            "agent-1": [
                KnowledgeItem(
                    content="calc.py follows the house style: type hints", confidence=0.9
                ),
                KnowledgeItem(content="python conventions src/api: return early", confidence=0.8),
                KnowledgeItem(content="python conventions: use pathlib", confidence=0.7),
            ]
        }
    )
    runner = ReasoningLoopRunner(
        provider=ScriptedProvider.from_replies(replies),
        executor=local_dispatcher(),
        knowledge=KnowledgeBridge(store, KnowledgeConfig(auto_persist=auto_persist)),
        workspace=_workspace(tmp_path),
    )
    return runner, store


def test_knowledge_is_injected_and_recall_uses_scoped_conventions(tmp_path: Path) -> None:
    """[KNOWLEDGE_CONTEXT] reaches the model; recall_knowledge walks directory conventions."""
    recall = {"query": "python", "directory": "src/api/handlers", "scope": "conventions"}
    replies = [{"tool_calls": [{"name": "recall_knowledge", "arguments": recall}]}, "noted"]
    runner, store = _knowledge_runner(tmp_path, replies, auto_persist=False)
    result = _run(runner, task="Fix calc.py keeping the house style")
    assert any("[KNOWLEDGE_CONTEXT]" in m.content for m in result.conversation.messages)
    answer = next(m for m in result.conversation.messages if m.role is MessageRole.TOOL)
    assert answer.tool_name == "recall_knowledge"
    assert answer.content.index("return early") < answer.content.index("use pathlib")
    assert len(store.items("agent-1")) == 3


def test_store_knowledge_and_learnings_only_with_auto_persist(tmp_path: Path) -> None:
    """store_knowledge adds a fact; learnings are persisted only when auto_persist is on."""
    fact = {"subject": "calc", "predicate": "has", "object": "a bug in add"}
    replies = [{"tool_calls": [{"name": "store_knowledge", "arguments": fact}]}, "stored"]
    runner, store = _knowledge_runner(tmp_path, replies, auto_persist=False)
    _run(runner)
    assert len(store.items("agent-1")) == 4
    (tmp_path / "again").mkdir()
    runner, store = _knowledge_runner(tmp_path / "again", replies, auto_persist=True)
    _run(runner)
    assert len(store.items("agent-1")) == 5


# -- compaction keeps the task ----------------------------------------------------------------

SYSTEM = "You are a careful engineer."
GOAL = "Goal: make add() in calc.py add."
STEP = "Step 1 of 1 (fix): read calc.py until you are sure, then fix it."


def _task_conversation() -> Conversation:
    """The task as the coordinator writes it, without pins: the runner pins it itself."""
    conversation = Conversation.with_system(SYSTEM)
    conversation.push(ConversationMessage.user(GOAL))
    conversation.push(ConversationMessage.user(STEP))
    return conversation


def _assert_keeps_the_task(conversation: Conversation) -> None:
    """The system prompt, the goal and the step lead the request, and no result is orphaned."""
    assert [(m.role, m.content) for m in conversation.messages[:3]] == [
        (MessageRole.SYSTEM, SYSTEM),
        (MessageRole.USER, GOAL),
        (MessageRole.USER, STEP),
    ]
    calls = {c.id for m in conversation.messages for c in m.tool_calls}
    assert {m.tool_call_id for m in conversation.messages if m.role is MessageRole.TOOL} <= calls


@pytest.mark.parametrize(
    "strategy",
    [SlidingWindow(), ObservationMasking(keep_recent=4), AnchoredSummary(recent_count=4)],
)
def test_a_long_run_under_a_tiny_budget_keeps_the_task_in_every_request(
    tmp_path: Path, strategy: ContextStrategy
) -> None:
    """40 iterations at a 250-token budget: every model request has the system prompt, the
    goal and the step instruction, although most of the history is compacted away."""
    workspace = _workspace(tmp_path)
    (workspace / "notes.txt").write_text("a note about calc.py\n" * 20)
    reads = [
        {"tool_calls": [{"name": "file_read", "arguments": {"path": "notes.txt"}}]}
        for _ in range(40)
    ]
    provider = ScriptedProvider.from_replies([*reads, "done"])
    runner = ReasoningLoopRunner(
        provider=provider,
        executor=local_dispatcher(),
        context_manager=DefaultContextManager(strategy),
        workspace=workspace,
    )
    config = LoopConfig(max_iterations=50, context_token_budget=250)
    result = asyncio.run(runner.run("agent-1", _task_conversation(), config))
    assert result.termination_reason.kind is TerminationKind.COMPLETED
    assert result.iterations == 41
    requests = provider.requests
    assert len(requests) == 41
    for request in requests:
        _assert_keeps_the_task(request.conversation)
    assert max(len(r.conversation) for r in requests) <= 12
    assert len(result.conversation) < 40


def test_a_caller_that_pins_chooses_what_stays(tmp_path: Path) -> None:
    """With a pin of its own the runner pins nothing more: an unpinned step can be dropped."""
    workspace = _workspace(tmp_path)
    conversation = Conversation.with_system(SYSTEM, pin=True)
    conversation.push(ConversationMessage.user(GOAL, pin=True))
    conversation.push(ConversationMessage.user("an old note " * 40))
    reads = [{"tool_calls": [{"name": "file_read", "arguments": {"path": "calc.py"}}]}] * 5
    provider = ScriptedProvider.from_replies([*reads, "done"])
    runner = ReasoningLoopRunner(
        provider=provider, executor=local_dispatcher(), workspace=workspace
    )
    config = LoopConfig(max_iterations=10, context_token_budget=120)
    asyncio.run(runner.run("agent-1", conversation, config))
    last = provider.requests[-1].conversation
    assert [m.content for m in last.pinned_messages()] == [SYSTEM, GOAL]
    assert all("an old note" not in m.content for m in last.messages)


def test_pins_never_reach_the_provider_wire(tmp_path: Path) -> None:
    """Under a tiny budget the OpenAI bodies keep the task and carry no pinned field."""
    workspace = _workspace(tmp_path)
    with FakeOpenAIServer(api_key="sk-test") as server:
        for n in range(6):
            server.respond_tool_calls([(f"call_{n}", "file_read", {"path": "calc.py"})])
        server.respond_text("done")
        provider = OpenAICompatProvider(base_url=server.base_url, api_key="sk-test", model="gpt-4o")
        runner = ReasoningLoopRunner(
            provider=provider, executor=local_dispatcher(), workspace=workspace
        )
        config = LoopConfig(max_iterations=10, context_token_budget=150)
        result = asyncio.run(runner.run("agent-1", _task_conversation(), config))
        bodies = [r.body for r in server.requests]
    assert result.output == "done"
    assert len(bodies) == 7
    for body in bodies:
        assert [m.get("content") for m in body["messages"][:3]] == [SYSTEM, GOAL, STEP]
        assert "pinned" not in json.dumps(body["messages"])
    assert len(bodies[-1]["messages"]) < 3 + 2 * 6
