"""What a worker does with one dispatch, as plain async functions (no Celery here).

``run_reasoning`` runs the Reason and Gate phases of one iteration with the same phase classes as
the in-process runner; ``run_tool_call`` runs one tool call through the same executor. The
Celery tasks in :mod:`workers.tasks` only decode the payload, call these, and publish the result.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from shared.actions import Observation, ToolCallAction
from shared.conversation import Conversation
from shared.errors import ConfigError
from shared.inference import ToolDefinition
from shared.loop_types import LoopConfig, LoopState
from shared.policy import PolicySpec
from shared.protocol import (
    ErrorKind,
    ReasonedMessage,
    ReasonRequest,
    ToolObservedMessage,
    ToolRequest,
)
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.schema import denial_message, schema_failure_message, validate_tool_arguments
from workers.phases import LoopTermination, Reasoning
from workers.providers.base import (
    InferenceError,
    InferenceProvider,
    InferenceTimeoutError,
    ProviderError,
    RateLimitedError,
)
from workers.providers.rate_limit import recording_waits
from workers.tools.base import ToolContext

__all__ = [
    "AlreadyFitted",
    "WorkerServices",
    "failure_kind",
    "onward",
    "prepare_tools",
    "prepare_workspace",
    "resolution_arguments",
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

    async def execute(self, request: ToolRequest, context: ToolContext) -> ToolObservedMessage:
        """Run one approved tool call through the executor."""
        ...

    async def execute_batch(
        self, request: ReasonRequest, calls: Sequence[ToolCallAction], context: ToolContext
    ) -> list[ToolObservedMessage]:
        """Run the approved calls of an iteration (``act_inline``), concurrently."""
        ...

    def allow_private_network(self) -> bool:
        """Whether web_fetch may reach private addresses."""
        ...

    def gate(self, policy: PolicySpec) -> ReasoningPolicyGate:
        """The gate a policy spec describes (built once per spec)."""
        ...


def prepare_tools(
    definitions: Sequence[ToolDefinition], config: LoopConfig, allowed: Sequence[str] | None
) -> LoopConfig:
    """Tool definitions for the model: the allow-list, then the task's tool profile."""
    tools = list(config.tool_definitions) or list(definitions)
    if allowed is not None:
        tools = [t for t in tools if t.name in set(allowed)]
    if config.tool_profile is not None:
        tools = config.tool_profile.filter_tools(tools)
    return config.model_copy(update={"tool_definitions": tools})


def failure_kind(exc: BaseException) -> ErrorKind:
    """What a failure in a worker is, for the coordinator (``WorkerFailedMessage.error_kind``):
    a configuration error fails the task at once, a transient one may be tried again."""
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, RateLimitedError | ProviderError | InferenceTimeoutError | TimeoutError):
        return "transient"
    return "internal"


def prepare_workspace(workspace: Path, template: str | None) -> Path:
    """Create the task's workspace; a template folder is copied in once, atomically.

    A template that is not a folder is a configuration error (the task names it).
    """
    if workspace.exists():
        return workspace
    if template is not None and not Path(template).is_dir():
        raise ConfigError(
            f"workspace_template {template!r} is not a folder on this worker; give the path of "
            "an existing folder (absolute, or relative to the task file) or remove it"
        )
    workspace.parent.mkdir(parents=True, exist_ok=True)
    if template is None:
        workspace.mkdir(exist_ok=True)
        return workspace
    staging = workspace.parent / f".{workspace.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    shutil.copytree(template, staging, symlinks=True)
    try:
        staging.rename(workspace)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not workspace.exists():
            raise
    return workspace


def _gate_context(request: ReasonRequest | ToolRequest, iteration: int) -> GateContext:
    fence = request.fence
    return GateContext(
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
    """Reason and Gate for one iteration (and Act when ``act_inline``)."""
    started = time.monotonic()
    state = _loop_state(request)
    known = len(state.conversation)
    with recording_waits() as waits:
        try:
            checking = await Reasoning(state, _reasoning_config(request, services)).produce_output(
                services.provider(request), AlreadyFitted()
            )
        except LoopTermination as stop:
            _raise_config_error(stop)
            return ReasonedMessage(
                fence=request.fence,
                new_messages=state.conversation.messages[known:],
                usage=state.total_usage.delta_since(request.usage),
                termination=stop.reason,
                duration_ms=(time.monotonic() - started) * 1000,
                provider_waits=waits,
            )
    gate = services.gate(request.policy)
    dispatching = await checking.check_policy(gate, _gate_context(request, state.iteration))
    approved = [a for a in dispatching.approved if isinstance(a, ToolCallAction)]
    acted = None
    chained: list[str] = []
    if request.act_inline and approved and dispatching.terminal_output is None:
        acted = await services.execute_batch(request, approved, _tool_context(request, services))
    elif request.chain_tools and approved and dispatching.terminal_output is None:
        chained = [c.call_id for c in approved[: request.config.max_concurrent_tools]]
    return ReasonedMessage(
        fence=request.fence,
        new_messages=state.conversation.messages[known:],
        actions=checking.proposed_actions,
        approved_calls=approved,
        denied_count=dispatching.denied_count,
        usage=checking.usage,
        terminal_output=dispatching.terminal_output,
        acted=acted,
        chained=chained,
        duration_ms=(time.monotonic() - started) * 1000,
        provider_waits=waits,
    )


def _raise_config_error(stop: LoopTermination) -> None:
    """A model call that failed because of the configuration (a rejected key, an unknown
    model) is not an attempt that failed: it is raised for the worker to report as such."""
    cause = stop.__cause__
    if isinstance(cause, InferenceError) and isinstance(cause, ConfigError):
        raise cause


def onward(
    request: ReasonRequest, message: ReasonedMessage
) -> tuple[ReasonedMessage | None, list[ToolRequest]]:
    """What a reasoning worker sends: its ``reasoned`` message for the coordinator (None when
    it travels with its only call) and the tool calls it chains (``chain_tools``).

    A lone approved call carries the message (``ToolRequest.completes``): the tool worker
    answers for the whole iteration. Several calls go out on their own, each to any tool
    worker, and the message goes to the coordinator at once.
    """
    chained = set(message.chained)
    requests = [request.tool_request(c) for c in message.approved_calls if c.call_id in chained]
    if len(requests) == 1 and len(message.approved_calls) == 1:
        return None, [requests[0].model_copy(update={"completes": message})]
    return message, requests


def _loop_state(request: ReasonRequest) -> LoopState:
    return LoopState(
        agent_id=request.agent_id,
        iteration=request.fence.iteration,
        total_usage=request.usage,
        conversation=request.conversation,  # decoded for this call alone: no copy needed
    )


def _reasoning_config(request: ReasonRequest, services: WorkerServices) -> LoopConfig:
    """The model sees the allowed tools (none when it is asked for a plan)."""
    if request.purpose == "plan":
        return request.config.model_copy(update={"tool_definitions": []})
    return prepare_tools(services.tool_definitions(), request.config, request.allowed_tools)


def _tool_context(request: ReasonRequest, services: WorkerServices) -> ToolContext:
    workspace = prepare_workspace(Path(request.workspace), request.workspace_template)
    return ToolContext(
        workspace=workspace,
        timeout_s=request.config.tool_timeout.total_seconds(),
        allow_private_network=services.allow_private_network(),
        agent_id=request.agent_id,
        task_id=request.fence.task_id,
    )


async def run_tool_calls(
    request: ToolRequest, services: WorkerServices
) -> list[ToolObservedMessage] | ReasonedMessage:
    """The request's call and the ``also`` calls, concurrently, one observation each; or, for
    a call that ``completes`` a reasoning, that reasoning with the call's outcome in ``acted``."""
    if request.completes is not None:
        observed = await run_tool_call(request, services)
        return request.completes.model_copy(update={"acted": [observed], "chained": []})
    calls = [request.action, *request.also]
    single = [
        request.model_copy(
            update={"action": call, "fence": request.fence.for_call(call.call_id), "also": []}
        )
        for call in calls
    ]
    return list(await asyncio.gather(*(run_tool_call(r, services) for r in single)))


async def run_tool_call(request: ToolRequest, services: WorkerServices) -> ToolObservedMessage:
    """One tool call: gated first when it is a pre-hydration resolution."""
    started = time.monotonic()
    if request.purpose == "prehydrate":
        arguments = resolution_arguments(
            services.tool_definitions(), request.action.name, request.action.parsed_arguments()
        )
        action = request.action.model_copy(update={"arguments": json.dumps(arguments)})
        request = request.model_copy(update={"action": action})
    if request.gated:
        refusal = await _refusal(request, services)
        if refusal is not None:
            return ToolObservedMessage(
                fence=request.fence,
                observation=refusal,
                duration_ms=(time.monotonic() - started) * 1000,
            )
    workspace = prepare_workspace(Path(request.workspace), request.workspace_template)
    timeout_s = request.config.tool_timeout.total_seconds()
    if request.purpose == "verify":
        timeout_s = float(request.action.parsed_arguments().get("timeout_s", timeout_s))
    context = ToolContext(
        workspace=workspace,
        timeout_s=timeout_s,
        allow_private_network=services.allow_private_network(),
        agent_id=request.agent_id,
        task_id=request.fence.task_id,
    )
    message = await services.execute(request, context)
    return message.model_copy(update={"duration_ms": (time.monotonic() - started) * 1000})


async def _refusal(request: ToolRequest, services: WorkerServices) -> Observation | None:
    action = request.action
    failure = validate_tool_arguments(action, services.tool_definitions())
    if failure is not None:
        content = schema_failure_message(failure)
        return Observation.tool_error(action.name, content).with_call_id(action.call_id)
    decision = await services.gate(request.policy).evaluate_action(
        action, _gate_context(request, request.fence.iteration)
    )
    if decision.decision == "deny":
        content = denial_message(decision.reason)
        return Observation.tool_error(action.name, content).with_call_id(action.call_id)
    return None
