"""Reason: ask a reasoning worker for the next iteration, and apply its answer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from coordinator.machine.core import Section
from coordinator.state import Awaiting, AwaitKind
from shared.actions import Observation, ToolCallAction
from shared.approval import HeldCall
from shared.context_manager import DefaultContextManager
from shared.conversation import Conversation, ConversationMessage, MessageRole
from shared.events import (
    GateModified,
    ObservationsCollected,
    PolicyEvaluated,
    ProviderWaited,
    ReasoningComplete,
    ToolsDispatched,
)
from shared.protocol import (
    ActMode,
    ConversationRef,
    Fence,
    ReasonedMessage,
    ReasonRequest,
    ToolObservedMessage,
)
from shared.stagnation import ModelTurn

__all__ = ["TAIL_MAX_BYTES", "Reasoning", "conversation_tail", "tail_wire_bytes"]

TAIL_MAX_BYTES = 16_384
"""The most bytes a reasoning request's conversation tail takes in the Celery message that
carries the request (:func:`tail_wire_bytes`); a longer tail stays in Redis only (the worker
reads it there)."""


def tail_wire_bytes(message: ConversationMessage) -> int:
    """The bytes ``message`` takes in the Celery message of a reasoning request: its JSON in
    the request, escaped again as the JSON string that is the task's one argument (kombu's
    JSON, ASCII-only: ``é`` is 6 bytes there, ``😀`` 12, ``"`` 4), and a comma after it; an
    empty message costs its fields' names and quotes. Counted without encoding it again
    (``json.dumps`` of the JSON text: 3 to 4 times as long): the message's JSON holds no raw
    control character below space, so the second encoding escapes only its quotes and
    backslashes (one byte more each) and writes DEL and each UTF-16 unit of a non-ASCII
    character as ``\\uXXXX`` (six bytes)."""
    text = message.model_dump_json()
    size = len(text) + text.count('"') + text.count("\\") + 5 * text.count("\x7f") + 1
    if text.isascii():
        return size
    ascii_chars = len(text.encode("ascii", "ignore"))
    utf16_units = len(text.encode("utf-16-le", "surrogatepass")) // 2
    return size - (len(text) - ascii_chars) + 6 * (utf16_units - ascii_chars)


def conversation_tail(messages: Sequence[ConversationMessage]) -> list[ConversationMessage]:
    """What a reasoning request by reference carries of its conversation: the messages from
    the last assistant turn on (the previous reasoning's answer and what was appended after
    it: where a worker that ran the previous turn stopped reading), all of them before the
    first turn, and none when those take more than TAIL_MAX_BYTES in the Celery message
    (:func:`tail_wire_bytes`; a message whose text alone is longer is not encoded to know)."""
    size = 0
    for start in range(len(messages) - 1, -1, -1):
        message = messages[start]
        chars = len(message.content) + sum(len(c.arguments) for c in message.tool_calls)
        if size + chars > TAIL_MAX_BYTES:  # each character is at least a byte on the wire
            return []
        size += tail_wire_bytes(message)
        if size > TAIL_MAX_BYTES:
            return []
        if message.role == MessageRole.ASSISTANT:
            return list(messages[start:])
    return list(messages)


class Reasoning(Section):
    """One iteration's Reason and Gate, sent to a reasoning worker; its answer applied."""

    def dispatch(self) -> None:
        m, record = self.m, self.record
        manager = DefaultContextManager(record.spec.context)
        fit = manager.fit(record.conversation, record.spec.limits.context_token_budget)
        if fit.compacted:
            m.detector.compacted()
        if fit.pinned_over_budget:
            m.event(
                "context_over_budget",
                pinned_tokens=str(fit.pinned_tokens),
                budget=str(fit.max_tokens),
            )
        fence = m.fence()
        awaiting = m.await_(AwaitKind.REASON, fence)
        record.iteration_started_at = m.now
        request = self.request(fence, record.conversation, purpose="act")
        awaiting.chained = request.act in (ActMode.CHAIN, ActMode.AUTO)
        m.effects.reason_dispatches.append(request)

    def request(
        self, fence: Fence, conversation: Conversation, purpose: Literal["act", "plan", "critic"]
    ) -> ReasonRequest:
        """A reasoning request; the task's own conversation travels by reference (when the
        settings say so) only for ``act``: a plan's or a critic's is their own."""
        m, record = self.m, self.record
        by_reference = m.settings.conversation_by_reference and purpose == "act"
        awaiting = record.awaiting  # its deadline was set with the dispatch: the worker's
        # start then leaves the task's look alone (workers.liveness)
        look_at = awaiting.deadline if awaiting is not None and awaiting.fence == fence else None
        return ReasonRequest(
            fence=fence,
            purpose=purpose,
            agent_id=record.spec.agent_id,
            conversation=Conversation() if by_reference else conversation,
            conversation_ref=(
                ConversationRef(
                    length=len(conversation),
                    epoch=record.conversation_epoch,  # the commit's, unless it moves it
                    created_at=record.created_at,
                    tail=conversation_tail(conversation.messages),
                )
                if by_reference
                else None
            ),
            config=m.budget.config(m.attempt_config()),
            provider=record.spec.provider,
            policy=record.spec.policy,
            workspace=m.workspace(),
            usage=record.step().attempt_usage if record.steps else record.usage,
            allowed_tools=record.spec.tools,
            model_calls=record.model_calls,
            workspace_template=m.workspace_template(),
            workspace_base=m.workspace_base(),
            recovery=record.spec.recovery,
            tool_recovery=record.spec.tool_recovery,
            act=self.act_mode(purpose),
            look_at=look_at,
            trace_parent=m.trace_parent,
        )

    def act_mode(self, purpose: str) -> ActMode:
        """Who runs the calls the iteration approves: the reasoning worker itself
        (``tool_dispatch: inline``, when the deployment allows it; ``auto``, for read-only
        calls), the tool workers it chains them to, or the coordinator (a plan has no calls,
        nor has a critic's verdict)."""
        settings = self.m.settings
        dispatch = self.record.spec.tool_dispatch
        if purpose == "critic":
            return ActMode.COORDINATOR
        if dispatch == "inline" and settings.allow_inline_tools:
            return ActMode.INLINE
        if purpose != "act" or not settings.chain_tools:
            return ActMode.COORDINATOR
        if dispatch == "auto" and settings.inline_read_tools:
            return ActMode.AUTO
        return ActMode.CHAIN

    def apply(self, message: ReasonedMessage) -> None:
        m, record = self.m, self.record
        step = record.step()
        asked = record.awaiting
        assert asked is not None  # on_reasoned checked it is this message's dispatch
        for new in message.new_messages:
            record.conversation.push(new.unpinned_copy())
        record.usage = record.usage + message.usage
        step.usage = step.usage + message.usage
        step.attempt_usage = step.attempt_usage + message.usage
        if m.budget.is_exhausted(message):
            m.budget.exhausted(message)
            return
        if message.termination is not None:
            m.limits.attempt_failed(str(message.termination))
            return
        record.iteration += 1
        step.iterations += 1
        m.journal(
            ReasoningComplete(
                iteration=record.iteration, actions=message.actions, usage=message.usage
            )
        )
        m.journal(
            PolicyEvaluated(
                iteration=record.iteration,
                action_count=len(message.actions),
                denied_count=message.denied_count,
            )
        )
        for change in message.modifications:
            m.journal(GateModified.of(record.iteration, change, m.settings.journal_redactor))
        if self.observe_turn(message):
            return
        if message.terminal_output is not None:
            self.journal_empty_act()
            self.answered(message.terminal_output)
        elif message.approved_calls and message.acted is not None:
            self.acted_inline(message.approved_calls, message.acted, message.held_calls)
        elif message.approved_calls and message.chained and asked.chained:
            self.chained(message.approved_calls, message.chained, asked, message.held_calls)
        elif message.approved_calls or message.held_calls:
            m.acting.dispatch(
                message.approved_calls, AwaitKind.TOOLS, "act", held=message.held_calls
            )
        else:
            self.journal_empty_act()
            self.next_iteration()

    def observe_turn(self, message: ReasonedMessage) -> bool:
        """Show the model's turn (its message and proposed calls) to the stagnation detector;
        True when the verdict ended or suspended the step.

        The turn opens the detector's iteration. When calls are to run, their results continue
        it and that verdict is applied (a text injected now would split the assistant's tool
        calls from their results); otherwise this one is applied now.
        """
        turn = ModelTurn.from_conversation(message.new_messages)
        if turn is None:
            return False
        calls = message.approved_calls or message.held_calls
        if calls and message.terminal_output is None:
            self.m.detector.note_turn(turn)  # the results' verdict is applied: none built now
            return False
        return self.m.observing.apply_verdict(self.m.detector.observe_turn(turn))

    def chained(
        self,
        calls: Sequence[ToolCallAction],
        chained: Sequence[str],
        asked: Awaiting,
        held: Sequence[HeldCall] = (),
    ) -> None:
        """The reasoning worker sent ``chained`` to the tool workers under its own fence
        (``held`` calls wait for a reviewer)."""
        awaiting = self.m.await_(AwaitKind.TOOLS, asked.fence.acting())
        awaiting.calls = list(calls)
        known = {c.call_id for c in calls}
        awaiting.dispatched = [c for c in chained if c in known]
        awaiting.results = {k: v for k, v in asked.results.items() if k in known}
        awaiting.escalations = {k: v for k, v in asked.escalations.items() if k in known}
        awaiting.tool_ms = asked.tool_ms
        if held:
            self.m.approvals.hold(awaiting, held)
        self.m.acting.advance(awaiting)

    def acted_inline(
        self,
        calls: Sequence[ToolCallAction],
        acted: Sequence[ToolObservedMessage],
        held: Sequence[HeldCall] = (),
    ) -> None:
        """The reasoning worker ran the calls itself: observe them now (once the ``held``
        ones, which wait for a reviewer, are decided)."""
        m = self.m
        awaiting = m.await_(AwaitKind.TOOLS, m.fence())
        awaiting.calls = list(calls)
        for outcome in acted:
            call_id = outcome.fence.call_id
            if call_id is not None and call_id not in awaiting.results:
                awaiting.results[call_id] = outcome.observation
                m.acting.remember_recovery(outcome)
        for call in awaiting.missing_calls():
            awaiting.results[call.call_id] = Observation.tool_error(
                call.name, "the reasoning worker returned no result for this call"
            ).with_call_id(call.call_id)
        if held:
            m.approvals.hold(awaiting, held)
            m.acting.advance(awaiting)
            return
        m.observing.all_observed(awaiting)

    def journal_waits(self, message: ReasonedMessage) -> None:
        """The model call waited out rate limits or provider errors: journaled, and not a
        failed attempt (the worker retried within its deadline)."""
        waits = message.provider_waits
        total = round(sum(w.wait_s for w in waits), 3)
        self.m.journal(
            ProviderWaited(iteration=self.record.iteration, waits=waits, total_wait_s=total)
        )

    def journal_empty_act(self) -> None:
        iteration = self.record.iteration
        zero = timedelta(0)
        self.m.journal(ToolsDispatched(iteration=iteration, tool_count=0, duration=zero))
        self.m.journal(ObservationsCollected(iteration=iteration, observation_count=0))

    def answered(self, output: str) -> None:
        """The model says the step is done: verify it (``done_when``), or complete it (after
        its critic's verdict, when it has one)."""
        record = self.record
        check = record.step().spec.done_when
        if check is None:
            self.m.critics.review(output, verified=False, check_output=None)
            return
        arguments = {"command": check.command, "timeout_s": check.timeout.total_seconds()}
        call = ToolCallAction(
            call_id=f"verify-{record.current}-{record.iteration}",
            name="run_command",
            arguments=json.dumps(arguments),
        )
        self.m.acting.dispatch([call], AwaitKind.VERIFY, "verify", terminal_output=output)

    def next_iteration(self) -> None:
        """Reason again, unless the attempt is out of iterations or time."""
        m, record = self.m, self.record
        step = record.step()
        limit = m.config().max_iterations
        elapsed = m.now - (step.started_at or m.now)
        if record.iteration - step.attempt_start_iteration >= limit:
            m.limits.attempt_failed(
                f"step '{step.spec.id}' used its {limit} iterations without finishing"
            )
        elif elapsed > record.spec.limits.step_timeout.total_seconds():
            m.limits.attempt_failed(
                f"step '{step.spec.id}' exceeded its timeout of "
                f"{record.spec.limits.step_timeout.total_seconds():.0f}s"
            )
        else:
            self.dispatch()
