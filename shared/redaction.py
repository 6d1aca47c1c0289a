"""Replacing every echo of a secret (a model API key, a token) in text with ``**********``.

A secret is found however a tool or a server echoes it: as written, in any letter case,
percent-encoded, hex-encoded, base64-encoded (standard or URL-safe alphabet, at any of the three
byte alignments the secret can have inside a longer encoded text), and cut short: any run of
at least :data:`MIN_ECHO_CHARS` characters of one of those forms that starts like the form
(``sk-proj-abcd...`` cut after 12 characters) is redacted, as far as it goes.

The forms are computed once per secret (:class:`Redactor` is built once per process), their
first characters joined into one regular expression of literals; each hit is then extended
character by character as far as it matches the form. The cost of :meth:`Redactor.redact` is
one scan of the text, plus the length of each echo found.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr

from shared.settings import node_urls

__all__ = [
    "CREDENTIAL_QUERY_PARAM",
    "MIN_ECHO_CHARS",
    "REDACTED",
    "Redactor",
    "redact_url",
    "redact_urls",
    "secret_values",
    "url_secrets",
]

REDACTED = "**********"
MIN_ECHO_CHARS = 12
"""An echo of a secret cut short is redacted from this many characters of its form on (a
secret shorter than this is redacted whole only)."""

_MIN_ENCODED_SECRET_CHARS = 8
"""Encoded forms of shorter secrets are not looked for: four base64 or hex characters would
match ordinary text."""


CREDENTIAL_QUERY_PARAM = re.compile(
    r"TOKEN|KEY|SECRET|PASSW|AUTH|SIG|CREDENTIAL|COOKIE|SESSION", re.IGNORECASE
)
"""A URL query parameter whose name says it carries a credential (``token``, ``api_key``,
``api-key``, ``key``, ``X-Amz-Signature``, ``password``, ``auth``)."""
_URL_QUERY_SHOWN = "***"
_URL_PATH_SHOWN = "***"
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+")
"""A URL inside a text (an exception's message): scheme, then up to a space or a quote."""
_SCHEME = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://")
_HOST_PORT = re.compile(r"^(?:[A-Za-z0-9._~%!$&'()*+;=-]+|\[[0-9A-Fa-f:.]+\])(?::\d*)?$")
"""An authority that is a host (a name, an IPv4 or a bracketed IPv6 literal) and an optional
numeric port, with no userinfo: ``api.example.com:8443``, ``[::1]:8080``."""
_NEXT_URL = re.compile(r"\s*([;,])\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
"""A ``;`` (kombu's failover brokers) or ``,`` (a cluster's nodes) that starts another URL."""
_SECRET_SEGMENT = re.compile(r"^[A-Za-z0-9._~+=%@:-]{16,}$")
"""A path segment that may be a token: 16 or more token characters (and two of lower case,
upper case and digits, :func:`_is_secret_segment`)."""


def redact_url(url: str, *, path_segments: int | None = None) -> str:
    """``url`` without its userinfo (``user:password@``), with its query shown as ``***``
    (``?api-key=...``, ``?key=...``, a signed URL's signature) and each path segment that may
    be a token (``/services/T0/B0/<token>``: :func:`_is_secret_segment`) as ``***``, its
    fragment dropped: the form every error message, banner and log record that names a URL
    uses (the one implementation: :func:`coordinator.logs.redact_url` and
    :func:`coordinator.webhooks.public_url` call it). ``path_segments``: keep at most that
    many path segments, the rest shown as ``/***``.

    The userinfo is cut on the raw text, before any parsing (:func:`_split_userinfo`): a
    password with an unencoded ``/``, ``#``, ``?`` is hidden whole, and an ``@`` in the path or
    query of a ``host[:port]`` is left where it is. The cost: a password made only of digits
    before its unencoded ``/`` (``redis://u:1234/5@h``) reads as a port and is shown. Several
    URLs separated by ``;`` (kombu's failover brokers) or ``,`` are each redacted, and so is
    each node of a cluster URL (``redis://:pw@a:7000/0,b:7001``,
    :func:`shared.settings.node_urls`) unless a query or fragment comes before the second node
    (a comma inside a query value is not a node boundary: the whole query is then hidden). A URL
    that cannot be parsed (a bad port, an open ``[``) loses the same parts, cut by text."""
    pieces = _NEXT_URL.split(url.strip())
    shown = [_redact_nodes(pieces[0], path_segments)]
    for separator, piece in zip(pieces[1::2], pieces[2::2], strict=True):
        shown += [separator, _redact_nodes(piece, path_segments)]
    return "".join(shown)


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """``url`` (one URL, raw) as ``(scheme://, userinfo, the rest)``, the userinfo cut on the
    raw text before any parsing. The authority is what comes before the first ``/``, ``?`` or
    ``#``: with an ``@`` in it, the userinfo ends at its last ``@``; when it is a plain
    ``host[:port]``, there is none (a later ``@`` is in the path or query:
    ``?email=a@b``); otherwise (``:Sec``, ``user:Pa``: a password holding an unencoded
    ``/``, ``?`` or ``#``) the userinfo ends at the URL's last ``@``."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return "", "", url
    rest = url[scheme.end() :]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        at = authority.rindex("@")
    elif "@" not in rest or _HOST_PORT.match(authority):
        return scheme.group(0), "", rest
    else:
        at = rest.rindex("@")
    return scheme.group(0), rest[:at], rest[at + 1 :]


def _without_userinfo(url: str) -> str:
    """``url`` (one URL, raw) without its userinfo (:func:`_split_userinfo`)."""
    scheme, _, rest = _split_userinfo(url)
    return scheme + rest


def _redact_nodes(url: str, path_segments: int | None) -> str:
    url = _without_userinfo(url)
    nodes = node_urls(url)
    if len(nodes) > 1 and not any(c in nodes[0] for c in "?#"):
        return ",".join(_redact_one(node, path_segments) for node in nodes)
    return _redact_one(url.strip(), path_segments)


def _redact_one(url: str, path_segments: int | None = None) -> str:
    if "://" not in url:  # a bare ``host:port`` node of a cluster URL: no scheme to parse by
        base = url.partition("#")[0].partition("?")[0]
        return base.rpartition("@")[2]
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        base, has_query, _ = url.partition("#")[0].partition("?")
        scheme, _, rest = base.partition("://")
        authority, slash, path = rest.partition("/")
        path = _shown_path(slash + path, path_segments)
        return f"{scheme}://{authority.rpartition('@')[2]}{path}" + (
            f"?{_URL_QUERY_SHOWN}" if has_query else ""
        )
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    query = _URL_QUERY_SHOWN if parts.query else ""
    path = _shown_path(parts.path, path_segments)
    return urlunsplit((parts.scheme, f"{host}{port}", path, query, ""))


def _shown_path(path: str, path_segments: int | None) -> str:
    """``path`` with each segment that may be a token as ``***``, and past ``path_segments``
    segments (when given) the rest as ``/***``."""
    if not path:
        return ""
    lead = "/" if path.startswith("/") else ""
    segments = path[len(lead) :].split("/")
    shown = [_URL_PATH_SHOWN if _is_secret_segment(s) else s for s in segments]
    if path_segments is not None and any(segments[path_segments:]):
        shown = [*shown[:path_segments], _URL_PATH_SHOWN]
    return lead + "/".join(shown)


def _is_secret_segment(segment: str) -> bool:
    """A path segment that may be a token (Slack's and Discord's webhook tokens, a UUID, a
    hex digest, Telegram's ``bot<id>:<token>``): 16 or more of ``A-Z a-z 0-9 . _ ~ + = % @ : -``
    mixing at least two of lower
    case, upper case and digits (``chat-completions`` is not; the cost: an identifier that
    looks like one, ``gpt-4o-mini-2024-07-18``, is hidden too)."""
    if not _SECRET_SEGMENT.match(segment):
        return False
    kinds = (str.islower, str.isupper, str.isdigit)
    return sum(any(test(c) for c in segment) for test in kinds) >= 2


def redact_urls(text: str) -> str:
    """``text`` (an HTTP library's error message, which may quote a URL) with every URL in it
    passed through :func:`redact_url`."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: the password of its userinfo, each path segment that may be
    a token (:func:`redact_url` shows it as ``***``) and the value of each credential-named
    query parameter (:data:`CREDENTIAL_QUERY_PARAM`), decoded: what a :class:`Redactor` must
    know to keep a server's echo of them (``POST /v1?api-key=...``) out of a message. A URL
    that cannot be parsed gives its password only."""
    pieces = _NEXT_URL.split(url.strip())
    if len(pieces) > 1:  # kombu's failover brokers, several nodes: each URL's own secrets
        return [secret for piece in pieces[::2] for secret in url_secrets(piece)]
    scheme, userinfo, rest = _split_userinfo(url.strip())
    password = userinfo.partition(":")[2]
    found = [unquote(password)] if password else []
    try:
        parts = urlsplit(scheme + rest)
    except ValueError:
        return found
    found += [unquote(s) for s in parts.path.split("/") if _is_secret_segment(s)]
    found += [
        value
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if value and CREDENTIAL_QUERY_PARAM.search(name)
    ]
    return found


class Redactor:
    """Redacts the echoes of a fixed set of secrets (empty: returns text unchanged)."""

    __slots__ = ("_anchors", "_forms")

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: dict[str, list[str]] = {}
        for secret in {s for s in secrets if s}:
            for form, anchor_chars in _forms(secret):
                forms.setdefault(form[:anchor_chars].lower(), []).append(form.lower())
        self._forms = forms
        alternatives = "|".join(re.escape(a) for a in sorted(forms, key=len, reverse=True))
        self._anchors = re.compile(alternatives, re.IGNORECASE) if forms else None

    def __bool__(self) -> bool:
        return self._anchors is not None

    def redact(self, text: str) -> str:
        """``text`` with every echo of a secret replaced by :data:`REDACTED`."""
        if self._anchors is None:
            return text
        parts: list[str] = []
        position = 0
        for match in self._anchors.finditer(text):
            if match.start() < position:
                continue
            end = max(
                _extent(text, match.start(), form) for form in self._forms[match.group().lower()]
            )
            parts += [text[position : match.start()], REDACTED]
            position = end
        if not parts:
            return text
        parts.append(text[position:])
        return "".join(parts)

    def redact_value(self, value: Any) -> Any:
        """A JSON-like value with every string in it (keys too) redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact_value(k): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(v) for v in value]
        return value


def secret_values(*models: BaseModel) -> list[str]:
    """The values of every ``SecretStr`` field of ``models`` (settings objects), set or not,
    looked for in nested models and in lists too (the secret of each ``ORGA_WEBHOOKS`` entry).
    A comma-separated value (``ORGA_API_TOKENS``) is a secret as a whole and each of its parts
    is one: a single token is what an echo would show."""
    found: list[str] = []
    for model in models:
        for name in type(model).model_fields:
            _collect(getattr(model, name), found)
    return found


def _collect(value: object, found: list[str]) -> None:
    """Append the secrets ``value`` holds (a SecretStr, a model, a list of them) to ``found``."""
    if isinstance(value, SecretStr):
        secret = value.get_secret_value().strip()
        if secret:
            found.append(secret)
            parts = [part.strip() for part in secret.split(",") if part.strip()]
            if len(parts) > 1:
                found.extend(parts)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _collect(getattr(value, name), found)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, found)


def _extent(text: str, start: int, form: str) -> int:
    """Where the echo of ``form`` (lower-cased) that starts at ``start`` ends."""
    length = 0
    limit = min(len(form), len(text) - start)
    while length < limit and text[start + length].lower() == form[length]:
        length += 1
    return start + length


def _forms(secret: str) -> Iterator[tuple[str, int]]:
    """The secret as written and (a long enough one) encoded in every way looked for, each
    with the length of its anchor: the form of the secret's first :data:`MIN_ECHO_CHARS`
    characters (the whole form for a shorter secret)."""
    head = secret[:MIN_ECHO_CHARS]
    yield secret, len(head)
    if len(secret) < _MIN_ENCODED_SECRET_CHARS:
        return
    for form, head_form in zip(_encoded(secret), _encoded(head), strict=True):
        yield form, min(len(head_form), len(form))


def _encoded(secret: str) -> Iterator[str]:
    """The encodings of ``secret``, always in the same order."""
    raw = secret.encode("utf-8", "surrogatepass")
    yield quote(secret, safe="")
    yield "".join(f"%{byte:02x}" for byte in raw)
    yield raw.hex()
    for aligned in _base64_cores(raw):
        yield aligned
        yield aligned.replace("+", "-").replace("/", "_")


def _base64_cores(raw: bytes) -> Iterator[str]:
    """The base64 characters that encode only the secret's bits, for each of the three byte
    alignments it can have in a longer encoded text."""
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
        first = -(-offset * 8 // 6)  # the first character with no bit of the bytes before
        last = (offset + len(raw)) * 8 // 6  # the characters after hold bits of what follows
        yield encoded[first:last]
