"""How a model key reaches the reasoning workers without passing through anyone's environment.

``/proc/PID/environ`` is the environment a process was *started* with, readable by every
process of the same user: ``os.environ.pop`` does not erase it. A key in the environment of
``orga worker``'s supervisor, or of the ``orga run`` that starts the embedded runtime, would be
one read away for every tool command below them. So no process that starts a tool worker has
the key in its environment:

- the process that got the key in its environment (``orga worker``, ``orga run``) writes the
  keys into one Unix socket per reasoning worker (:func:`send`), then replaces itself
  (``execve``: a new environment, a new memory image) with a process whose environment has no
  key, holding only those sockets;
- that process passes each socket to one reasoning worker (named by :data:`KEYS_FD_VARIABLE`)
  and closes its own copy when the worker has started, before any tool worker starts;
- the reasoning worker reads its socket once, at its process edge (:func:`receive`), and
  closes it.

A socket, unlike a pipe or a file, cannot be opened again through ``/proc/PID/fd/N``, so a tool
command cannot read one another process holds. Standard library only: the supervisor imports it.

The secrets of the serving side (:data:`PROCESS_SECRET_VARIABLES`: the API's bearer tokens, the
webhooks with their secrets, the inbox's token, accounts and session secret) are kept from the
workers the same way: no worker's environment holds them (:func:`without_keys`; no worker
needs them), and ``orga run`` / ``orga api`` / ``orga inbox`` on the embedded runtime, an
ancestor of every tool command, write them into one socket for themselves
(:data:`SECRETS_FD_VARIABLE`) before they run again without them, and read them back at their
process edge (:func:`process_secrets`, :func:`receive`).

The connection URLs (:data:`CONNECTION_URL_VARIABLES`: ``ORGA_REDIS_URL``, ``ORGA_BROKER_URL``,
which may carry a password) are handed the same way: no worker's or supervisor's environment
holds them; each worker, of either role, gets them through a socket of its own
(:data:`CONNECTION_FD_VARIABLE`, :func:`connection_urls`) and reads it once at its process edge
(:func:`received_connection_urls`). Without them a tool command could read the Redis password
from an ancestor's ``/proc/PID/environ``, then forge observations or approve its own held call.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, MutableMapping

__all__ = [
    "CONNECTION_FD_VARIABLE",
    "CONNECTION_URL_VARIABLES",
    "KEYS_FD_VARIABLE",
    "MODEL_KEY_VARIABLES",
    "PROCESS_SECRET_VARIABLES",
    "SECRETS_FD_VARIABLE",
    "connection_urls",
    "fds",
    "model_keys",
    "process_secrets",
    "receive",
    "received_connection_urls",
    "send",
    "without_keys",
]

MODEL_KEY_VARIABLES = frozenset(
    {
        "ORGA_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "ORGA_LIVE_API_KEY",
    }
)
"""Environment variables that can hold a model key: in no environment but the one they were
given in (the reasoning workers receive them through :func:`send`)."""

PROCESS_SECRET_VARIABLES = frozenset(
    {
        "ORGA_API_TOKENS",
        "ORGA_WEBHOOKS",
        "ORGA_INBOX_TOKEN",
        "ORGA_INBOX_BASIC_AUTH",
        "ORGA_INBOX_SECRET",
    }
)
"""Environment variables holding a secret of the serving side (API tokens, webhook secrets,
the inbox's credentials): in no worker's environment, and handed by ``orga run`` / ``api`` /
``inbox`` to themselves through a socket (:data:`SECRETS_FD_VARIABLE`)."""

CONNECTION_URL_VARIABLES = frozenset({"ORGA_REDIS_URL", "ORGA_BROKER_URL"})
"""The connection URLs a worker needs, which may carry a password (``redis://:pw@host``,
``amqp://user:pw@host``): in no worker's or supervisor's environment; each worker receives
them through a socket of its own (:data:`CONNECTION_FD_VARIABLE`). (Celery's result backend
is off: no other URL holds a credential a worker needs.)"""

CONNECTION_FD_VARIABLE = "ORGA_CONNECTION_FD"
"""The file descriptor (a number, not a secret) of a worker's socket holding its
:data:`CONNECTION_URL_VARIABLES`."""

SECRETS_FD_VARIABLE = "ORGA_PROCESS_SECRETS_FD"
"""The file descriptor (a number, not a secret) of the socket holding the
:data:`PROCESS_SECRET_VARIABLES` a command handed to itself before it ran again without them."""

KEYS_FD_VARIABLE = "ORGA_MODEL_KEYS_FD"
"""The file descriptor (a number, not a secret) of a reasoning worker's key socket; in
``orga run``, after it dropped the keys from its environment, the comma-separated sockets it
holds for its reasoning workers."""

_MAX_BYTES = 1 << 20


def _key_variable(name: str) -> str | None:
    """The model-key variable ``name`` spells, in any letter case (the settings read the
    environment without regard to case, so ``orga_api_key`` is a key too); None otherwise."""
    upper = name.upper()
    return upper if upper in MODEL_KEY_VARIABLES else None


def model_keys(environ: Mapping[str, str]) -> dict[str, str]:
    """The model keys set (non-blank) in ``environ``, by their upper-case names (a name in
    upper case wins over another spelling of it)."""
    found: dict[str, str] = {}
    for name, value in sorted(environ.items(), key=lambda item: item[0].isupper()):
        variable = _key_variable(name)
        if variable is not None and value.strip():
            found[variable] = value
    return found


def process_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The :data:`PROCESS_SECRET_VARIABLES` set (non-blank) in ``environ``, by their
    upper-case names (a name in upper case wins over another spelling of it)."""
    found: dict[str, str] = {}
    for name, value in sorted(environ.items(), key=lambda item: item[0].isupper()):
        if name.upper() in PROCESS_SECRET_VARIABLES and value.strip():
            found[name.upper()] = value
    return found


def connection_urls(environ: Mapping[str, str]) -> dict[str, str]:
    """The :data:`CONNECTION_URL_VARIABLES` set (non-blank) in ``environ``, by their
    upper-case names (a name in upper case wins over another spelling of it)."""
    found: dict[str, str] = {}
    for name, value in sorted(environ.items(), key=lambda item: item[0].isupper()):
        if name.upper() in CONNECTION_URL_VARIABLES and value.strip():
            found[name.upper()] = value
    return found


def without_keys(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the model keys, the :data:`PROCESS_SECRET_VARIABLES` and the
    :data:`CONNECTION_URL_VARIABLES` (in any letter case), and without the variables naming
    the sockets that replace them (:data:`KEYS_FD_VARIABLE`, :data:`SECRETS_FD_VARIABLE`,
    :data:`CONNECTION_FD_VARIABLE`)."""
    return {
        name: value
        for name, value in environ.items()
        if _key_variable(name) is None
        and name.upper() not in PROCESS_SECRET_VARIABLES
        and name.upper() not in CONNECTION_URL_VARIABLES
        and name not in (KEYS_FD_VARIABLE, SECRETS_FD_VARIABLE, CONNECTION_FD_VARIABLE)
    }


def send(keys: Mapping[str, str]) -> int:
    """A socket holding ``keys`` for one reader: its file descriptor (inheritable, for
    ``pass_fds`` or an ``execve``). The writing end is closed: the reader gets the keys, then
    end of file."""
    reader, writer = socket.socketpair()
    try:
        writer.sendall(json.dumps(dict(keys)).encode())
    finally:
        writer.close()
    fd = reader.detach()
    os.set_inheritable(fd, True)
    return fd


def receive(fd: int, variable: str = KEYS_FD_VARIABLE) -> dict[str, str]:
    """Read the keys :func:`send` wrote on socket ``fd`` (named by ``variable``) and close it;
    a ``ValueError`` that says what is wrong when it holds something else."""
    with socket.socket(fileno=fd) as sock:
        chunks = []
        received = 0
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            received += len(chunk)
            if received > _MAX_BYTES:
                break
    try:
        keys = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise ValueError(
            f"{variable}={fd} does not hold the secrets `orga` handed over ({exc}); it is set "
            "by `orga worker`, `orga run`, `orga api` and `orga inbox` for the processes they "
            f"start: start them that way, or unset {variable} and set the variables it replaced"
        ) from exc
    if not isinstance(keys, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in keys.items()
    ):
        raise ValueError(f"{variable}={fd} holds no mapping of variable names to secrets")
    return keys


def fds(environ: Mapping[str, str]) -> list[int]:
    """The key sockets :data:`KEYS_FD_VARIABLE` names in ``environ`` (none when unset); a
    ``ValueError`` naming the value when it is not a list of numbers."""
    text = environ.get(KEYS_FD_VARIABLE, "").strip()
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise ValueError(
            f"{KEYS_FD_VARIABLE}={text!r} is not a comma-separated list of file descriptors; "
            "it is set by `orga` for the processes it starts: unset it"
        ) from exc


def received_connection_urls(environ: MutableMapping[str, str]) -> dict[str, str]:
    """The connection URLs this process was handed through the socket that
    :data:`CONNECTION_FD_VARIABLE` names in ``environ`` (``os.environ``: read once, the
    variable removed, the socket closed), else none: a worker started by hand reads them from
    its environment. A ``ValueError`` that says what is wrong when it holds anything else."""
    text = environ.pop(CONNECTION_FD_VARIABLE, "").strip()
    if not text:
        return {}
    try:
        fd = int(text)
    except ValueError as exc:
        raise ValueError(
            f"{CONNECTION_FD_VARIABLE}={text!r} is not a file descriptor; it is set by `orga "
            "worker` and `orga run` for the workers they start: unset it"
        ) from exc
    urls = receive(fd, CONNECTION_FD_VARIABLE)
    unknown = sorted(set(urls) - CONNECTION_URL_VARIABLES)
    if unknown:
        raise ValueError(
            f"{CONNECTION_FD_VARIABLE}={fd} holds {unknown}, not connection URLs "
            f"({sorted(CONNECTION_URL_VARIABLES)}): it is set by `orga worker` and `orga run`; "
            "start the worker with those"
        )
    return urls
