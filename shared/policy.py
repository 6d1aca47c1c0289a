"""Which policy gate a task uses: the ``policy`` section of a task file.

The gates themselves live in ``workers.gates``; this is the wire model both sides agree on.
``deny_patterns`` come from the task, so they are RE2 patterns (:mod:`shared.safe_regex`),
matched in linear time; one RE2 cannot take fails validation, so the task is rejected at intake.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.safe_regex import compile_user_pattern

__all__ = ["DEFAULT_GATE_RULES", "MAX_APPROVAL_RULES", "MAX_DENY_PATTERNS", "PolicySpec"]

MAX_DENY_PATTERNS = 256
"""A policy holds at most this many ``deny_patterns``."""

MAX_APPROVAL_RULES = 256
"""A policy holds at most this many ``require_approval`` rules."""

DEFAULT_GATE_RULES = (
    "command-workspace-escape",
    "delegation-depth",
    "disk-format",
    "fork-bomb",
    "git-protected-branch",
    "kill-all-processes",
    "network-upload",
    "permissions-system",
    "pipe-to-shell",
    "power-state",
    "raw-device-write",
    "rm-root",
    "rm-workspace-wipe",
    "system-write",
    "workspace-paths",
)
"""The rules of the ``default`` gate a policy may name in ``disabled_rules`` (the gate's own
list, :mod:`workers.gates.default`, is checked against this one by a test)."""


class PolicySpec(BaseModel):
    """``kind`` picks the gate; the other fields configure it.

    - ``permissive``: allow everything (development only);
    - ``default``: workspace confinement, a deny-list of destructive commands, no uploads of
      local data (rule ``network-upload``), ``allowed_tools``; ``disabled_rules`` turns rules
      off by name (:data:`DEFAULT_GATE_RULES`); ``require_approval`` lists the calls a human
      approves first, as ``<tool>:<glob over the call's canonical argument string>``
      (``run_command:git push*``, ``mcp:*``; :mod:`workers.gates.approval`);
    - ``tool_filter``: only ``allowed_tools``;
    - ``cedar``: Cedar policies from ``policy_files``;
    - ``opa``: an OPA server's data API at ``opa_url`` + ``opa_path``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["permissive", "default", "tool_filter", "cedar", "opa"] = "default"
    allowed_tools: list[str] | None = None
    deny_patterns: list[str] = Field(default_factory=list, max_length=MAX_DENY_PATTERNS)
    disabled_rules: list[str] = Field(default_factory=list)
    require_approval: list[str] = Field(default_factory=list, max_length=MAX_APPROVAL_RULES)
    max_delegation_depth: int = Field(default=3, ge=0)
    extra_write_roots: list[str] = Field(default_factory=list)
    policy_files: list[str] = Field(default_factory=list)
    opa_url: str | None = None
    opa_path: str = "orga/allow"
    timeout_s: float = Field(default=5.0, gt=0)

    @field_validator("deny_patterns")
    @classmethod
    def _deny_patterns_compile(cls, patterns: list[str]) -> list[str]:
        for index, pattern in enumerate(patterns):
            compile_user_pattern(pattern, where=f"deny pattern {index}")
        return patterns

    @field_validator("require_approval")
    @classmethod
    def _approval_rules_have_a_tool(cls, patterns: list[str]) -> list[str]:
        for index, pattern in enumerate(patterns):
            tool, colon, _ = pattern.partition(":")
            if not colon or not tool.strip():
                raise ValueError(
                    f"require_approval rule {index} ({pattern[:100]!r}) is not "
                    "'<tool>:<argument glob>'; write e.g. 'run_command:git push*' or 'mcp:*'"
                )
        return patterns

    @field_validator("disabled_rules")
    @classmethod
    def _disabled_rules_exist(cls, names: list[str]) -> list[str]:
        unknown = sorted(set(names) - set(DEFAULT_GATE_RULES))
        if unknown:
            raise ValueError(
                f"disabled_rules: unknown rule name(s) {unknown}; known rules: "
                f"{list(DEFAULT_GATE_RULES)}"
            )
        return names

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> PolicySpec:
        used = _OPTIONS_BY_KIND.get(self.kind, frozenset())
        stray = sorted(
            name for name in _ALL_KIND_OPTIONS - used if getattr(self, name) != _default(name)
        )
        if stray:
            raise ValueError(
                f"policy kind {self.kind!r} does not use {stray}; remove them or fix kind"
            )
        if self.kind == "tool_filter" and self.allowed_tools is None:
            raise ValueError("policy kind 'tool_filter' needs allowed_tools: [tool, ...]")
        if self.kind == "cedar" and not self.policy_files:
            raise ValueError("policy kind 'cedar' needs policy_files: [path.cedar, ...]")
        if self.kind == "opa" and not self.opa_url:
            raise ValueError("policy kind 'opa' needs opa_url, e.g. http://opa:8181")
        return self


_OPTIONS_BY_KIND: dict[str, frozenset[str]] = {
    "default": frozenset(
        {
            "deny_patterns",
            "disabled_rules",
            "max_delegation_depth",
            "extra_write_roots",
            "require_approval",
        }
    ),
    "cedar": frozenset({"policy_files"}),
    "opa": frozenset({"opa_url", "opa_path", "timeout_s"}),
}
_ALL_KIND_OPTIONS = frozenset().union(*_OPTIONS_BY_KIND.values())


_DEFAULTS: dict[str, Any] = {}


def _default(name: str) -> Any:
    """The field's default, computed once (validation runs several times per iteration)."""
    if name not in _DEFAULTS:
        _DEFAULTS[name] = PolicySpec.model_fields[name].get_default(call_default_factory=True)
    return _DEFAULTS[name]
