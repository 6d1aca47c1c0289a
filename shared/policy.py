"""Which policy gate a task uses: the ``policy`` section of a task file.

The gates themselves live in ``workers.gates``; this is the wire model both sides agree on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PolicySpec"]


class PolicySpec(BaseModel):
    """``kind`` picks the gate; the other fields configure it.

    - ``permissive``: allow everything (development only);
    - ``default``: workspace confinement, a deny-list of destructive commands, ``allowed_tools``;
    - ``tool_filter``: only ``allowed_tools``;
    - ``cedar``: Cedar policies from ``policy_files``;
    - ``opa``: an OPA server's data API at ``opa_url`` + ``opa_path``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["permissive", "default", "tool_filter", "cedar", "opa"] = "default"
    allowed_tools: list[str] | None = None
    deny_patterns: list[str] = Field(default_factory=list)
    disabled_rules: list[str] = Field(default_factory=list)
    policy_files: list[str] = Field(default_factory=list)
    opa_url: str | None = None
    opa_path: str = "orga/allow"
    timeout_s: float = Field(default=5.0, gt=0)
