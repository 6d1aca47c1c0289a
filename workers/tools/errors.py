"""The exception tree of the tools package.

    OrgaError
     +-- ToolError                        a tool could not do what it was asked
          +-- WorkspacePathError          a path argument cannot be used (NUL byte, no workspace)
          |    +-- PathOutsideWorkspaceError   the path resolves outside the workspace
          +-- BlockedUrlError             web_fetch refuses the URL (scheme or address policy)
          |    +-- BlockedAddressError    the host is or resolves to a non-public address
          +-- BinaryContentError          web_fetch refuses a body that is not text
          +-- DuplicateToolError          two tools share a name in one registry
          +-- UnknownToolError            no tool of that name is registered (also a KeyError)
          +-- ToolLoadError               an ``orga.tools`` entry point could not be loaded

The tools turn the errors of their own arguments into ``ToolOutput(is_error=True)`` values: the
model sees the message, nothing is raised. The registry errors are raised to (or, for entry
points, returned to) the operator who assembles the tools.
"""

from __future__ import annotations

import ipaddress

from shared.errors import OrgaError

__all__ = [
    "BinaryContentError",
    "BlockedAddressError",
    "BlockedUrlError",
    "DuplicateToolError",
    "PathOutsideWorkspaceError",
    "ToolError",
    "ToolLoadError",
    "UnknownToolError",
    "WorkspacePathError",
]


class ToolError(OrgaError):
    """Base class of the errors of the tools package."""


class WorkspacePathError(ToolError, ValueError):
    """A path argument cannot be used; the message names the path and the fix."""


class PathOutsideWorkspaceError(WorkspacePathError):
    """A path resolves, lexically or through a symbolic link, outside the workspace."""


class BlockedUrlError(ToolError, ValueError):
    """``web_fetch`` refuses a URL: a scheme other than http(s) or a non-public address."""


class BlockedAddressError(BlockedUrlError):
    """A host is, or resolves to, an address the address policy refuses
    (:mod:`workers.tools.address_policy`): each caller words the refusal with its URL and fix
    around :attr:`finding`."""

    def __init__(
        self,
        host: str,
        address: ipaddress.IPv4Address | ipaddress.IPv6Address,
        reason: str,
        *,
        literal: bool,
    ) -> None:
        self.host = host
        self.address = address
        self.reason = reason
        """The address's kind: ``loopback``, ``private``, ``link-local``, ..."""
        self.literal = literal
        """Whether the host was the address itself (not a name resolving to it)."""
        super().__init__(self.finding)

    @property
    def finding(self) -> str:
        """``127.0.0.1 is a loopback address`` or ``host 'x' resolves to 10.0.0.1, a private
        address``."""
        where = (
            f"{self.address} is"
            if self.literal
            else (f"host {self.host!r} resolves to {self.address},")
        )
        return f"{where} a {self.reason} address"


class BinaryContentError(ToolError, ValueError):
    """``web_fetch`` refuses a response body that is not text."""


class DuplicateToolError(ToolError, ValueError):
    """A tool name is already registered."""


class UnknownToolError(ToolError, KeyError):
    """No tool of that name is registered."""

    def __str__(self) -> str:
        # KeyError quotes its argument; the message is a sentence, not a key.
        return str(self.args[0]) if self.args else ""


class ToolLoadError(ToolError):
    """An ``orga.tools`` entry point could not be turned into tools; names the entry point."""

    def __init__(self, entry_point: str, message: str) -> None:
        super().__init__(message)
        self.entry_point = entry_point
