"""Pre-hydration: resolve the references in the goal before the first step reasons."""

from __future__ import annotations

import json

from coordinator.machine.core import Section
from coordinator.state import Awaiting, AwaitKind
from shared.actions import Observation, ToolCallAction
from shared.conversation import ConversationMessage
from shared.pre_hydration import ExtractedReference, PreHydrationEngine, ResolutionResult

__all__ = ["PreHydration"]


class PreHydration(Section):
    """The goal's URLs, paths, issues and PRs, resolved in one batch within a token budget."""

    def start(self) -> bool:
        """Dispatch the resolutions of the references in the goal; False when none are due."""
        engine, references = self.references()
        if not references:
            return False
        calls = [
            ToolCallAction(call_id=call_id, name=tool, arguments=json.dumps({"input": value}))
            for call_id, tool, value in engine.planned_calls(references)
        ]
        if not calls:
            self.assemble({})
            return False
        self.m.acting.dispatch(calls, AwaitKind.PREHYDRATE, "prehydrate")
        return True

    def references(self) -> tuple[PreHydrationEngine, list[ExtractedReference]]:
        record = self.record
        assert record.spec.pre_hydration is not None
        engine = PreHydrationEngine(record.spec.pre_hydration)
        text = f"{record.spec.goal}\n{record.steps[0].spec.instruction}"
        return engine, engine.extract_references(text)

    def done(self, awaiting: Awaiting) -> None:
        self.record.awaiting = None
        self.assemble(awaiting.results)
        self.m.reasoning.dispatch()

    def assemble(self, observations: dict[str, Observation]) -> None:
        """Put what was resolved (within the budget) into the conversation, and journal it."""
        engine, references = self.references()
        results = {
            call_id: ResolutionResult(call_id=call_id, content=o.content, is_error=o.is_error)
            for call_id, o in observations.items()
            if o.metadata.get("timed_out") != "true"
        }
        timed_out = [k for k, o in observations.items() if o.metadata.get("timed_out") == "true"]
        hydrated = engine.assemble(references, results, timed_out)
        text = engine.format_context(hydrated)
        if text:
            self.record.conversation.push(ConversationMessage.system(text))
        self.m.journal(hydrated.completion_event(self.m.settings.journal_redactor))
