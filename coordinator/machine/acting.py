"""Act: send approved tool calls to the tool workers, at most ``max_concurrent_tools`` at once."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.machine.core import Section
from coordinator.state import Awaiting, AwaitKind
from shared.actions import ToolCallAction
from shared.approval import HeldCall
from shared.delegation import is_delegate
from shared.events import GateModified
from shared.protocol import Fence, RunEach, ToolObservedMessage, ToolRequest

__all__ = ["Acting"]


class Acting(Section):
    """Tool dispatches of one iteration (or of pre-hydration, or of a ``done_when`` check)."""

    def dispatch(
        self,
        calls: Sequence[ToolCallAction],
        kind: AwaitKind,
        purpose: str,
        terminal_output: str | None = None,
        held: Sequence[HeldCall] = (),
    ) -> None:
        """Dispatch ``calls``; ``held`` ones wait for a reviewer (:mod:`.approvals`)."""
        awaiting = self.m.await_(kind, self.m.fence())
        awaiting.calls = list(calls)
        awaiting.purpose = purpose
        awaiting.terminal_output = terminal_output
        if held:
            self.m.approvals.hold(awaiting, held)
        self.advance(awaiting)

    def advance(self, awaiting: Awaiting) -> None:
        """Dispatch what may go out now; observe the iteration when nothing is missing any
        more (every call answered, or refused at once like a delegation over a limit)."""
        self.dispatch_more(awaiting)
        if not awaiting.missing_calls():
            self.m.observing.all_observed(awaiting)

    def dispatch_more(self, awaiting: Awaiting) -> None:
        """Dispatch waiting calls while fewer than ``max_concurrent_tools`` are in flight.

        Pre-hydration resolutions go out together in one dispatch: one worker resolves them
        concurrently, so the wall time is the slowest resolution, not the worker count's share.
        A ``delegate`` call goes to no worker: it becomes a child task at once
        (:class:`~coordinator.machine.delegation.Delegation`), outside the bound.
        """
        if awaiting.kind is AwaitKind.PREHYDRATE:
            self.dispatch_batch(awaiting)
            return
        m = self.m
        limit = m.config().max_concurrent_tools
        delegated = awaiting.delegated()
        in_flight = [
            c for c in awaiting.dispatched if c not in awaiting.results and c not in delegated
        ]
        for call in awaiting.calls:
            if call.call_id in awaiting.dispatched or call.call_id in awaiting.held:
                continue
            if call.call_id in awaiting.results:  # a held call a reviewer rejected
                continue
            if is_delegate(call.name):
                m.delegation.start(awaiting, call)
                continue
            if len(in_flight) >= limit:
                continue
            awaiting.deadline = m.now + m.deadline_s()
            awaiting.dispatched.append(call.call_id)
            in_flight.append(call.call_id)
            request = self.request(awaiting.fence, call, awaiting.purpose)
            edited_by = awaiting.edited.get(call.call_id)
            if edited_by is not None:  # a reviewer's edit: gated again by the tool worker
                request = request.model_copy(update={"edited_by": edited_by})
            m.effects.tool_dispatches.append(request)

    def dispatch_batch(self, awaiting: Awaiting) -> None:
        waiting = [c for c in awaiting.calls if c.call_id not in awaiting.dispatched]
        if not waiting:
            return
        m = self.m
        awaiting.deadline = m.now + m.deadline_s()
        awaiting.dispatched.extend(c.call_id for c in waiting)
        request = self.request(awaiting.fence, waiting[0], awaiting.purpose)
        m.effects.tool_dispatches.append(
            request.model_copy(update={"answer": RunEach(also=waiting[1:])})
        )

    def request(self, fence: Fence, call: ToolCallAction, purpose: str) -> ToolRequest:
        spec = self.record.spec
        return ToolRequest(
            fence=fence.for_call(call.call_id),
            purpose="verify"
            if purpose == "verify"
            else ("prehydrate" if purpose == "prehydrate" else "act"),
            agent_id=spec.agent_id,
            action=call,
            workspace=self.m.workspace(),
            workspace_template=self.m.workspace_template(),
            workspace_base=self.m.workspace_base(),
            config=self.m.config(),
            recovery=spec.tool_recovery.get(call.name, spec.recovery),
            policy=spec.policy,
            allowed_tools=spec.tools,
            trace_parent=self.m.trace_parent,
        )

    def remember_recovery(self, message: ToolObservedMessage) -> None:
        """Journal a call's recovery events and the gate's Modify its worker applied (a
        pre-hydration resolution's); keep its duration and its escalation, if any."""
        awaiting = self.record.awaiting
        assert awaiting is not None
        if message.modification is not None:
            redactor = self.m.settings.journal_redactor
            self.m.journal(GateModified.of(self.record.iteration, message.modification, redactor))
        for event in message.recovery_events:
            self.m.journal(event.model_copy(update={"iteration": self.record.iteration}))
        # The calls of an iteration run concurrently: the batch took as long as its longest.
        awaiting.tool_ms = max(awaiting.tool_ms, message.duration_ms)
        if message.escalation_reason is not None:
            awaiting.escalations[message.fence.call_id or ""] = message.escalation_reason
