"""The exception tree of the shared package.

    OrgaError
     +-- ConfigError          a configuration value is invalid (names the field, the value, the fix)
     +-- WireFormatError      a message on the wire does not match its model
     +-- ServiceUnavailableError  a service a task needs is down (an outage, not the task's fault)
          +-- ProviderUnavailableError  the model's provider, past the worker's retry deadline
          +-- PolicyUnavailableError    the policy engine (an OPA server) could not be asked

Control signals (retry, escalate) are not exceptions of this tree: they are values returned by the
primitives (``StepDecision``, ``StagnationVerdict``) so that callers decide what to do.
"""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "ConfigError",
    "OrgaError",
    "OutageKind",
    "PolicyUnavailableError",
    "ProviderUnavailableError",
    "ServiceUnavailableError",
    "WireFormatError",
]

OutageKind = Literal["provider_unavailable", "policy_unavailable"]
"""What a worker reports an outage as (``WorkerFailedMessage.error_kind``)."""


class OrgaError(Exception):
    """Base class of every error raised by orga-queue."""


class ConfigError(OrgaError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class WireFormatError(OrgaError, ValueError):
    """A message read from the wire does not match its model."""


class ServiceUnavailableError(OrgaError):
    """A service the task needs did not answer usably (an outage of the infrastructure, not a
    failure of the task): ``service`` names it (``openai``, ``opa at http://opa:8181``)."""

    kind: ClassVar[OutageKind]

    def __init__(self, message: str, service: str) -> None:
        super().__init__(message)
        self.service = service


class ProviderUnavailableError(ServiceUnavailableError):
    """The model's provider kept failing (429, 5xx, unreachable, timeouts) through the
    worker's retries."""

    kind: ClassVar[OutageKind] = "provider_unavailable"


class PolicyUnavailableError(ServiceUnavailableError):
    """The policy engine could not be asked (unreachable, timed out, a 5xx): no decision was
    made, so nothing is denied on its account."""

    kind: ClassVar[OutageKind] = "policy_unavailable"
