"""Secret redaction: every encoding, case and cut-short echo of a key is replaced, once computed."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest
from pydantic import BaseModel, SecretStr

from shared import redaction
from shared.redaction import REDACTED, Redactor, redact_url, secret_values, url_secrets

KEY = "sk-proj-Q7vX2mZp9LwK4tRb8NcY/+Hs1Ue=="
OTHER = "sk-proj-Q7vX2mZp-a-second-key-with-the-same-start"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


ECHOES = {
    "plain": KEY,
    "upper": KEY.upper(),
    "lower": KEY.lower(),
    "percent": quote(KEY, safe=""),
    "percent, lower-case hex": quote(KEY, safe="").lower(),
    "percent, every byte": "".join(f"%{b:02X}" for b in KEY.encode()),
    "hex": KEY.encode().hex(),
    "hex, upper-case": KEY.encode().hex().upper(),
    "base64": _b64(KEY.encode()),
    "base64, after one byte": _b64(b"k" + KEY.encode()),
    "base64, after two bytes": _b64(b"ke" + KEY.encode()),
    "base64 of a JSON document": _b64(json.dumps({"api_key": KEY}).encode()),
    "base64, URL-safe": base64.urlsafe_b64encode(b"Bearer " + KEY.encode()).decode(),
    "base64 of an Authorization header": _b64(f"user:{KEY}".encode()),
    "cut to 12 characters": KEY[:12],
    "cut to 20 characters": KEY[:20],
    "cut, upper-cased": KEY[:16].upper(),
    "hex, cut": KEY[:14].encode().hex(),
    "base64, cut": _b64(KEY.encode())[:20],
}


@pytest.mark.parametrize("echo", ECHOES.values(), ids=ECHOES.keys())
def test_every_form_of_the_key_is_redacted(echo: str) -> None:
    """The key as written, in any case, percent/hex/base64-encoded, or cut short, is replaced."""
    text = f"env dump:\nORGA_API_KEY={echo}\nend"
    redacted = Redactor([KEY]).redact(text)
    assert REDACTED in redacted
    assert redacted.startswith("env dump:\nORGA_API_KEY=")
    assert redacted.endswith("\nend")
    for piece in (KEY[:12], KEY[-12:], _b64(KEY.encode())[4:16], KEY.encode().hex()[8:32]):
        assert piece.lower() not in redacted.lower(), redacted


def test_a_whole_echo_is_redacted_not_just_its_start() -> None:
    """The run that matches the key is replaced as far as it goes, and nothing after it."""
    assert Redactor([KEY]).redact(f"[{KEY}]") == f"[{REDACTED}]"
    assert Redactor([KEY]).redact(f"[{KEY[:20]}...]") == f"[{REDACTED}...]"


def test_keys_sharing_a_start_are_each_redacted_whole() -> None:
    """Two keys with the same first characters: each echo is redacted to its own end."""
    redactor = Redactor([KEY, OTHER])
    assert redactor.redact(f"{OTHER} {KEY}") == f"{REDACTED} {REDACTED}"


@pytest.mark.parametrize(
    "text",
    ["sk-proj-", KEY[:11], "hello world", _b64(KEY.encode())[:12], "", KEY[:8]],
)
def test_text_without_a_meaningful_echo_is_unchanged(text: str) -> None:
    """Fewer than 12 characters of the key (or of an encoding of it) are not an echo."""
    assert Redactor([KEY]).redact(text) == text


def test_a_short_secret_is_redacted_whole_only() -> None:
    """A secret shorter than 12 characters is redacted when echoed whole, in any case."""
    redactor = Redactor(["sk-short"])
    assert redactor.redact("a SK-SHORT b sk-sho") == f"a {REDACTED} b sk-sho"


def test_no_secret_no_work() -> None:
    """Without secrets the redactor is falsy and returns its input."""
    redactor = Redactor(["", ""])
    assert not redactor
    assert redactor.redact(KEY) == KEY


def test_values_are_redacted_deeply() -> None:
    """Strings inside mappings and lists (keys too) are redacted."""
    value = {"out": [KEY, 1], KEY: "x"}
    assert Redactor([KEY]).redact_value(value) == {"out": [REDACTED, 1], REDACTED: "x"}


def test_secret_values_are_read_from_settings() -> None:
    """Every set SecretStr field of the given settings is a secret; blank ones are not."""

    class Settings(BaseModel):
        api_key: SecretStr | None = None
        token: SecretStr | None = None
        name: str = "not secret"

    found = secret_values(Settings(api_key=SecretStr(KEY), token=SecretStr(" ")))
    assert found == [KEY]


def test_secret_values_split_token_lists_and_find_nested_secrets() -> None:
    """Each token of a comma-separated list is a secret of its own (an echo shows one), and
    the secret of a model nested in a list (an ``ORGA_WEBHOOKS`` entry) is found."""

    class Hook(BaseModel):
        url: str = "https://example.test/hook"
        secret: SecretStr | None = None

    class Settings(BaseModel):
        api_tokens: SecretStr | None = None
        webhooks: list[Hook] = []

    first, second, hook = "a" * 24 + "-first", "b" * 24 + "-second", "c" * 24 + "-hook"
    found = secret_values(
        Settings(
            api_tokens=SecretStr(f"{first}, {second}"),
            webhooks=[Hook(), Hook(secret=SecretStr(hook))],
        )
    )
    assert {first, second, hook} <= set(found)
    redactor = Redactor(found)
    text = f"token {second} and {hook}"
    assert second not in redactor.redact(text)
    assert hook not in redactor.redact(text)


def test_redaction_is_linear_on_a_large_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MB output full of near-misses is redacted with one scan for the anchors plus the
    characters of each hit compared: fewer characters compared than the text holds, counted
    (not timed)."""
    compared: list[int] = []
    extent = redaction._extent

    def counting_extent(text: str, start: int, form: str) -> int:
        end = extent(text, start, form)
        compared.append(end - start + 1)
        return end

    monkeypatch.setattr(redaction, "_extent", counting_extent)
    redactor = Redactor([KEY, OTHER])
    text = ("sk-proj-Q7vX2mZ" + "x" * 50 + "\n") * 60_000
    assert redactor.redact(text) == text.replace("sk-proj-Q7vX2mZ", REDACTED)
    assert len(compared) >= 60_000  # every near-miss was looked at
    assert sum(compared) < len(text)


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://:Sec/ret9@h:6379/0", "Sec/ret9"),
        ("redis://:Sec/ret9@h:6379/0", "Sec"),
        ("redis://:Sec#ret9@h:6379/0", "Sec"),
        ("redis://:Sec?ret9@h:6379/0", "Sec"),
        ("amqp://user:Pa/ss9@rabbit:5672//", "Pa"),
    ],
)
def test_redact_url_shows_no_part_of_an_unencoded_password(url: str, secret: str) -> None:
    """A password with a raw ``/``, ``#`` or ``?`` (``openssl rand -base64`` pasted unencoded
    into ``redis://:${REDIS_PASSWORD}@redis:6379/0``) is hidden whole: the userinfo is cut on
    the raw text, up to the URL's last ``@``."""
    assert secret not in redaction.redact_url(url), redaction.redact_url(url)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:Sec#r@h", "redis://h"),
        ("amqp://user:Pa/ss9@rabbit//", "amqp://rabbit//"),
        ("amqp://u:p1@a//;amqp://u:p2@b//", "amqp://a//;amqp://b//"),
        ("redis://:p1@a:7000/0, redis://:p/2@b:7000/0,c:7002", "redis://a:7000/0,redis://b:7000/0,c:7002"),
        ("https://example.com/in?email=a@b.test", "https://example.com/in?***"),
    ],
)  # fmt: skip
def test_each_url_of_a_failover_or_cluster_list_loses_its_userinfo(url: str, shown: str) -> None:
    """kombu's failover brokers (``;``) and a cluster's nodes (``,``) are each redacted; an
    ``@`` in the query of a dotted host is no userinfo."""
    assert redaction.redact_url(url) == shown


def test_token_like_path_segments_are_hidden_and_known_as_secrets() -> None:
    """A path segment that may be a token (long, mixing cases or digits) is shown as ``***``
    and is one of the URL's secrets; an ordinary path is kept."""
    url = "https://hooks.slack.com/services/T0AAAA/B0BBBB/XyZsecretTOKEN123456"
    assert redaction.redact_url(url) == "https://hooks.slack.com/services/T0AAAA/B0BBBB/***"
    assert redaction.url_secrets(url) == ["XyZsecretTOKEN123456"]
    assert redaction.url_secrets("redis://:Sec/ret9@h:6379/0") == ["Sec/ret9"]
    plain = "https://api.openai.com/v1/chat/completions"
    assert redaction.redact_url(plain) == plain
    assert redaction.redact_url(plain, path_segments=1) == "https://api.openai.com/v1/***"


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://api.example.com:8443/users?email=a@evil.com", "api.example.com:8443"),
        ("http://localhost:8080/search?q=x@b", "localhost:8080"),
        ("https://user@example.com/p@x", "example.com"),
        ("https://[::1]:8080/a@b", "[::1]:8080"),
    ],
)
def test_an_at_after_the_authority_does_not_replace_the_host(url: str, host: str) -> None:
    """The redacted form still names the host the URL names (an operator must tell URLs
    apart; ``https://evil.com`` for a call to api.example.com misleads)."""
    assert redact_url(url).startswith(f"{url.split('://', maxsplit=1)[0]}://{host}")


def test_url_secrets_of_failover_urls_are_each_password() -> None:
    """redact_url splits ``;``-separated URLs; url_secrets must too, or the Redactor looks for
    one "password" spanning both URLs and a server's echo of either is left in the text."""
    assert set(url_secrets("amqp://u:pw1@h1:5672//;amqp://u:pw2@h2:5672//")) >= {"pw1", "pw2"}


def test_url_secrets_has_no_url_fragment_for_a_password() -> None:
    """A query ``@`` is no userinfo: nothing of the URL's own host, port or path is a secret."""
    assert url_secrets("https://api.example.com:8443/users?email=a@evil.com") == []
