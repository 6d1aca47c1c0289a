"""Build a gate from the ``policy:`` block of a task file (:class:`shared.policy.PolicySpec`).

.. code-block:: yaml

    policy: {kind: default, deny_patterns: ["npm publish"], disabled_rules: [rm-workspace-wipe]}
    policy: {kind: default, require_approval: ["run_command:git push*", "mcp:*"]}
    policy: {kind: tool_filter, allowed_tools: [file_read, grep]}
    policy: {kind: cedar, policy_files: [policies/orga.cedar]}
    policy: {kind: opa, opa_url: "http://opa:8181", opa_path: orga/allow, timeout_s: 1.5}

``allowed_tools`` works with every kind: a :class:`ToolFilterGate` is put in front of the gate
of that kind. Options that the chosen kind would ignore are refused, so that a typo in
``kind`` does not silently drop a policy.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from shared.policy import PolicySpec
from workers.gates.base import ReasoningPolicyGate
from workers.gates.cedar import CedarGate
from workers.gates.composite import CompositeGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.opa import OpaGate
from workers.gates.permissive import PermissiveGate
from workers.gates.tool_filter import ToolFilterGate

__all__ = ["PolicySpec", "build_gate"]


def build_gate(
    spec: PolicySpec,
    *,
    base_dir: Path | None = None,
    opa_client: httpx.AsyncClient | None = None,
) -> ReasoningPolicyGate:
    """The gate a spec describes.

    Relative policy files are read from ``base_dir`` (the task file's directory) when given.
    The spec itself checks that its options fit its kind. Raises ConfigError for a missing or
    unparsable Cedar file, a bad deny pattern or rule name, or a bad OPA URL or path.
    """
    gate = _core_gate(spec, base_dir, opa_client)
    if spec.allowed_tools is None or spec.kind == "tool_filter":
        return gate
    return CompositeGate([ToolFilterGate.allow(spec.allowed_tools), gate])


def _core_gate(
    spec: PolicySpec, base_dir: Path | None, opa_client: httpx.AsyncClient | None
) -> ReasoningPolicyGate:
    if spec.kind == "permissive":
        return PermissiveGate()
    if spec.kind == "tool_filter":
        return ToolFilterGate.allow(spec.allowed_tools or [])
    if spec.kind == "cedar":
        return CedarGate([_located(Path(path), base_dir) for path in spec.policy_files])
    if spec.kind == "opa":
        return OpaGate(
            spec.opa_url or "", spec.opa_path, timeout_s=spec.timeout_s, client=opa_client
        )
    return DefaultPolicyGate(
        extra_deny_patterns=spec.deny_patterns,
        disabled_rules=spec.disabled_rules,
        max_delegation_depth=spec.max_delegation_depth,
        extra_write_roots=[Path(root) for root in spec.extra_write_roots],
        require_approval=spec.require_approval,
    )


def _located(path: Path, base_dir: Path | None) -> Path:
    return path if path.is_absolute() or base_dir is None else base_dir / path
