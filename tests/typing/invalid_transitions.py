"""Invalid ORGA transitions: ``mypy --strict`` must reject every line marked ``E:``.

This file is never imported or run; ``tests/test_typestate.py`` type-checks it.
"""

from workers.phases import PolicyCheck, Reasoning, ToolDispatching


def skip_the_gate(phase: Reasoning) -> None:
    """Handing the model's proposal to Act without evaluating the gate."""
    print(phase.approved)  # E: acting on ungated actions


async def gate_without_reasoning(phase: Reasoning) -> None:
    """Evaluating the gate before the model proposed anything."""
    await phase.check_policy(None, None)  # E: gating without reasoning


async def reason_from_the_gate(phase: PolicyCheck) -> None:
    """Calling the model again instead of evaluating the proposal."""
    await phase.produce_output(None, None)  # E: reasoning again before the gate


async def gate_twice(phase: ToolDispatching) -> None:
    """Going back to the gate after it was passed."""
    await phase.check_policy(None, None)  # E: gating an already gated batch


async def reason_from_a_gated_batch(phase: ToolDispatching) -> None:
    """Calling the model again before Act and Observe ran the approved calls."""
    await phase.produce_output(None, None)  # E: reasoning before the batch was acted on
