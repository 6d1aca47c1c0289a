"""What a worker does with one dispatch, as plain async functions (no Celery here).

``run_reasoning`` runs the Reason and Gate phases of one iteration; ``run_tool_call`` runs one
tool call through the executor; :func:`run_dispatch` runs either and says what to send on: the
observations for the coordinator and the tool calls a reasoning chains. Both drivers of the
loop use :func:`run_dispatch`: the Celery tasks in :mod:`workers.tasks` (which only decode the
payload, heartbeat and publish) and the in-process driver (:mod:`orga.inprocess`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import trace

from shared.actions import GateModification, Observation, ToolCallAction
from shared.conventions import KnowledgeSpec, KnowledgeStore
from shared.conversation import Conversation
from shared.delegation import is_delegate
from shared.durations import format_duration
from shared.errors import ConfigError, ProviderUnavailableError, ServiceUnavailableError
from shared.genai import record_tool_result, tool_span
from shared.inference import ToolDefinition
from shared.loop_types import LoopConfig, LoopState
from shared.mcp import McpListing, McpServerSpec, McpTarget, is_mcp_tool
from shared.policy import PolicySpec
from shared.pricing import Price, price_of, unpriced_message
from shared.protocol import (
    ActMode,
    CompleteReasoning,
    ErrorKind,
    Fence,
    ReasonedMessage,
    ReasonRequest,
    RunEach,
    ToolObservedMessage,
    ToolRequest,
    WorkerFailedMessage,
)
from shared.redaction import Redactor
from shared.tracing import (
    Phase,
    context_of,
    phase_span,
    task_traceparent,
    traceparent,
    tracing_installed,
)
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.offered import OfferedToolsGate
from workers.gates.schema import (
    checks_as_draft_2020_12,
    denial_message,
    schema_failure_message,
    validate_tool_arguments,
)
from workers.knowledge import KnowledgeBridge, bridge_config, is_knowledge_tool
from workers.phases import LoopTermination, Reasoning, ToolDispatching
from workers.providers.base import (
    InferenceError,
    InferenceProvider,
    InferenceTimeoutError,
    ProviderError,
    RateLimitedError,
)
from workers.providers.rate_limit import recording_waits
from workers.providers.waiting import CallAbandonedError
from workers.tools.base import ToolContext
from workers.tools.mcp import McpConfigError
from workers.tools.mcp import definitions as mcp_definitions
from workers.tools.workspace import expecting_workspace, resolving_once
from workers.workspaces import (
    SubagentsFolderGate,
    WorkspaceClaims,
    open_subagent_workspace,
    open_task_workspace,
    prepare_workspace,
)

log = logging.getLogger("orga.worker.handlers")

__all__ = [
    "AlreadyFitted",
    "Answer",
    "DispatchOutcome",
    "WorkerServices",
    "failure_kind",
    "live_fences",
    "onward",
    "prepare_tools",
    "prepare_workspace",
    "redacted",
    "resolution_arguments",
    "run_dispatch",
    "run_reasoning",
    "run_tool_call",
    "run_tool_calls",
]


class AlreadyFitted:
    """The coordinator fits the conversation to the budget before it dispatches."""

    def manage_context(self, conversation: Conversation, max_tokens: int) -> bool:
        """Nothing to do: the conversation arrives within the budget."""
        return False

    def strategy_name(self) -> str:
        """Reported in logs."""
        return "coordinator"


class WorkerServices(Protocol):
    """What the handlers need from the worker process (built once per process)."""

    def provider(self, request: ReasonRequest) -> InferenceProvider:
        """The model for this request."""
        ...

    def tool_definitions(self) -> list[ToolDefinition]:
        """Every tool this worker can run."""
        ...

    def reads_only(self, tool: str) -> bool:
        """Whether ``tool`` is a read-only tool of this worker (``ActMode.AUTO`` runs its
        calls here)."""
        ...

    def mcp_servers(self, config: LoopConfig) -> tuple[McpServerSpec, ...]:
        """The MCP servers of a task: the deployment's, then its own."""
        ...

    async def mcp_listing(
        self, request: ReasonRequest | ToolRequest, *, here: bool = False
    ) -> McpListing | None:
        """The task's MCP tools, listed once for the task (None: it has no MCP server); when
        not kept yet, listed by this process (``here``, a tool worker) or by a tool worker."""
        ...

    def starts_processes(self, tool: str) -> bool:
        """Whether ``tool`` starts processes (``run_command``): never run inline, next to the
        model key, but by a tool worker."""
        ...

    async def execute(self, request: ToolRequest, context: ToolContext) -> ToolObservedMessage:
        """Run one approved tool call through the executor."""
        ...

    def allow_private_network(self) -> bool:
        """Whether web_fetch may reach private addresses."""
        ...

    def redactor(self) -> Redactor:
        """Redacts this process's secrets from what a tool call answers."""
        ...

    def gate(self, policy: PolicySpec) -> ReasoningPolicyGate:
        """The gate a policy spec describes (built once per spec)."""
        ...

    def knowledge(self) -> KnowledgeStore:
        """The agents' knowledge store (the one ``recall_knowledge`` searches)."""
        ...

    async def conversation(self, request: ReasonRequest) -> Conversation:
        """The request's conversation: its own, or the stored one it refers to."""
        ...

    async def seed_knowledge(self, agent_id: str, spec: KnowledgeSpec) -> None:
        """Add a task's seeded knowledge to the agent's store (once per process and seed)."""
        ...

    def workspace_claims(self) -> WorkspaceClaims:
        """The sub-agent workspace folders the runtime created (:mod:`workers.workspaces`)."""
        ...


def prepare_tools(
    definitions: Sequence[ToolDefinition],
    config: LoopConfig,
    allowed: Sequence[str] | None,
    mcp: Sequence[ToolDefinition] = (),
) -> LoopConfig:
    """Tool definitions for the model: the knowledge tools only in tasks with a knowledge
    block, the task's MCP tools, then the allow-list, then the task's tool profile."""
    tools = [*(list(config.tool_definitions) or list(definitions)), *mcp]
    if config.knowledge is None:
        tools = [t for t in tools if not is_knowledge_tool(t.name)]
    if allowed is not None:
        tools = [t for t in tools if t.name in set(allowed)]
    if config.tool_profile is not None:
        tools = config.tool_profile.filter_tools(tools)
    return config.model_copy(update={"tool_definitions": tools})


PROVIDER_OUTAGES = (RateLimitedError, ProviderError, InferenceTimeoutError)
"""The model call's errors that say its provider is down (429, 5xx, unreachable, no answer),
once the provider's own retries (``ORGA_PROVIDER_RETRY_DEADLINE_S``) are spent."""


def failure_kind(exc: BaseException) -> ErrorKind:
    """What a failure in a worker is, for the coordinator (``WorkerFailedMessage.error_kind``):
    a configuration error fails the task at once; an outage of its provider or policy engine
    is waited out without using up an attempt; a transient one may be tried again."""
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, ServiceUnavailableError):
        return exc.kind
    if isinstance(exc, PROVIDER_OUTAGES):
        return "provider_unavailable"
    if isinstance(exc, TimeoutError):
        return "transient"
    return "internal"


def _gate_context(request: ReasonRequest | ToolRequest, iteration: int) -> GateContext:
    """The gate's view of a request. Built without validation (``model_construct``): every
    value comes from the request, validated when it was decoded, and is of the field's type
    (GateContext's validation was about 1.4 % of a reasoning worker's busy samples). Every
    field is given: pydantic's ``model_construct`` inspects the signature of a default factory
    each time it calls one (``attributes``'s ``dict``: 14 µs of 20)."""
    fence = request.fence
    return GateContext.model_construct(
        attributes={},
        agent_id=request.agent_id,
        workspace=Path(request.workspace),
        task_id=fence.task_id,
        step_id=fence.step_id,
        iteration=iteration,
        allowed_tools=frozenset(request.allowed_tools) if request.allowed_tools else None,
        delegation_depth=request.config.delegation_depth,
    )


def resolution_arguments(
    definitions: Sequence[ToolDefinition], tool_name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """Pre-hydration sends ``{"input": value}``; give it to the tool's own main parameter.

    A tool whose schema has an ``input`` property gets the arguments unchanged; otherwise the
    value goes to its first required string property (``path`` for file_read, ``url`` for
    web_fetch).
    """
    if set(arguments) != {"input"}:
        return arguments
    definition = next((d for d in definitions if d.name == tool_name), None)
    if definition is None:
        return arguments
    properties = definition.parameters.get("properties", {})
    if "input" in properties:
        return arguments
    required = [p for p in definition.parameters.get("required", []) if p in properties]
    strings = [
        p for p, s in properties.items() if isinstance(s, dict) and s.get("type") == "string"
    ]
    target = next((p for p in required if p in strings), strings[0] if strings else None)
    return {target: arguments["input"]} if target else arguments


async def run_reasoning(request: ReasonRequest, services: WorkerServices) -> ReasonedMessage:
    """Reason and Gate for one iteration (and Act, or chain the calls to the tool workers,
    as ``request.act`` says)."""
    started = time.monotonic()
    state = _loop_state(request, await services.conversation(request))
    knowledge = request.config.knowledge
    if knowledge is not None and request.purpose == "act":
        await _inject_knowledge(request, services, state.conversation, knowledge)
    known = len(state.conversation)
    mcp = await _mcp_definitions(request, services)
    with recording_waits() as waits:
        provider = services.provider(request)
        model = request.provider.model or provider.default_model()
        config = _reasoning_config(request, services, mcp)
        reasoning = Reasoning(state, config, _price(request, model), model)
        try:
            checking = await reasoning.produce_output(provider, AlreadyFitted())
        except LoopTermination as stop:
            _raise_not_the_attempts(stop, provider)
            return ReasonedMessage(
                fence=request.fence,
                new_messages=state.conversation.messages[known:],
                usage=state.total_usage.delta_since(request.usage),
                termination=stop.reason,
                duration_ms=(time.monotonic() - started) * 1000,
                provider_waits=waits,
                model_call=reasoning.call,
            )
    offered = [t.name for t in checking.config.tool_definitions]
    registered = [t.name for t in [*services.tool_definitions(), *mcp]]
    gate = SubagentsFolderGate(OfferedToolsGate(services.gate(request.policy), offered, registered))
    # The file tools run here reuse the real paths the gate resolved (resolving_once says why
    # that is as safe as resolving again).
    with resolving_once():
        with phase_span("gate", task_id=request.fence.task_id, iteration=state.iteration):
            dispatching = await checking.check_policy(gate, _gate_context(request, state.iteration))
        approved = [a for a in dispatching.approved if isinstance(a, ToolCallAction)]
        reasoned_ms = (time.monotonic() - started) * 1000
        acted, chained = await _act_or_chain(request, dispatching, approved, services, state)
    if knowledge is not None and request.purpose == "act" and dispatching.terminal_output:
        await _persist_learnings(request, services, state.conversation, knowledge)
    return ReasonedMessage(
        fence=request.fence,
        new_messages=state.conversation.messages[known:],
        actions=checking.proposed_actions,
        approved_calls=approved,
        held_calls=dispatching.held,
        denied_count=dispatching.denied_count,
        usage=checking.usage,
        terminal_output=dispatching.terminal_output,
        acted=acted,
        chained=chained,
        duration_ms=reasoned_ms,
        provider_waits=waits,
        modifications=dispatching.modifications,
        model_call=reasoning.call,
    )


async def _act_or_chain(
    request: ReasonRequest,
    dispatching: ToolDispatching,
    approved: list[ToolCallAction],
    services: WorkerServices,
    state: LoopState,
) -> tuple[list[ToolObservedMessage] | None, list[str]]:
    """Run the approved calls here, or name those the tool workers run (``request.act``).

    ``tool_dispatch: inline`` runs them here unless one starts processes (``run_command``):
    this process holds the model key, and an agent's command never has it as an ancestor;
    the coordinator then sends the calls to the tool workers."""
    if not approved or dispatching.terminal_output is not None:
        return None, []
    # A delegation is the coordinator's to decide: never run inline, never chained.
    delegates = any(is_delegate(c.name) for c in approved)
    starts = any(services.starts_processes(c.name) for c in approved)
    offered = dispatching.config.tool_definitions
    match request.act:
        case ActMode.INLINE if not delegates and not starts:
            with phase_span("act", task_id=request.fence.task_id, iteration=state.iteration):
                return await _act_inline(request, approved, services, offered), []
        case ActMode.AUTO if _reads_here(request, approved, services):
            with phase_span("act", task_id=request.fence.task_id, iteration=state.iteration):
                return await _act_inline(request, approved, services, offered), []
        case ActMode.CHAIN | ActMode.AUTO:
            runnable = [c for c in approved if not is_delegate(c.name)]
            return None, [c.call_id for c in runnable[: request.config.max_concurrent_tools]]
        case _:
            return None, []


def _raise_not_the_attempts(stop: LoopTermination, provider: InferenceProvider) -> None:
    """A model call that failed because of the configuration (a rejected key, an unknown
    model) or because its provider is down (429, 5xx, unreachable past the retries) is not an
    attempt that failed: it is raised for the worker to report as what it is."""
    cause = stop.__cause__
    if isinstance(cause, InferenceError) and isinstance(cause, ConfigError):
        raise cause
    if isinstance(cause, PROVIDER_OUTAGES):
        raise ProviderUnavailableError(str(cause), service=provider.provider_name()) from cause


async def _inject_knowledge(
    request: ReasonRequest,
    services: WorkerServices,
    conversation: Conversation,
    spec: KnowledgeSpec,
) -> None:
    """Seed the agent's store, then put what it knows of the newest messages in the
    ``[KNOWLEDGE_CONTEXT]`` message of this request (searched again every iteration, never
    stored in the task's conversation). A failing store never stops the loop."""
    try:
        await services.seed_knowledge(request.agent_id, spec)
        bridge = KnowledgeBridge(services.knowledge(), bridge_config(spec))
        await bridge.inject_context(request.agent_id, conversation)
    except Exception as exc:
        log.warning("knowledge.inject_failed", extra={"task_id": request.fence.task_id,
                                                      "error": str(exc)[:300]})  # fmt: skip


async def _persist_learnings(
    request: ReasonRequest,
    services: WorkerServices,
    conversation: Conversation,
    spec: KnowledgeSpec,
) -> None:
    """A final answer: store a summary of the assistant's answers (``auto_persist``)."""
    try:
        bridge = KnowledgeBridge(services.knowledge(), bridge_config(spec))
        await bridge.persist_learnings(request.agent_id, conversation)
    except Exception as exc:
        log.warning("knowledge.persist_failed", extra={"task_id": request.fence.task_id,
                                                       "error": str(exc)[:300]})  # fmt: skip


def onward(
    request: ReasonRequest, message: ReasonedMessage
) -> tuple[ReasonedMessage | None, list[ToolRequest]]:
    """What a reasoning worker sends: its ``reasoned`` message for the coordinator (None when
    it travels with its only call) and the tool calls it chains (``ActMode.CHAIN``).

    A lone approved call carries the message (:class:`CompleteReasoning`): the tool worker
    answers for the whole iteration. Several calls go out on their own, each to any tool
    worker, and the message goes to the coordinator at once.
    """
    chained = set(message.chained)
    requests = [request.tool_request(c) for c in message.approved_calls if c.call_id in chained]
    if len(requests) == 1 and len(message.approved_calls) == 1:
        return None, [
            requests[0].model_copy(update={"answer": CompleteReasoning(reasoned=message)})
        ]
    return message, requests


Answer = ReasonedMessage | ToolObservedMessage | WorkerFailedMessage
"""What a dispatch answers the coordinator with."""


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """What one dispatch sends on, together: observations for the coordinator, and the tool
    calls a reasoning chains straight to the tool workers; ``failure`` when it failed."""

    answers: list[Answer]
    chained: list[ToolRequest] = field(default_factory=list)
    failure: WorkerFailedMessage | None = None


def live_fences(request: ReasonRequest | ToolRequest) -> list[Fence]:
    """The dispatches this request runs for: its own, and the reasoning a lone chained call
    answers for (``completes``)."""
    completes = request.completes if isinstance(request, ToolRequest) else None
    return [request.fence] if completes is None else [request.fence, completes.fence]


async def run_dispatch(
    request: ReasonRequest | ToolRequest,
    services: WorkerServices,
    passthrough: tuple[type[BaseException], ...] = (),
) -> DispatchOutcome:
    """Run one dispatch. An exception (but those in ``passthrough``, which the caller retries
    itself) becomes a ``worker_failed`` answer for the dispatch it answers for, with its
    ``error_kind`` (:func:`failure_kind`): retryable unless it is a configuration error."""
    try:
        with _span(request) as span:
            if isinstance(request, ReasonRequest):
                message = await run_reasoning(request, services)
                observation, chained = onward(request, message)
                parent = {
                    "trace_parent": traceparent(span)
                    or request.trace_parent
                    or task_traceparent(request.fence.task_id)
                }
                chained = [c.model_copy(update=parent) for c in chained]
                return DispatchOutcome([observation] if observation else [], chained)
            observed = await run_tool_calls(request, services)
            answers: list[Answer] = [*observed] if isinstance(observed, list) else [observed]
            return DispatchOutcome(answers)
    except passthrough:
        raise
    except CallAbandonedError as exc:
        log.info("dispatch.abandoned", extra={"fence": request.fence.token(), "reason": str(exc)})
        return DispatchOutcome([])
    except Exception as exc:
        failure = WorkerFailedMessage(
            fence=live_fences(request)[-1],  # a call carrying its reasoning answers for it
            error=services.redactor().redact(f"{type(exc).__name__}: {exc}")[:2000],
            retryable=not isinstance(exc, ConfigError),
            error_kind=failure_kind(exc),
            service=exc.service if isinstance(exc, ServiceUnavailableError) else None,
        )
        _log_failure(request, failure)
        return DispatchOutcome([failure], failure=failure)


def _log_failure(request: ReasonRequest | ToolRequest, failure: WorkerFailedMessage) -> None:
    """An outage is logged as what it is (``provider.unavailable``, ``policy.unavailable``),
    without a traceback; anything else as ``dispatch.failed`` with its traceback."""
    extra = {"fence": request.fence.token(), "error_kind": failure.error_kind,
             "error": failure.error}  # fmt: skip
    if failure.service is not None:
        event = failure.error_kind.replace("_", ".", 1)
        log.warning(event, extra={**extra, "service": failure.service})
        return
    log.exception("dispatch.failed", extra=extra)


_TOOL_PHASES: dict[str, Phase] = {"act": "act", "prehydrate": "pre_hydrate", "verify": "verify"}


def _span(request: ReasonRequest | ToolRequest) -> AbstractContextManager[trace.Span]:
    """The span of one dispatch, in the task's trace, a child of the span that sent it (none
    without an SDK: :func:`~shared.tracing.phase_span`; nor is the parent decoded then)."""
    if not tracing_installed():
        return nullcontext(trace.INVALID_SPAN)
    reasoning = isinstance(request, ReasonRequest)
    return phase_span(
        "reason" if reasoning else _TOOL_PHASES[request.purpose],
        task_id=request.fence.task_id,
        step_id=request.fence.step_id,
        iteration=request.fence.iteration,
        agent_id=request.agent_id,
        parent=context_of(request.trace_parent, request.fence.task_id),
    )


def _loop_state(request: ReasonRequest, conversation: Conversation) -> LoopState:
    return LoopState(
        agent_id=request.agent_id,
        iteration=request.fence.iteration,
        total_usage=request.usage,
        conversation=conversation,  # decoded or read for this call alone: no copy needed
    )


def _price(request: ReasonRequest, model: str) -> Price | None:
    """The price of this request's model call (cached per model); a ConfigError naming the
    model when the task has a money limit and the model has no known price."""
    spec = request.provider
    price = price_of(model, spec.kind, spec.pricing)
    if price is None and request.config.max_cost_usd is not None:
        raise ConfigError(unpriced_message(model))
    return price


def _reasoning_config(
    request: ReasonRequest, services: WorkerServices, mcp: Sequence[ToolDefinition] = ()
) -> LoopConfig:
    """The model sees the allowed tools (none when it is asked for a plan or a verdict)."""
    if request.purpose in ("plan", "critic"):
        return request.config.model_copy(update={"tool_definitions": []})
    return prepare_tools(services.tool_definitions(), request.config, request.allowed_tools, mcp)


async def _mcp_definitions(
    request: ReasonRequest, services: WorkerServices
) -> list[ToolDefinition]:
    """The task's MCP tools as the model sees them (listed once per task by a tool worker);
    a server that cannot start or list fails the reasoning with a configuration error
    naming it."""
    if request.purpose in ("plan", "critic"):
        return []
    listing = await services.mcp_listing(request)
    if listing is None:
        return []
    if listing.error is not None:
        raise McpConfigError(listing.error)
    return mcp_definitions(listing)


def _reads_here(
    request: ReasonRequest, calls: Sequence[ToolCallAction], services: WorkerServices
) -> bool:
    """``ActMode.AUTO`` runs the calls here when every one is of a read-only tool and the
    task's workspace exists (creating it, or copying its template in, is a tool worker's job:
    a reasoning worker may have the workspaces mounted read-only)."""
    return all(services.reads_only(c.name) for c in calls) and Path(request.workspace).is_dir()


async def _act_inline(
    request: ReasonRequest,
    calls: Sequence[ToolCallAction],
    services: WorkerServices,
    offered: Sequence[ToolDefinition],
) -> list[ToolObservedMessage]:
    """Act in the reasoning worker (``ActMode.INLINE``): each call as the same ``ToolRequest`` a
    tool worker would run, through the same :func:`run_tool_call`, at most
    ``max_concurrent_tools`` at a time. Every call passed the gate's schema pre-check against
    its ``offered`` definition: a tool whose own schema is that one (the registry's, offered
    as it is) and is checked under Draft 2020-12 by both does not check the arguments again
    (:func:`checked_schemas`)."""
    limit = asyncio.Semaphore(request.config.max_concurrent_tools)
    checked = checked_schemas(offered, services.tool_definitions())

    async def one(call: ToolCallAction) -> ToolObservedMessage:
        async with limit:
            return await run_tool_call(
                request.tool_request(call), services, checked_schema=checked.get(call.name)
            )

    return list(await asyncio.gather(*(one(call) for call in calls)))


async def run_tool_calls(
    request: ToolRequest, services: WorkerServices
) -> list[ToolObservedMessage] | ReasonedMessage:
    """The request's call and the ``also`` calls, concurrently, one observation each; or, for
    a call that ``completes`` a reasoning, that reasoning with the call's outcome in ``acted``.

    Pre-hydration resolutions share the task's ``pre_hydration.timeout``: the ones still
    running then are cancelled and answered as timed out (``timed_out`` in the metadata), the
    ones done are kept."""
    match request.answer:
        case CompleteReasoning(reasoned=reasoned):
            observed = await run_tool_call(request, services)
            return reasoned.model_copy(update={"acted": [observed], "chained": []})
        case RunEach(also=also):
            calls = [request.action, *also]
    single = [
        request.model_copy(
            update={
                "action": call,
                "fence": request.fence.for_call(call.call_id),
                "answer": RunEach(),
            }
        )
        for call in calls
    ]
    settings = request.config.pre_hydration
    if request.purpose != "prehydrate" or settings is None:
        return list(await asyncio.gather(*(run_tool_call(r, services) for r in single)))
    return await _within(settings.timeout.total_seconds(), single, services)


async def _within(
    timeout_s: float, requests: Sequence[ToolRequest], services: WorkerServices
) -> list[ToolObservedMessage]:
    """Run ``requests`` concurrently for at most ``timeout_s``; late ones time out."""
    tasks = [asyncio.create_task(run_tool_call(r, services)) for r in requests]
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    text = f"Resolution timed out after {format_duration(timedelta(seconds=timeout_s))}"
    return [
        task.result()
        if task not in pending
        else ToolObservedMessage(
            fence=request.fence,
            observation=Observation.tool_error(request.action.name, text)
            .with_call_id(request.action.call_id)
            .with_metadata(timed_out="true"),
            duration_ms=timeout_s * 1000,
        )
        for task, request in zip(tasks, requests, strict=True)
    ]


def checked_schemas(
    offered: Sequence[ToolDefinition], registered: Sequence[ToolDefinition]
) -> dict[str, dict[str, Any]]:
    """Tool name → the registry's ``parameters`` object, for the tools whose offered schema
    is the registry's own (the same object, or one of the same canonical JSON text) and is
    checked by the gate under Draft 2020-12, as the tool checks it
    (:func:`workers.gates.schema.checks_as_draft_2020_12`): arguments that passed the gate's
    pre-check against the offered schema fit the tool's. A schema with another ``$schema``
    draft is not listed: the tool checks it again."""
    own = {d.name: d.parameters for d in registered}
    return {
        d.name: own[d.name]
        for d in offered
        if d.name in own and checks_as_draft_2020_12(d.parameters, own[d.name])
    }


async def run_tool_call(
    request: ToolRequest,
    services: WorkerServices,
    *,
    checked_schema: dict[str, Any] | None = None,
) -> ToolObservedMessage:
    """One tool call: gated first when it is a pre-hydration resolution. ``checked_schema``:
    the schema the call's arguments passed in this process (:attr:`ToolContext.checked_schema`;
    only for a call that is run as it was checked)."""
    started = time.monotonic()
    if request.purpose == "prehydrate":
        arguments = resolution_arguments(
            services.tool_definitions(), request.action.name, request.action.parsed_arguments()
        )
        action = request.action.model_copy(update={"arguments": json.dumps(arguments)})
        request = request.model_copy(update={"action": action})
    modification: GateModification | None = None
    if request.gated:
        refusal, action, modification = await _gated(request, services)
        if refusal is not None:
            return ToolObservedMessage(
                fence=request.fence,
                observation=refusal,
                duration_ms=(time.monotonic() - started) * 1000,
            )
        request = request.model_copy(update={"action": action})
    workspace, identity = await open_workspace(request, services)
    timeout_s = request.config.tool_timeout.total_seconds()
    if request.purpose == "verify":
        timeout_s = float(request.action.parsed_arguments().get("timeout_s", timeout_s))
    context = ToolContext(
        workspace=workspace,
        timeout_s=timeout_s,
        allow_private_network=services.allow_private_network(),
        agent_id=request.agent_id,
        task_id=request.fence.task_id,
        idempotency_key=None if request.purpose == "verify" else request.fence.call_key(),
        mcp=await _mcp_target(request, services),
        checked_schema=checked_schema if not request.gated else None,
    )
    action = request.action
    with (
        tool_span(action.name, action.call_id, action.arguments, task_id=context.task_id) as span,
        expecting_workspace(identity),
    ):
        message = redacted(await services.execute(request, context), services.redactor())
        record_tool_result(span, message.observation.content, message.observation.is_error)
    duration_ms = (time.monotonic() - started) * 1000
    return message.model_copy(update={"duration_ms": duration_ms, "modification": modification})


async def _mcp_target(request: ToolRequest, services: WorkerServices) -> McpTarget | None:
    """Where a call of an MCP tool goes: the server and tool its task's listing names."""
    name = request.action.name
    if not is_mcp_tool(name):
        return None
    listing = await services.mcp_listing(request, here=True)
    if listing is None or listing.error is not None:
        return None
    return listing.target(name, services.mcp_servers(request.config))


async def open_workspace(
    request: ReasonRequest | ToolRequest, services: WorkerServices, *, create: bool = True
) -> tuple[Path, tuple[int, int] | None]:
    """The request's workspace, made when missing (``create``): a task's own, or a
    sub-agent's folder, checked on every open (:mod:`workers.workspaces`), with the
    ``(device, inode)`` the tools must then find there (None: not checked)."""
    workspace = Path(request.workspace)
    if request.workspace_base is None:
        if create:
            workspace = await open_task_workspace(workspace, request.workspace_template)
        return workspace, None
    return await open_subagent_workspace(
        workspace,
        Path(request.workspace_base),
        services.workspace_claims(),
        request.workspace_template,
        create=create,
    )


def redacted(message: ToolObservedMessage, redactor: Redactor) -> ToolObservedMessage:
    """The message with every echo of a secret (a model key a command printed, encoded or cut
    short) redacted, before it reaches the conversation, the journal or a log."""
    if not redactor:
        return message
    observation = message.observation
    clean = observation.model_copy(
        update={
            "content": redactor.redact(observation.content),
            "metadata": redactor.redact_value(observation.metadata),
        }
    )
    events = [
        event.model_copy(update={"error": redactor.redact(event.error)})
        for event in message.recovery_events
    ]
    reason = message.escalation_reason
    return message.model_copy(
        update={
            "observation": clean,
            "recovery_events": events,
            "escalation_reason": None if reason is None else redactor.redact(reason),
        }
    )


async def _gated(
    request: ToolRequest, services: WorkerServices
) -> tuple[Observation | None, ToolCallAction, GateModification | None]:
    """The schema check and the gate for a call no reasoning worker gated: a refusal, or the
    action to run (the gate's modified one when it modifies, with the change to journal)."""
    action = request.action
    failure = validate_tool_arguments(action, services.tool_definitions())
    if failure is not None:
        content = schema_failure_message(failure)
        return _refused(action, content)
    decision = await services.gate(request.policy).evaluate_action(
        action, _gate_context(request, request.fence.iteration)
    )
    if decision.decision == "deny":
        content = denial_message(decision.reason)
        return _refused(action, content)
    if decision.decision == "ask" and request.edited_by is None:
        # nobody reviews a pre-hydration: it runs before the loop
        content = denial_message(
            f"{decision.reason}; a pre-hydration resolution cannot wait for a reviewer"
        )
        return _refused(action, content)
    if decision.decision == "modify" and isinstance(decision.action, ToolCallAction):
        modified = decision.action.model_copy(update={"call_id": action.call_id})
        failure = validate_tool_arguments(modified, services.tool_definitions())
        if failure is not None:  # as the reasoning path checks a modified call again
            content = schema_failure_message(failure)
            return _refused(action, content)
        change = GateModification(before=action, after=modified, reason=decision.reason)
        return None, modified, change
    return None, action, None


def _refused(
    action: ToolCallAction, content: str
) -> tuple[Observation, ToolCallAction, GateModification | None]:
    """A gated call refused with ``content`` (what the model reads)."""
    return Observation.tool_error(action.name, content).with_call_id(action.call_id), action, None
