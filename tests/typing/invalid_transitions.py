"""Invalid ORGA transitions: ``mypy --strict`` must reject every line marked ``E:``.

This file is never imported or run; ``tests/test_typestate.py`` type-checks it.
"""

from workers.phases import Observing, PolicyCheck, Reasoning, ToolDispatching


async def skip_the_gate(phase: PolicyCheck) -> None:
    """Dispatching straight from the policy check, without evaluating the gate."""
    await phase.dispatch_tools(None, None)  # E: skipping the gate


async def dispatch_without_reasoning(phase: Reasoning) -> None:
    """Dispatching tools before the model proposed anything."""
    await phase.dispatch_tools(None, None)  # E: dispatching without reasoning


def observe_without_dispatching(phase: ToolDispatching) -> None:
    """Observing results before any tool ran."""
    phase.observe_results()  # E: observing without dispatching


async def gate_twice(phase: ToolDispatching) -> None:
    """Going back to the gate after it was passed."""
    await phase.check_policy(None, None)  # E: gating an already gated batch


async def reason_from_observing(phase: Observing) -> None:
    """Calling the model again without going through observe_results."""
    await phase.produce_output(None, None)  # E: reasoning before observing completes
