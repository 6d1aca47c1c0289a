"""The exception tree of the shared package.

    OrgaError
     +-- ConfigError          a configuration value is invalid (names the field, the value, the fix)
     +-- WireFormatError      a message on the wire does not match its model

Control signals (retry, escalate) are not exceptions of this tree: they are values returned by the
primitives (``StepDecision``, ``StagnationVerdict``) so that callers decide what to do.
"""

from __future__ import annotations

__all__ = ["ConfigError", "OrgaError", "WireFormatError"]


class OrgaError(Exception):
    """Base class of every error raised by orga-queue."""


class ConfigError(OrgaError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class WireFormatError(OrgaError, ValueError):
    """A message read from the wire does not match its model."""
