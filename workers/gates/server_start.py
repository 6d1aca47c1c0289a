"""The policy gate on starting the MCP servers over stdio that a task (or an agent profile)
declares: a server's ``command`` is a command a tool worker runs in the task's workspace, so
the task's gate judges it as one, before any of the task's servers starts.

The gate sees a ``run_command`` call (:func:`start_action`): the argv joined with
``shlex.join`` (``{python}`` read as ``python``) and the server's ``cwd``, so the deny-list,
``network-upload``, ``command-workspace-escape`` and ``workspace-paths`` rules, a policy's
``allowed_tools`` and its ``require_approval`` rules apply as to the same text typed as a
command. OPA's input and Cedar's context carry ``attributes.mcp_server`` (the server's name) and
``attributes.mcp_server_start`` (true), so a policy can tell a start from a model's call. The
task's step allow-list does not apply: a start is not a call of the step's model.

Only an Allow starts the server. A Deny refuses it naming the rule; an Ask is refused too (a
server start is not held for a reviewer: nothing would run the task's loop while it waits, and
an approval would have to outlive the tool worker's connection); a Modify is refused (the
server the task declared is what its listing, its session and its journal name: running
another command under its name would hide the change). The refusal is a configuration error
of the task (:class:`~workers.tools.mcp.McpConfigError`), with the fix: declare the server in
the workers' ``ORGA_MCP_SERVERS`` file (the operator's servers are trusted and never gated) or
change the policy. Servers over HTTP are not gated here: their address is checked when they
are connected (:mod:`workers.tools.address_policy`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from shared.actions import Ask, Deny, GateDecision, Modify, ToolCallAction
from shared.mcp import PYTHON_PLACEHOLDER, McpServerSpec, redact_command
from workers.gates.base import GateContext, ReasoningPolicyGate

__all__ = [
    "START_ATTRIBUTE",
    "START_CALL_PREFIX",
    "START_TOOL",
    "refused_server_start",
    "start_action",
    "start_context",
]

START_TOOL = "run_command"
"""What the gate is asked about: the server's command, as a command."""
START_CALL_PREFIX = "mcp-start:"
"""The call id of a start is this prefix and the server's name."""
START_ATTRIBUTE = "mcp_server_start"
_FIX = (
    "declare the server in the workers' ORGA_MCP_SERVERS file (the operator's servers are "
    "not gated), or change the task's policy"
)


def start_action(spec: McpServerSpec) -> ToolCallAction:
    """The ``run_command`` call a stdio server's start is judged as: its ``env`` written as the
    assignments that prefix a typed command (``X='...' sh -c '$X'``), so a command moved into
    a variable is shown to the gate as it runs."""
    assert spec.command is not None, "only a stdio server has a command to gate"
    program, *args = spec.command
    argv = ["python" if program == PYTHON_PLACEHOLDER else program, *args]
    assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(spec.env.items())]
    arguments: dict[str, str] = {"command": " ".join([*assignments, shlex.join(argv)])}
    if spec.cwd is not None:
        arguments["cwd"] = spec.cwd
    return ToolCallAction(
        call_id=f"{START_CALL_PREFIX}{spec.name}",
        name=START_TOOL,
        arguments=json.dumps(arguments),
    )


def start_context(context: GateContext, spec: McpServerSpec) -> GateContext:
    """The task's gate context for the start of ``spec``: no step allow-list, the server named
    in the attributes."""
    attributes = {**context.attributes, "mcp_server": spec.name, START_ATTRIBUTE: True}
    return context.model_copy(update={"allowed_tools": None, "attributes": attributes})


async def refused_server_start(
    gate: ReasoningPolicyGate, servers: Sequence[McpServerSpec], context: GateContext
) -> str | None:
    """Why the first of the task's stdio ``servers`` the gate does not allow may not start
    (naming the server, the rule and the fix), or None when every one may."""
    for spec in servers:
        if spec.command is None:
            continue
        decision = await gate.evaluate_action(start_action(spec), start_context(context, spec))
        why = _refusal(decision)
        if why is not None:
            return (
                f"MCP server {spec.name!r} (command {redact_command(spec.command)!r}) may not "
                f"start: the task's policy gate judged its command as a {START_TOOL} call, "
                f"and {why}; {_FIX}"
            )
    return None


def _refusal(decision: GateDecision) -> str | None:
    """What in ``decision`` refuses the start, or None for an Allow."""
    if isinstance(decision, Deny):
        return f"denied it: {decision.reason}"
    if isinstance(decision, Ask):
        return (
            f"would hold it for a reviewer ({decision.reason}), but a server's start cannot be "
            "approved (nothing runs the task while a reviewer decides): make the "
            "require_approval rule not match the server's command"
        )
    if isinstance(decision, Modify):
        return (
            f"would modify it ({decision.reason}), but a server runs the command its task "
            "declares or does not run (another command under the server's name would hide "
            "the change from its listing and journal): declare the command the policy allows"
        )
    return None
