"""Policy gates: each proposed action is allowed, denied or modified before it runs.

Tool arguments first pass the schema pre-check (:func:`validate_tool_arguments`); then the gate
decides. What the model sees of a refusal is :func:`denial_message` or
:func:`schema_failure_message`.
"""

from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.cedar import CedarGate, cedar_request
from workers.gates.command_rules import BUILTIN_COMMAND_RULES, CommandRule, normalise_command
from workers.gates.composite import CompositeGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.factory import PolicySpec, build_gate
from workers.gates.opa import DEFAULT_OPA_PATH, OpaGate, opa_input
from workers.gates.permissive import PermissiveGate
from workers.gates.schema import denial_message, schema_failure_message, validate_tool_arguments
from workers.gates.server_start import refused_server_start, start_action
from workers.gates.tool_filter import ToolFilterGate

__all__ = [
    "BUILTIN_COMMAND_RULES",
    "DEFAULT_OPA_PATH",
    "CedarGate",
    "CommandRule",
    "CompositeGate",
    "DefaultPolicyGate",
    "GateContext",
    "OpaGate",
    "PermissiveGate",
    "PolicySpec",
    "ReasoningPolicyGate",
    "ToolFilterGate",
    "build_gate",
    "cedar_request",
    "denial_message",
    "normalise_command",
    "opa_input",
    "refused_server_start",
    "schema_failure_message",
    "start_action",
    "validate_tool_arguments",
]
