"""MCP tool servers as a task, an agent profile or the deployment declares them, and the names
their tools are offered under. Pure: no process, no network (:mod:`workers.tools.mcp` connects).

A server is reached over **stdio** (``command: [argv...]``, with ``env`` and ``cwd``, run by a
tool worker in the task's workspace) or over **streamable HTTP** (``url``, with ``headers``)::

    mcp_servers:
      - name: notes
        command: [python, notes_server.py]
      - name: search
        url: http://search.internal:8000/mcp

Each tool ``T`` of server ``S`` is offered to the model as ``S__T``: server names may not
contain ``__``, so the first ``__`` of an offered name separates the server from the tool. A
name the providers refuse (OpenAI and Anthropic accept ``^[A-Za-z0-9_-]{1,64}$``) is made
acceptable by :func:`offered_tool_name`, which keeps the original for the call.

The deployment's servers (``ORGA_MCP_SERVERS``, a JSON or YAML file holding a list of servers
or ``{mcp_servers: [...]}``) come first; a task's or profile's server may not reuse one of
their names (:func:`combined_servers`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.errors import ConfigError
from shared.redaction import CREDENTIAL_QUERY_PARAM, redact_url

__all__ = [
    "MCP_NAME_SEPARATOR",
    "MCP_SERVER_NAME_PATTERN",
    "PYTHON_PLACEHOLDER",
    "McpListRequest",
    "McpListing",
    "McpServerSpec",
    "McpTarget",
    "McpToolEntry",
    "check_no_credentials",
    "check_unique_names",
    "combined_servers",
    "is_mcp_tool",
    "offered_tool_name",
    "parse_mcp_servers",
    "redact_command",
    "redact_url",
    "split_tool_name",
]

MCP_NAME_SEPARATOR = "__"
PYTHON_PLACEHOLDER = "{python}"
"""A stdio server's program written ``{python}`` runs with the worker's own interpreter (it has
the ``mcp`` SDK installed): ``command: ["{python}", "server.py"]``."""
MCP_SERVER_NAME_PATTERN = r"^[a-zA-Z0-9_-]+$"
_SERVER_NAME = re.compile(MCP_SERVER_NAME_PATTERN)
_MAX_SERVER_NAME = 40
"""A server name leaves room for a tool name within the 64 characters providers accept."""
_MAX_OFFERED = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_CREDENTIAL = re.compile(
    r"(^ORGA_)|(^AWS_)|KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE
)

_CREDENTIAL_PARAM = CREDENTIAL_QUERY_PARAM
_CREDENTIAL_FLAG = re.compile(
    r"^--?[\w-]*(?:token|api[-_]?key|secret|passw(?:or)?d|credential|auth)[\w-]*$",
    re.IGNORECASE,
)
"""An argv option whose name says it takes a credential (``--token``, ``--api-key``,
``--password``, ``--client-secret``)."""
_NAMES_A_PLACE = re.compile(r"[-_](?:file|path|env|var|dir)$", re.IGNORECASE)
"""``--token-file x``, ``--api-key-env NAME``: the option names where the secret is, not it."""
_REDACTED = "***"


def redact_command(command: Sequence[str]) -> list[str]:
    """``command`` with the values of credential-looking options (``--token=x``,
    ``--api-key x``) replaced by ``***`` (what an error may quote)."""
    shown: list[str] = []
    hide_next = False
    for item in command:
        flag, eq, _ = item.partition("=")
        if hide_next:
            shown.append(_REDACTED)
            hide_next = False
        elif _CREDENTIAL_FLAG.match(flag):
            shown.append(f"{flag}={_REDACTED}" if eq else item)
            hide_next = not eq
        else:
            shown.append(item)
    return shown


def _url_credential(url: str) -> str | None:
    """What in ``url`` looks like a credential (userinfo, a credential query parameter)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None:
        return "user information (user:password@)"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _CREDENTIAL_PARAM.search(name):
            return f"the query parameter {name!r}"
    return None


def _argv_credential(command: Sequence[str]) -> str | None:
    """The credential-looking option of ``command`` that carries a value, if any."""
    for index, item in enumerate(command[1:], start=1):
        flag, eq, value = item.partition("=")
        if not _CREDENTIAL_FLAG.match(flag) or _NAMES_A_PLACE.search(flag):
            continue
        if (eq and value) or (not eq and index + 1 < len(command)):
            return flag
    return None


class McpServerSpec(BaseModel):
    """One MCP server: ``command`` (stdio) or ``url`` (streamable HTTP), never both.

    ``command[0]`` is looked up on the command ``PATH``; ``{python}`` stands for the worker's
    own interpreter (which has the ``mcp`` SDK).
    ``env`` is added to the scrubbed environment of a command (``PATH``, ``LANG``,
    ``HOME``=workspace); ``cwd`` is a folder inside the workspace (default: the workspace).
    ``headers`` go with every HTTP request (e.g. an ``Authorization`` the server expects).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=_MAX_SERVER_NAME)
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        name = self.name
        if not _SERVER_NAME.match(name) or MCP_NAME_SEPARATOR in name:
            raise ValueError(
                f"MCP server name {name!r} must match {MCP_SERVER_NAME_PATTERN} without '__' "
                "(its tools are offered as '<server>__<tool>'); rename it, e.g. 'my-server'"
            )
        if (self.command is None) == (self.url is None):
            both = "both 'command' and 'url'" if self.command else "neither 'command' nor 'url'"
            raise ValueError(
                f"MCP server {name!r} has {both}; give 'command: [argv...]' for a server over "
                "stdio or 'url: http(s)://...' for one over streamable HTTP"
            )
        if self.command is not None and not self.command[0].strip():
            raise ValueError(f"MCP server {name!r}: command[0] is empty; name the program to run")
        if self.url is not None:
            self._check_http()
        elif self.headers:
            raise ValueError(f"MCP server {name!r}: 'headers' are for a 'url' server only")
        return self

    def _check_http(self) -> None:
        if not self.url or not re.match(r"\Ahttps?://[^/\s]+", self.url):
            raise ValueError(
                f"MCP server {self.name!r}: url {redact_url(self.url or '')!r} is not an "
                "http(s) URL; "
                "write it as http://host:port/mcp"
            )
        if self.env or self.cwd is not None:
            raise ValueError(
                f"MCP server {self.name!r}: 'env' and 'cwd' are for a 'command' server only"
            )

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command is not None else "http"

    def digest(self) -> str:
        """Changes when anything that reaches the server changes (a session is kept per
        digest, so a changed declaration starts a new one)."""
        return hashlib.blake2b(self.model_dump_json().encode(), digest_size=8).hexdigest()


def check_unique_names(servers: Sequence[McpServerSpec], where: str) -> None:
    """Raise ValueError naming a server name used twice in ``where``."""
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise ValueError(
                f"MCP server name {server.name!r} is used twice in {where}; names must be unique"
            )
        seen.add(server.name)


def check_no_credentials(servers: Sequence[McpServerSpec], where: str) -> None:
    """Raise ValueError when a server of a task or profile carries a credential (a header or
    an environment variable whose name says so, user information or a credential-named query
    parameter in its URL, a ``--token=…``/``--api-key …``/``--password …`` argument of its
    command): a task is stored in Redis and its loop config in the journal, so credentials belong
    in the workers' ``ORGA_MCP_SERVERS`` file."""
    for server in servers:
        found: list[str] = [
            *(f"headers.{n}" for n in server.headers if _CREDENTIAL.search(n)),
            *(f"env.{n}" for n in server.env if _CREDENTIAL.search(n)),
        ]
        if server.url is not None and (in_url := _url_credential(server.url)) is not None:
            found.append(f"url {redact_url(server.url)!r} ({in_url})")
        if server.command is not None and (flag := _argv_credential(server.command)):
            found.append(f"command argument {flag} with a value")
        if found:
            raise ValueError(
                f"{where}: MCP server {server.name!r} {found[0]} looks like a "
                "credential, and a task file holds no secrets (it is stored in Redis and "
                "its config in the journal); declare the server in the workers' "
                "ORGA_MCP_SERVERS file instead"
            )


def combined_servers(
    deployment: Sequence[McpServerSpec], task: Sequence[McpServerSpec]
) -> tuple[McpServerSpec, ...]:
    """The deployment's servers, then the task's; ConfigError when a task's server reuses a
    deployment name."""
    taken = {s.name for s in deployment}
    clash = [s.name for s in task if s.name in taken]
    if clash:
        raise ConfigError(
            f"the task declares MCP server(s) {clash}, a name the deployment's ORGA_MCP_SERVERS "
            f"already uses ({sorted(taken)}); rename the task's server"
        )
    return (*deployment, *task)


def parse_mcp_servers(text: str | bytes, source: str) -> tuple[McpServerSpec, ...]:
    """The servers of an ``ORGA_MCP_SERVERS`` file (JSON or YAML: a list of servers, or a
    mapping with an ``mcp_servers`` list); ConfigError naming the file and the fault."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML or JSON: {exc}") from exc
    if isinstance(data, dict) and set(data) == {"mcp_servers"}:
        data = data["mcp_servers"]
    if not isinstance(data, list):
        raise ConfigError(
            f"{source}: expected a list of MCP servers (or {{mcp_servers: [...]}}), "
            f"got {type(data).__name__}"
        )
    servers = []
    for index, item in enumerate(data):
        try:
            servers.append(McpServerSpec.model_validate(item))
        except ValidationError as exc:
            raise ConfigError(f"{source}: server {index}: {_first_error(exc)}") from exc
    try:
        check_unique_names(servers, source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return tuple(servers)


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def is_mcp_tool(name: str) -> bool:
    """Whether ``name`` is an offered MCP tool name (``<server>__<tool>``)."""
    server, sep, tool = name.partition(MCP_NAME_SEPARATOR)
    return bool(sep and server and tool)


def split_tool_name(name: str) -> tuple[str, str]:
    """``(server, offered tool part)`` of ``<server>__<tool>``; ValueError otherwise."""
    server, sep, tool = name.partition(MCP_NAME_SEPARATOR)
    if not (sep and server and tool):
        raise ValueError(f"{name!r} is not an MCP tool name ('<server>__<tool>')")
    return server, tool


def offered_tool_name(server: str, tool: str, taken: Iterable[str] = ()) -> str:
    """``<server>__<tool>``, made a name the OpenAI and Anthropic wires accept: characters
    outside ``[A-Za-z0-9_-]`` become ``_``, and a name too long (or already ``taken`` by
    another tool of the server) is cut and ends with a short digest of the original."""
    safe = _UNSAFE.sub("_", tool) or "_"
    name = f"{server}{MCP_NAME_SEPARATOR}{safe}"
    if safe == tool and len(name) <= _MAX_OFFERED and name not in set(taken):
        return name
    digest = hashlib.blake2b(tool.encode(), digest_size=4).hexdigest()
    return f"{name[: _MAX_OFFERED - len(digest) - 1]}_{digest}"


class McpToolEntry(BaseModel):
    """One tool of a server as listed: the offered name, the server's own name for it, its
    description and input schema."""

    model_config = ConfigDict(frozen=True)

    offered: str
    server: str
    tool: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class McpTarget(BaseModel):
    """What a tool worker needs to run one MCP call: the server and its own name for the tool."""

    model_config = ConfigDict(frozen=True)

    server: McpServerSpec
    tool: str


class McpListRequest(BaseModel):
    """A reasoning worker's request to a tool worker (task ``orga.mcp_list``): start the
    task's MCP servers in its workspace, list their tools, store the listing and answer on
    ``reply_key``."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    workspace: str
    workspace_template: str | None = None
    workspace_base: str | None = None
    servers: list[McpServerSpec] = Field(default_factory=list)
    """The task's own servers (the tool worker adds its deployment's)."""
    reply_key: str


class McpListing(BaseModel):
    """The tools of a task's MCP servers, listed once and kept for the task (so a server that
    flaps does not make its tools vanish mid-step); or the error that stopped the listing."""

    model_config = ConfigDict(frozen=True)

    tools: list[McpToolEntry] = Field(default_factory=list)
    error: str | None = None
    """A configuration error naming the server and the cause: the reasoning fails with it."""

    def entry(self, offered: str) -> McpToolEntry | None:
        """The tool offered as ``offered``, or None."""
        return next((t for t in self.tools if t.offered == offered), None)

    def target(self, offered: str, servers: Sequence[McpServerSpec]) -> McpTarget | None:
        """The server and tool behind ``offered``, or None when no listed tool has that name."""
        entry = self.entry(offered)
        spec = next((s for s in servers if entry is not None and s.name == entry.server), None)
        return None if entry is None or spec is None else McpTarget(server=spec, tool=entry.tool)

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"))
