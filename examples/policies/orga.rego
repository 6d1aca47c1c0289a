# A policy for orga-queue's OPA gate (workers/gates/opa.py), in Rego v1 syntax.
#
# Load it:      opa run --server --addr :8181 examples/policies/orga.rego
# Use it:       policy: {kind: opa, opa_url: "http://localhost:8181", opa_path: orga/allow}
#          or:  policy: {kind: opa, opa_url: "http://localhost:8181", opa_path: orga/decision}
#
# For every proposed action the gate sends POST /v1/data/<opa_path> with {"input": <input>}.
# The input is one of these four shapes; "arguments" is the parsed JSON object the model sent
# (already checked against the tool's JSON Schema), never JSON text:
#
#   {"type": "tool_call", "call_id": "c1", "tool_name": "run_command",
#    "arguments": {"command": "pytest -q"}, ...common fields}
#   {"type": "delegate", "call_id": "c2", "target": "reviewer", "message_length": 120, ...}
#   {"type": "respond", "content_length": 42, ...}
#   {"type": "terminate", "reason": "done", ...}
#
# Common fields: "agent_id", "task_id" and "step_id" (null when unknown), "iteration",
# "delegation_depth" (0 for a top-level task), "workspace" (a path or null) and "attributes"
# (an object the operator attaches to the task).
#
# The document at <opa_path> must be either
#   - a boolean: true allows, false denies; or
#   - an object {"allow": bool, "reason": string, "modified_arguments": object, "ask": bool}
#     where "reason" (optional) is what the model reads after "[Policy denied] ",
#     "modified_arguments" (optional, tool calls only) replaces the call's arguments, and
#     "ask": true (optional, tool calls only) holds an allowed call for a reviewer, who
#     approves, edits or rejects it (README "Approval of one call"), e.g.
#       decision := {"allow": true, "ask": true, "reason": "a push"} if {
#           input.tool_name == "run_command"; startswith(input.arguments.command, "git push") }
# Anything else denies, and so does an undefined document: give every decision a default.
# This file shows both: "allow" (boolean) and "decision" (object).

package orga

import rego.v1

allowed_tools := {"file_read", "file_write", "file_list", "grep", "run_command", "web_fetch"}

max_command_timeout_s := 120

# -- the reasons to refuse an action ----------------------------------------------------------

deny_reasons contains msg if {
	input.type == "tool_call"
	not input.tool_name in allowed_tools
	msg := sprintf("tool %q is not allowed for agent %q", [input.tool_name, input.agent_id])
}

deny_reasons contains msg if {
	input.type == "tool_call"
	input.tool_name == "run_command"
	contains(input.arguments.command, "rm -rf")
	msg := sprintf("recursive deletes are not allowed: %q", [input.arguments.command])
}

deny_reasons contains msg if {
	input.type == "tool_call"
	input.tool_name == "web_fetch"
	not startswith(input.arguments.url, "https://")
	msg := sprintf("web_fetch only fetches https URLs, not %q", [input.arguments.url])
}

deny_reasons contains msg if {
	input.type == "delegate"
	input.delegation_depth >= 2
	msg := sprintf("delegation to %q refused: depth limit 2 reached", [input.target])
}

# -- the boolean decision (opa_path: orga/allow) ----------------------------------------------

default allow := false

allow if count(deny_reasons) == 0

# -- the object decision (opa_path: orga/decision) --------------------------------------------

default decision := {"allow": false, "reason": "no rule of package orga decided"}

decision := {"allow": false, "reason": reason} if {
	count(deny_reasons) > 0
	reason := concat("; ", sort(deny_reasons))
}

# An over-long command timeout is not refused but capped: the gate turns this into a Modify.
decision := {"allow": true, "reason": reason, "modified_arguments": capped} if {
	count(deny_reasons) == 0
	timeout_too_long
	reason := sprintf("timeout_s capped at %d", [max_command_timeout_s])
	capped := object.union(input.arguments, {"timeout_s": max_command_timeout_s})
}

decision := {"allow": true} if {
	count(deny_reasons) == 0
	not timeout_too_long
}

timeout_too_long if {
	input.type == "tool_call"
	input.tool_name == "run_command"
	input.arguments.timeout_s > max_command_timeout_s
}
