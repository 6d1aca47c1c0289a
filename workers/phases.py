"""Reason and Gate as a typestate: they run here, in the reasoning worker, for both drivers.

Typestate, as Symbiont's ``phases.rs``: each phase is its own class and exposes only the one
transition allowed from it::

    Reasoning.produce_output()   -> PolicyCheck        (raises LoopTermination to stop)
    PolicyCheck.check_policy()   -> ToolDispatching    (the gated batch, handed to Act)

Act and Observe are the coordinator's (``coordinator/machine/acting.py`` and
``observing.py``): every call runs as a ``ToolRequest`` through ``run_tool_call``, whoever runs
it. Skipping the gate, or reasoning or gating again from a gated batch, is therefore an
attribute error that ``mypy --strict`` rejects (see ``tests/typing/``).

Differences from Symbiont, all deliberate:
- text that comes with tool calls is kept in the assistant message instead of dropped;
- a Modify keeps the original tool call id, so no tool_use is left without its result, and a
  Modify into Terminate completes with the Terminate's output (Symbiont returns "");
- a denied Respond or Terminate is fed back to the model instead of vanishing silently;
- a gate may ``Ask``: the tool call is held for a reviewer (``ToolDispatching.held``), neither
  run nor denied; its result joins the turn's once a human decided (:mod:`shared.approval`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from shared.actions import (
    Allow,
    Ask,
    DelegateAction,
    Deny,
    GateDecision,
    GateModification,
    Modify,
    Observation,
    ProposedAction,
    RespondAction,
    TerminateAction,
    ToolCallAction,
)
from shared.approval import HeldCall
from shared.context_manager import ContextManager
from shared.conversation import ConversationMessage
from shared.delegation import is_delegate
from shared.genai import chat_span, record_chat_response
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ModelCall,
    ToolCall,
    Usage,
)
from shared.loop_types import (
    LoopConfig,
    LoopState,
    TerminationKind,
    TerminationReason,
)
from shared.pricing import Price, format_usd
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.schema import denial_message, schema_failure_message, validate_tool_arguments
from workers.providers.base import InferenceError, InferenceProvider

__all__ = [
    "LoopTermination",
    "PolicyCheck",
    "Reasoning",
    "ToolDispatching",
    "tool_call_to_action",
]


class LoopTermination(Exception):  # noqa: N818 - a control signal, not an error
    """Raised by a phase to end the loop; carries the reason the caller can act on."""

    def __init__(self, reason: TerminationReason) -> None:
        super().__init__(str(reason))
        self.reason = reason


def tool_call_to_action(call: ToolCall, delegation_available: bool) -> ProposedAction:
    """A model tool call as an action; ``delegate`` with ``agent`` and ``task`` delegates."""
    if delegation_available and call.name == "delegate":
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if (
            isinstance(args, dict)
            and isinstance(args.get("agent"), str)
            and isinstance(args.get("task"), str)
        ):
            return DelegateAction(call_id=call.id, target=args["agent"], message=args["task"])
    return ToolCallAction(call_id=call.id, name=call.name, arguments=call.arguments)


def _terminate(kind: TerminationKind, message: str | None = None) -> LoopTermination:
    return LoopTermination(TerminationReason(kind=kind, message=message))


# -- Reason ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Reasoning:
    """Ready to ask the model for the next actions; ``price`` prices its call (None: the
    model has no known price, and the call costs ``$0`` in the usage)."""

    state: LoopState
    config: LoopConfig
    price: Price | None = None
    model: str | None = None
    """The model as the task names it (None: the provider's default)."""
    call: ModelCall | None = None
    """The model call made, once made (for the metrics)."""

    async def produce_output(
        self,
        provider: InferenceProvider,
        context_manager: ContextManager,
        delegation_available: bool = False,
    ) -> PolicyCheck:
        """Check the limits, fit the context, call the model, record its proposal."""
        self.state.current_phase = "reasoning"
        self._check_limits()
        compacted = context_manager.manage_context(
            self.state.conversation, self.config.context_token_budget
        )
        options = self._options()
        self._check_budget(options)
        response, usage = await self._call(provider, options)
        self.state.add_usage(usage)
        if response.finish_reason is FinishReason.REFUSAL:
            raise _terminate(
                TerminationKind.ERROR, "model refused the request (stop_reason=refusal)"
            )
        if not response.tool_calls and not response.content.strip():
            raise _terminate(
                TerminationKind.ERROR, "model produced no tool calls and no text (no-progress turn)"
            )
        actions = self._record(response.tool_calls, response.content, delegation_available)
        self.state.iteration += 1
        return PolicyCheck(self.state, self.config, actions, usage, compacted)

    def _check_limits(self) -> None:
        if self.state.iteration >= self.config.max_iterations:
            raise _terminate(
                TerminationKind.MAX_ITERATIONS,
                f"reached max_iterations ({self.config.max_iterations})",
            )
        used = self.state.total_usage.total_tokens
        if used >= self.config.max_total_tokens:
            raise _terminate(
                TerminationKind.MAX_TOKENS,
                f"used {used} tokens of max_total_tokens ({self.config.max_total_tokens})",
            )

    async def _call(
        self, provider: InferenceProvider, options: InferenceOptions
    ) -> tuple[InferenceResponse, Usage]:
        """The model call, in its ``chat {model}`` span, and its usage, priced."""
        model = options.model or self.model or provider.default_model()
        name = provider.provider_name()
        started = time.monotonic()
        with chat_span(
            name,
            model,
            self.state.conversation,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
        ) as span:
            try:
                response = await provider.complete(self.state.conversation, options)
            except InferenceError as exc:
                self.call = _model_call(name, model, "", started)
                raise _terminate(TerminationKind.ERROR, f"Inference failed: {exc}") from exc
            self.call = _model_call(name, model, response.model, started)
            usage = response.usage
            if self.price is not None:
                usage = usage.model_copy(update={"cost_usd": self.price.cost(usage)})
            record_chat_response(span, response, usage)
        return response, usage

    def _check_budget(self, options: InferenceOptions) -> None:
        """Not sent when its worst case (the prompt's estimated tokens at the input rate, or
        the cache-write rate when higher; ``max_tokens`` at the output rate) costs more than
        the task has left."""
        left = self.config.max_cost_usd
        if left is None or self.price is None:
            return
        prompt = self.state.conversation.estimate_tokens()
        worst = self.price.worst_case(prompt, options.max_tokens)
        prompt_rate, output_rate = self.price.worst_rates(prompt)
        if worst > left:
            raise _terminate(
                TerminationKind.BUDGET_EXHAUSTED,
                f"budget exhausted: the next model call could cost up to {format_usd(worst)} "
                f"(~{prompt} prompt tokens, max_tokens {options.max_tokens}, "
                f"{self.price.model or 'model'} at ${prompt_rate:g}/${output_rate:g} per "
                "million tokens) and the task has "
                f"{format_usd(left)} left of limits.max_cost_usd",
            )

    def _options(self) -> InferenceOptions:
        remaining = self.config.max_total_tokens - self.state.total_usage.total_tokens
        return InferenceOptions(
            max_tokens=max(min(remaining, self.config.max_output_tokens), 1),
            temperature=self.config.temperature,
            tool_definitions=self.config.tool_definitions,
            tool_choice=self.config.tool_choice,
        )

    def _record(
        self, calls: list[ToolCall], content: str, delegation_available: bool
    ) -> list[ProposedAction]:
        conversation = self.state.conversation
        if calls:
            conversation.push(ConversationMessage.assistant_tool_calls(calls, content))
            return [tool_call_to_action(call, delegation_available) for call in calls]
        conversation.push(ConversationMessage.assistant(content))
        return [RespondAction(content=content)]


def _model_call(provider: str, model: str, answered_by: str, started: float) -> ModelCall:
    elapsed_ms = (time.monotonic() - started) * 1000
    return ModelCall.model_construct(
        provider=provider, model=model, response_model=answered_by, duration_ms=elapsed_ms
    )


# -- Gate -----------------------------------------------------------------------------------


@dataclass(slots=True)
class PolicyCheck:
    """The model proposed actions; each must pass the schema check and the gate."""

    state: LoopState
    config: LoopConfig
    proposed_actions: list[ProposedAction]
    usage: Usage
    compacted: bool = False

    async def check_policy(
        self, gate: ReasoningPolicyGate, context: GateContext
    ) -> ToolDispatching:
        """Validate and gate every action; denials are fed back to the model."""
        self.state.current_phase = "policy_check"
        verdicts = _Verdicts()
        for action in self.proposed_actions:
            await self._check_one(action, gate, context, verdicts)
        return ToolDispatching(
            state=self.state,
            config=self.config,
            approved=verdicts.approved,
            action_count=len(self.proposed_actions),
            denials=verdicts.denials,
            terminal_output=verdicts.terminal_output,
            held=verdicts.held,
            modifications=verdicts.modifications,
        )

    async def _check_one(
        self,
        action: ProposedAction,
        gate: ReasoningPolicyGate,
        context: GateContext,
        verdicts: _Verdicts,
    ) -> None:
        if isinstance(action, ToolCallAction):
            failure = validate_tool_arguments(action, self.config.tool_definitions)
            if failure is not None:
                self._feed_back(action, schema_failure_message(failure), verdicts, failure)
                return
        decision: GateDecision = await gate.evaluate_action(action, context)
        if isinstance(decision, Allow) and isinstance(action, ToolCallAction):
            decision = await _as_delegation(action, gate, context)
        if isinstance(decision, Allow):
            verdicts.approve(action)
        elif isinstance(decision, Deny):
            self._feed_back(action, denial_message(decision.reason), verdicts, decision.reason)
        elif isinstance(decision, Ask):
            self._hold(action, decision, verdicts)
        elif isinstance(decision, Modify):
            modified = decision.action
            if isinstance(modified, ToolCallAction):
                failure = validate_tool_arguments(modified, self.config.tool_definitions)
                if failure is not None:
                    message = schema_failure_message(f"{failure} (after the gate's modification)")
                    self._feed_back(action, message, verdicts, failure)
                    return
            self._apply_modify(action, decision, verdicts)

    def _hold(self, action: ProposedAction, decision: Ask, verdicts: _Verdicts) -> None:
        """Hold a tool call for a reviewer (the gate's modified one, under the model's id); an
        Ask about anything else, or a modification that fails the schema, is a denial."""
        held = decision.action or action
        if not isinstance(action, ToolCallAction) or not isinstance(held, ToolCallAction):
            reason = f"{decision.reason}; only a tool call can be held for a reviewer"
            self._feed_back(action, denial_message(reason), verdicts, reason)
            return
        held = held.model_copy(update={"call_id": action.call_id})
        failure = validate_tool_arguments(held, self.config.tool_definitions)
        if failure is not None:
            message = schema_failure_message(f"{failure} (after the gate's modification)")
            self._feed_back(action, message, verdicts, failure)
            return
        schema = next(
            (t.parameters for t in self.config.tool_definitions if t.name == held.name), None
        )
        verdicts.held.append(HeldCall(call=held, reason=decision.reason, input_schema=schema))

    def _feed_back(
        self, action: ProposedAction, message: str, verdicts: _Verdicts, reason: str
    ) -> None:
        conversation = self.state.conversation
        call_id = _call_id(action)
        if call_id is not None:
            name = _action_name(action)
            conversation.push(ConversationMessage.tool_result(call_id, name, message))
        else:
            conversation.push(ConversationMessage.user(message))
        denial = Observation.policy_denial(reason)
        verdicts.denials.append(denial.with_call_id(call_id) if call_id else denial)

    def _apply_modify(
        self, original: ProposedAction, decision: Modify, verdicts: _Verdicts
    ) -> None:
        modified = decision.action
        original_id = _call_id(original)
        if isinstance(modified, ToolCallAction | DelegateAction):
            if original_id is not None:
                # Keep the pairing: the tool_use the model emitted gets this action's result.
                modified = modified.model_copy(update={"call_id": original_id})
            else:
                call = _as_tool_call(modified)
                self.state.conversation.push(ConversationMessage.assistant_tool_calls([call]))
        elif original_id is not None:
            # A tool call turned into an answer: close the model's tool_use with a result.
            text = f"[Policy modified] {decision.reason}"
            self.state.conversation.push(
                ConversationMessage.tool_result(original_id, _action_name(original), text)
            )
        verdicts.modifications.append(
            GateModification(before=original, after=modified, reason=decision.reason)
        )
        verdicts.approve(modified)


async def _as_delegation(
    action: ToolCallAction, gate: ReasoningPolicyGate, context: GateContext
) -> GateDecision:
    """A ``delegate`` call the gate allowed as a tool call is also put to it as a delegation
    (its target agent and the depth it would reach), so policies on delegations apply: the
    default gate's depth rule, Cedar's ``Agent`` resource, OPA's ``delegate`` input."""
    if not is_delegate(action.name):
        return Allow()
    arguments = action.parsed_arguments()  # the schema check passed: an object
    view = DelegateAction(
        call_id=action.call_id,
        target=str(arguments.get("agent", "")),
        message=str(arguments.get("goal", "")),
    )
    decision: GateDecision = await gate.evaluate_action(view, context)
    if isinstance(decision, Modify):
        return Deny(
            reason=f"the gate would change the delegation to {view.target!r} "
            f"({decision.reason}); a delegation is allowed or denied as proposed"
        )
    return decision


def _call_id(action: ProposedAction) -> str | None:
    return action.call_id if isinstance(action, ToolCallAction | DelegateAction) else None


def _action_name(action: ProposedAction) -> str:
    if isinstance(action, ToolCallAction):
        return action.name
    if isinstance(action, DelegateAction):
        return f"delegate:{action.target}"
    return action.kind


def _as_tool_call(action: ToolCallAction | DelegateAction) -> ToolCall:
    if isinstance(action, ToolCallAction):
        return ToolCall(id=action.call_id, name=action.name, arguments=action.arguments)
    arguments = json.dumps({"agent": action.target, "task": action.message})
    return ToolCall(id=action.call_id, name="delegate", arguments=arguments)


@dataclass(slots=True)
class _Verdicts:
    approved: list[ProposedAction] = field(default_factory=list)
    denials: list[Observation] = field(default_factory=list)
    terminal_output: str | None = None
    held: list[HeldCall] = field(default_factory=list)
    modifications: list[GateModification] = field(default_factory=list)

    def approve(self, action: ProposedAction) -> None:
        self.approved.append(action)
        if isinstance(action, RespondAction) and self.terminal_output is None:
            self.terminal_output = action.content
        elif isinstance(action, TerminateAction) and self.terminal_output is None:
            self.terminal_output = action.output


# -- Gated: handed to Act -------------------------------------------------------------------


@dataclass(slots=True)
class ToolDispatching:
    """Actions passed the gate: the approved tool calls go to Act (the coordinator's), the
    denials were fed back to the model, ``terminal_output`` is the model's answer if it gave
    one, ``held`` are the calls the gate asked a reviewer about."""

    state: LoopState
    config: LoopConfig
    approved: list[ProposedAction]
    action_count: int
    denials: list[Observation]
    terminal_output: str | None = None
    held: list[HeldCall] = field(default_factory=list)
    modifications: list[GateModification] = field(default_factory=list)
    """The gate's Modify decisions, as applied (journaled as ``GateModified``)."""

    @property
    def denied_count(self) -> int:
        """How many actions the schema check or the gate refused."""
        return len(self.denials)

    def policy_summary(self) -> tuple[int, int]:
        """``(actions evaluated, actions denied)``."""
        return self.action_count, self.denied_count
