"""A journal event in words: what the inbox's task page shows for each entry of the timeline.

:func:`describe` gives one line a reviewer can read (``file_read(path=calc.py) · 222 tokens``,
``1 call ran in 72 ms``) and the longer texts behind it as :class:`Block` s (each tool result,
a gate's change before and after, a failed reference's reason), which the page folds under
the line. Durations read as ``72 ms``, ``1.18 s`` or ``5 min 3 s``, never ``"72510us"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from shared.actions import (
    DelegateAction,
    ProposedAction,
    RespondAction,
    TerminateAction,
    ToolCallAction,
)
from shared.events import (
    AttemptFailed,
    CriticReplyRejected,
    CriticRequested,
    CriticVerdict,
    DispatchFailed,
    Escalated,
    GateModified,
    LoopEvent,
    ObservationsCollected,
    PolicyEvaluated,
    PreHydrationComplete,
    ProviderWaited,
    ReasoningComplete,
    ReviewDecided,
    ServiceUnavailable,
    StagnationDetected,
    Started,
    Terminated,
    ToolsDispatched,
    VerificationRun,
)

__all__ = ["Block", "describe", "human_duration"]

_SHORT = 160
"""Characters of an argument or an answer on the summary line."""


@dataclass(frozen=True, slots=True)
class Block:
    """A longer text behind a summary: a label and the text as it is (escaped by the page)."""

    label: str
    text: str


def human_duration(value: timedelta | float) -> str:
    """``850 µs``, ``72 ms``, ``1.18 s``, ``5 min 3 s``, ``2 h 5 min`` (a float is seconds)."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0.001:
        return f"{seconds * 1_000_000:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _short(text: str, limit: int = _SHORT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(arguments: str) -> str:
    """``path=calc.py, start_line=3``: a call's JSON arguments as a reader writes them."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return _short(arguments, 80)
    if not isinstance(value, dict):
        return _short(arguments, 80)
    shown = (f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in value.items())
    return _short(", ".join(shown), 120)


def action_text(action: ProposedAction) -> str:
    """One proposed action in words."""
    if isinstance(action, ToolCallAction):
        return f"{action.name}({_arguments(action.arguments)})"
    if isinstance(action, DelegateAction):
        return f"delegate to {action.target}: {_short(action.message, 80)}"
    if isinstance(action, RespondAction):
        return f"answer: “{_short(action.content, 120)}”"
    assert isinstance(action, TerminateAction)
    return f"stop ({_short(action.reason, 80)}): “{_short(action.output, 120)}”"


Description = tuple[str, tuple[Block, ...]]


def _started(event: Started) -> Description:
    tools = len(event.config.tool_definitions)
    offered = f" · {tools} tool{'s' if tools != 1 else ''} offered" if tools else ""
    summary = f"agent {event.agent_id} started · at most {event.config.max_iterations} iterations"
    return summary + offered, ()


def _reasoned(event: ReasoningComplete) -> Description:
    actions = "; ".join(action_text(a) for a in event.actions) or "nothing"
    answers = tuple(
        Block("answer", a.content) for a in event.actions if isinstance(a, RespondAction)
    )
    calls = tuple(
        Block(f"{a.name} {a.call_id}", _pretty(a.arguments))
        for a in event.actions
        if isinstance(a, ToolCallAction)
    )
    return f"model proposed {actions} · {event.usage.total_tokens} tokens", answers + calls


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def _gated(event: PolicyEvaluated) -> Description:
    n = event.action_count
    noun = f"{n} action{'s' if n != 1 else ''}"
    if event.denied_count:
        return f"gate checked {noun}, denied {event.denied_count}", ()
    return f"gate allowed {noun}", ()


def _dispatched(event: ToolsDispatched) -> Description:
    n = event.tool_count
    if not n:
        return "no tool call to run", ()
    noun = f"{n} call{'s' if n != 1 else ''}"
    return f"{noun} ran in {human_duration(event.duration)} (the longest)", ()


def _observed(event: ObservationsCollected) -> Description:
    if not event.results:
        n = event.observation_count
        return (f"{n} result{'s' if n != 1 else ''} added" if n else "no results"), ()
    parts, blocks = [], []
    for result in event.results:
        state = (
            f"error ({result.error_type})"
            if result.error_type
            else ("error" if result.is_error else "ok")
        )
        parts.append(f"{result.tool} {state}")
        cut = f", cut from {result.full_chars} characters" if result.full_chars else ""
        label = f"{result.tool} {result.call_id or ''} → {state}{cut}".replace("  ", " ")
        blocks.append(Block(label, result.content))
    return "results: " + "; ".join(parts), tuple(blocks)


def _terminated(event: Terminated) -> Description:
    message = f": {_short(event.reason.message)}" if event.reason.message else ""
    return (
        f"ended {event.reason.kind}{message} · {event.iterations} iterations"
        f" · {event.total_usage.total_tokens} tokens · took {human_duration(event.duration)}",
        (),
    )


def _hydrated(event: PreHydrationComplete) -> Description:
    summary = (
        f"pre-hydration: {event.references_found} references, {event.references_resolved} "
        f"resolved, {event.references_failed} failed · {event.total_tokens} tokens"
    )
    blocks = tuple(Block(f"{f.ref_type} {f.reference}", f.error) for f in event.failures)
    return summary, blocks


def _modified(event: GateModified) -> Description:
    summary = f"gate changed {action_text(event.before)} into {action_text(event.after)}"
    blocks = (
        Block("reason", event.reason),
        Block("before", _action_block(event.before)),
        Block("after", _action_block(event.after)),
    )
    return summary, blocks


def _action_block(action: ProposedAction) -> str:
    if isinstance(action, ToolCallAction):
        return f"{action.name}\n{_pretty(action.arguments)}"
    return action_text(action)


def _waited(event: ProviderWaited) -> Description:
    causes = ", ".join(
        "shared rate limit" if w.shared else f"HTTP {w.status or 'timeout'}" for w in event.waits
    )
    return f"waited {human_duration(event.total_wait_s)} on the model provider ({causes})", ()


def _escalated(event: Escalated) -> Description:
    return (
        f"waiting for a human: review {event.review_id} ({event.source}) · "
        f"{event.default_decision} by default at {event.deadline:%Y-%m-%d %H:%M} UTC",
        (Block("reason", event.reason),),
    )


def _decided(event: ReviewDecided) -> Description:
    hint = f" · hint: “{_short(event.hint)}”" if event.hint else ""
    return f"review {event.review_id}: {event.decision} by {event.decided_by}{hint}", ()


def _verified(event: VerificationRun) -> Description:
    verdict = "passed" if event.passed else "failed"
    return (
        f"check {verdict}: `{_short(event.command, 100)}` exited {event.exit_code} "
        f"(expected {event.expected})",
        (),
    )


def _attempt(event: AttemptFailed) -> Description:
    return f"attempt {event.attempt} of step {event.step_id} failed: {_short(event.error)}", (
        Block("error", event.error),
    )


def _dispatch_failed(event: DispatchFailed) -> Description:
    what = "sent again" if event.retried else "given up"
    return f"a worker failed ({event.error_kind}), {what}: {_short(event.error)}", (
        Block("error", event.error),
    )


def _unavailable(event: ServiceUnavailable) -> Description:
    when = f", next try {event.retry_at:%H:%M:%S}" if event.retry_at else ", gave up"
    return (
        f"{event.service} unavailable (report {event.reports}{when}): {_short(event.error)}",
        (),
    )


def _stagnation(event: StagnationDetected) -> Description:
    kind = f" ({event.kind})" if event.kind else ""
    return (
        f"stagnation {event.level}{kind}: {event.steps_since_milestone} steps since a milestone, "
        f"{event.new_state_changes} new state changes",
        (),
    )


def _critic_requested(event: CriticRequested) -> Description:
    return f"result of {event.step_id} sent to {event.critic} (round {event.round})", ()


def _critic_verdict(event: CriticVerdict) -> Description:
    return f"{event.critic}: {event.verdict} (by {event.decided_by}) — {_short(event.reason)}", ()


def _critic_rejected(event: CriticReplyRejected) -> Description:
    then = "asked again" if event.retried else "escalated"
    return f"{event.critic}'s reply was not a verdict, {then}: {_short(event.error)}", ()


_DESCRIBERS: dict[type[BaseModel], Callable[[Any], Description]] = {
    Started: _started,
    ReasoningComplete: _reasoned,
    PolicyEvaluated: _gated,
    ToolsDispatched: _dispatched,
    ObservationsCollected: _observed,
    Terminated: _terminated,
    PreHydrationComplete: _hydrated,
    GateModified: _modified,
    ProviderWaited: _waited,
    Escalated: _escalated,
    ReviewDecided: _decided,
    VerificationRun: _verified,
    AttemptFailed: _attempt,
    DispatchFailed: _dispatch_failed,
    ServiceUnavailable: _unavailable,
    StagnationDetected: _stagnation,
    CriticRequested: _critic_requested,
    CriticVerdict: _critic_verdict,
    CriticReplyRejected: _critic_rejected,
}


def describe(event: LoopEvent) -> Description:
    """The event's summary line and the longer texts behind it."""
    describer = _DESCRIBERS.get(type(event))
    if describer is not None:
        return describer(event)
    return _generic(event), ()


def _generic(event: BaseModel) -> str:
    """``name: value · ...`` for an event without its own words (durations made readable)."""
    parts = []
    for name in type(event).model_fields:
        if name == "type":
            continue
        value = getattr(event, name)
        if isinstance(value, timedelta):
            text = human_duration(value)
        elif isinstance(value, BaseModel):
            text = _short(json.dumps(value.model_dump(mode="json"), ensure_ascii=False), 80)
        else:
            text = _short(str(value), 80)
        parts.append(f"{name.replace('_', ' ')} {text}")
    return " · ".join(parts)
