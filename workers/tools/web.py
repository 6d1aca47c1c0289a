"""``web_fetch``: GET a public http(s) URL and return its text, bounded in size and time.

Address policy (:mod:`workers.tools.address_policy`, shared with a task's MCP servers over
HTTP). Before any connection, the host is resolved and *every* address it resolves to is
checked; a loopback, private, link-local, multicast, reserved, unspecified or otherwise
non-global address refuses the whole URL. The connection then goes to
the address that was checked, not to a second DNS answer, so a rebinding DNS server cannot swap
in an internal address after the check (the ``Host`` header and the TLS server name still carry
the original host name). Redirects are followed by hand, at most ``MAX_REDIRECTS``, and every
hop goes through the same check. ``ToolContext.allow_private_network`` lifts the address policy
(for a local development server); the scheme check always applies.

Content. Text types (``text/*``, JSON, XML, JavaScript) are returned as text; HTML is reduced to
its text (scripts and styles dropped); anything else is refused as binary. The body is streamed
and reading stops at the size cap; the whole fetch is bounded by ``ToolContext.timeout_s``.
An HTTP error status is an ordinary result the model reads (``status`` in the metadata); only a
refused URL, a network failure, a timeout or a binary body are ``is_error`` outputs.

Metadata: ``kind=other``, ``url`` (the final URL), ``status``, ``content_type``, ``output_hash``
(SHA-256 of the body bytes read).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import httpx

from shared.inference import ToolDefinition
from workers.tools.address_policy import (
    BLOCKED_KINDS,
    IPAddress,
    Resolver,
    SystemResolver,
    blocked_address_reason,
    checked_addresses,
    ip_literal,
)
from workers.tools.arguments import ArgumentCheck
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.errors import BinaryContentError, BlockedAddressError, BlockedUrlError
from workers.tools.output import cap_text, error_output, looks_binary, sha256_hex

__all__ = [
    "DEFAULT_MAX_DOWNLOAD_BYTES",
    "MAX_DOWNLOAD_BYTES",
    "MAX_REDIRECTS",
    "WEB_FETCH_DEFINITION",
    "IPAddress",
    "Resolver",
    "SystemResolver",
    "WebFetchTool",
    "blocked_address_reason",
    "html_to_text",
]

DEFAULT_MAX_DOWNLOAD_BYTES = 2_000_000
MAX_DOWNLOAD_BYTES = 10_000_000
MAX_REDIRECTS = 5

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/x-sh",
    }
)
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_USER_AGENT = "orga-queue-web-fetch/1"

WEB_FETCH_DEFINITION = ToolDefinition(
    name="web_fetch",
    description=(
        "Fetch a public http or https URL with GET and return its text: HTML is reduced to "
        "readable text, JSON, XML and plain text are returned as they are, binary content is "
        "refused. Local and private network addresses are refused. Redirects are followed "
        f"(at most {MAX_REDIRECTS}). Large pages are cut at max_bytes."
    ),
    parameters={
        "type": "object",
        "properties": {
            "url": {
                "type": "string",
                "minLength": 1,
                "description": "Absolute http:// or https:// URL to fetch.",
            },
            "max_bytes": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_DOWNLOAD_BYTES,
                "description": "Stop reading the body after this many bytes "
                f"(default {DEFAULT_MAX_DOWNLOAD_BYTES}).",
            },
        },
        "required": ["url"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True, slots=True)
class _Page:
    url: str
    status: int
    reason: str
    content_type: str
    body: bytes
    cut_at: int | None


class WebFetchTool:
    """``web_fetch``: one GET of a public URL, checked hop by hop, returned as text.

    ``transport`` and ``resolver`` are seams for tests (``httpx.MockTransport``, a fixed table of
    names) and for operators (a proxy transport, a resolver with its own cache).
    """

    def __init__(
        self,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self._transport = transport
        self._resolver = resolver or SystemResolver()
        self._check = ArgumentCheck(WEB_FETCH_DEFINITION)

    @property
    def definition(self) -> ToolDefinition:
        """Name, description and JSON Schema of ``web_fetch``."""
        return WEB_FETCH_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Fetch the URL, or explain why not as an ``is_error`` output."""
        failure = self._check.failure(arguments, kind="other")
        if failure is not None:
            return failure
        url = str(arguments["url"])
        max_bytes = int(arguments.get("max_bytes", DEFAULT_MAX_DOWNLOAD_BYTES))
        try:
            async with asyncio.timeout(context.timeout_s):
                page = await self._fetch(url, max_bytes, context)
        except TimeoutError:
            message = f"web_fetch of {url!r} timed out after {context.timeout_s:g}s"
            return error_output(message, error_type="timeout", kind="other", url=url)
        except BlockedUrlError as exc:
            return error_output(str(exc), error_type="blocked_url", kind="other", url=url)
        except BinaryContentError as exc:
            return error_output(str(exc), error_type="binary", kind="other", url=url)
        except (httpx.HTTPError, OSError) as exc:
            return error_output(
                f"web_fetch of {url!r} failed: {type(exc).__name__}: {exc}",
                error_type="network",
                kind="other",
                url=url,
            )
        return _page_output(page, context.max_output_bytes)

    async def _fetch(self, url: str, max_bytes: int, context: ToolContext) -> _Page:
        current = _parse_url(url)
        async with httpx.AsyncClient(
            transport=self._transport,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(context.timeout_s),
        ) as client:
            for _hop in range(MAX_REDIRECTS + 1):
                addresses = await self._checked_addresses(current, context.allow_private_network)
                response = await _send(client, current, addresses)
                try:
                    location = response.headers.get("location")
                    if response.status_code not in _REDIRECT_STATUSES or not location:
                        return await _read_page(response, current, max_bytes)
                finally:
                    await response.aclose()
                current = _parse_url(str(current.join(location)))
        raise BlockedUrlError(
            f"web_fetch refused {url!r}: more than {MAX_REDIRECTS} redirects; "
            "fetch the final URL directly"
        )

    async def _checked_addresses(self, url: httpx.URL, allow_private: bool) -> list[IPAddress]:
        """The addresses of ``url``'s host, all allowed by the policy, in connection order;
        a name that does not resolve is a network error."""
        port = url.port or (443 if url.scheme == "https" else 80)
        host = _ascii_host(url)
        try:
            return await checked_addresses(host, port, self._resolver, allow_private=allow_private)
        except BlockedAddressError as exc:
            raise BlockedUrlError(
                f"web_fetch refused {str(url)!r}: {exc.finding}; {BLOCKED_KINDS} addresses "
                "are blocked unless the operator allows the private network"
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"could not resolve host {host!r}: {exc}") from exc


def _ascii_host(url: httpx.URL) -> str:
    """The host as sent on the wire (IDNA-encoded names, bare IPv6 addresses)."""
    return url.raw_host.decode("ascii")


def _parse_url(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BlockedUrlError(f"web_fetch refused {url!r}: not a valid URL ({exc})") from exc
    if parsed.scheme not in {"http", "https"}:
        raise BlockedUrlError(
            f"web_fetch refused {url!r}: scheme {parsed.scheme or '(none)'!r} is not allowed; "
            "only http:// and https:// URLs can be fetched"
        )
    if not parsed.host:
        raise BlockedUrlError(f"web_fetch refused {url!r}: the URL has no host")
    return parsed


async def _send(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[IPAddress]
) -> httpx.Response:
    """GET ``url`` from the first checked address that accepts a connection."""
    failure: httpx.ConnectError | None = None
    for address in addresses:
        try:
            return await client.send(_pinned_request(client, url, address), stream=True)
        except httpx.ConnectError as exc:
            failure = exc
    assert failure is not None  # addresses is never empty
    raise failure


def _pinned_request(client: httpx.AsyncClient, url: httpx.URL, address: IPAddress) -> httpx.Request:
    """A GET sent to ``address`` that still names ``url``'s host (Host header, TLS SNI)."""
    headers = {
        "Host": url.netloc.decode("ascii"),
        "User-Agent": _USER_AGENT,
        "Accept": "text/html, text/*;q=0.9, application/json;q=0.9, */*;q=0.1",
        "Accept-Encoding": "identity",
    }
    host = _ascii_host(url)
    extensions = {} if ip_literal(host) is not None else {"sni_hostname": host}
    target = url.copy_with(host=str(address))
    return client.build_request("GET", target, headers=headers, extensions=extensions)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_text_type(media_type: str) -> bool:
    return (
        media_type.startswith("text/")
        or media_type in _TEXT_TYPES
        or media_type.endswith(("+json", "+xml"))
    )


async def _read_page(response: httpx.Response, url: httpx.URL, max_bytes: int) -> _Page:
    content_type = response.headers.get("content-type", "")
    media_type = _media_type(content_type)
    if media_type and not _is_text_type(media_type):
        raise BinaryContentError(
            f"web_fetch refused {str(url)!r}: content type {media_type!r} is binary; only text, "
            "HTML, JSON and XML are returned"
        )
    body = bytearray()
    cut_at: int | None = None
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            del body[max_bytes:]
            cut_at = max_bytes
            break
    if not media_type and looks_binary(bytes(body)):
        raise BinaryContentError(
            f"web_fetch refused {str(url)!r}: the body is binary (it contains NUL bytes)"
        )
    reason = response.reason_phrase
    return _Page(str(url), response.status_code, reason, content_type, bytes(body), cut_at)


def _decode(page: _Page) -> str:
    match = re.search(r"charset=[\"']?([\w.:-]+)", page.content_type, re.IGNORECASE)
    encoding = match.group(1) if match else "utf-8"
    try:
        text = page.body.decode(encoding, errors="replace")
    except LookupError:
        text = page.body.decode("utf-8", errors="replace")
    return html_to_text(text) if _media_type(page.content_type) in _HTML_TYPES else text


def _page_output(page: _Page, max_output_bytes: int) -> ToolOutput:
    header = (
        f"url: {page.url}\nstatus: {page.status} {page.reason}\ncontent-type: {page.content_type}"
    )
    text = cap_text(_decode(page), max_output_bytes, hint="fetch a more specific page")
    if page.cut_at is not None:
        text += f"\n[download stopped at {page.cut_at} bytes; the page is longer]"
    metadata = {
        "kind": "other",
        "url": page.url,
        "status": str(page.status),
        "content_type": page.content_type,
        "output_hash": sha256_hex(page.body),
    }
    return ToolOutput(content=f"{header}\n\n{text}", metadata=metadata)


class _TextExtractor(HTMLParser):
    """Collects the visible text of an HTML document, one block element per line."""

    _SKIPPED = frozenset({"script", "style", "noscript", "template", "svg"})
    _BLOCKS = frozenset(
        {
            "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt",
            "figcaption", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr",
            "li", "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "title",
            "tr", "ul",
        }
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIPPED:
            self._skip_depth += 1
        elif tag in self._BLOCKS:
            self._parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIPPED:
            self._skip_depth = max(self._skip_depth - 1, 0)
        elif tag in self._BLOCKS:
            self._parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self._parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (line.strip() for line in "".join(self._parts).split("\n"))
        return "\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    """The visible text of ``html``: tags removed, scripts and styles dropped, blocks on lines."""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    return extractor.text()
