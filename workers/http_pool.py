"""The model calls' HTTP client: one ``aiohttp.ClientSession`` per worker process, reused.

A reasoning worker holds 200 model calls in flight on one event loop. Every model call goes
through the session :func:`pooled_session` builds (``workers/providers/_http.py`` posts on it),
built once per process on its loop (:meth:`workers.runtime.WorkerCore.http_session`)::

    session = pooled_session(max_per_host=512)      # inside a coroutine, on the loop
    ...
    await session.close()

Why aiohttp: its request path costs a third of httpx's CPU per call with 200 calls in flight
(0.4-0.5 ms against 1.4-1.6 ms for the same plain asyncio loop on the runtime's former
sharded httpx client; docs/performance.md, *What was changed for issue 27*, item 1). Its
connection pool takes a free connection in constant time, so the one pool of up to
``max_per_host`` connections per endpoint needs none of the sharding httpcore's pool scan made
necessary (16.9 ms of CPU per call with one httpx pool of 200 connections).

Only aiohttp's public API is used (``ClientSession``, ``TCPConnector``). The connections verify
TLS with the process's one context (:func:`shared_ssl_context`, what httpx's ``verify=True``
builds: certifi's roots, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``). The pooled session ignores
``HTTP_PROXY`` / ``HTTPS_PROXY`` (``trust_env`` off), as the sharded httpx client it replaces
did; a provider built without a session honours them (:func:`env_proxy`), as a fresh
``httpx.AsyncClient`` did.
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import httpx

__all__ = ["KEEPALIVE_S", "SessionSource", "env_proxy", "pooled_session", "shared_ssl_context"]

SessionSource = Callable[[], aiohttp.ClientSession]
"""Gives the session of the running loop, called on it for each request (a worker's
:meth:`workers.runtime.WorkerCore.http_session`): a provider can be built before the loop
runs, and outlive a loop."""

KEEPALIVE_S = 5.0
"""How long an idle connection is kept for the next call: httpx's default keep-alive expiry,
below the idle timeouts of common servers, so a connection the server is closing is rarely
taken."""


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process, what ``verify=True`` builds (certifi's roots, or
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``): building one costs about 20 ms of CPU and 1 MB."""
    return httpx.create_ssl_context()


def pooled_session(max_per_host: int) -> aiohttp.ClientSession:
    """A session keeping up to ``max_per_host`` connections to each model endpoint (host and
    port), verifying TLS with :func:`shared_ssl_context`. Call it inside a coroutine: the
    session belongs to the running loop, and whoever builds it closes it (``await
    session.close()``).

    The session sets no timeout and follows no redirect of its own accord: the caller passes
    both per request (``workers/providers/_http.py``). aiohttp's ``trust_env`` stays off: it
    would also read ``~/.netrc`` in a thread for every request, and refuse a request with an
    ``Authorization`` header when that file names the host.

    The session keeps no cookies (``aiohttp.DummyCookieJar``): one session serves every task's
    calls to an endpoint, so a cookie a provider set on one task's reply would otherwise go
    with every other task's calls (a model API authenticates by its key, not by cookies).
    """
    if max_per_host < 1:
        raise ValueError(
            f"max_per_host must be at least 1, got {max_per_host}: set ORGA_HTTP_MAX_CONNECTIONS "
            "to the connections one worker process may keep to each model endpoint"
        )
    connector = aiohttp.TCPConnector(
        limit=0,  # no cap over all endpoints: each has its own, and the calls in flight are few
        limit_per_host=max_per_host,
        ssl=shared_ssl_context(),
        keepalive_timeout=KEEPALIVE_S,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def env_proxy(url: str) -> str | None:
    """The proxy ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (either case) name for
    ``url``, or None (none set, or ``NO_PROXY`` covers the host): what httpx's ``trust_env``
    chose for a client built without a transport."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or _bypassed(parts.hostname or "", proxies.get("no", "")):
        return None
    return proxy


def _bypassed(host: str, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` covers ``host``: ``*``, the host itself, or a domain it is in."""
    host = host.lower().rstrip(".")
    for entry in no_proxy.split(","):
        domain = entry.strip().lower().lstrip(".").rstrip(".")
        if domain == "*" or (domain and (host == domain or host.endswith("." + domain))):
            return True
    return False
