"""Durations on the wire: ``"15s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` or a number of seconds.

Symbiont's serde shape ``{"secs": 30, "nanos": 0}`` is accepted on input too. Durations are written
back as the shortest exact humantime-like string (``"5m"``, ``"30s"``, ``"500ms"``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema
from pydantic.json_schema import GenerateJsonSchema

__all__ = ["Duration", "DurationDefaultsSchema", "format_duration", "parse_duration"]

_UNIT_MICROSECONDS = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "sec": 1_000_000,
    "secs": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "mins": 60_000_000,
    "h": 3_600_000_000,
    "hr": 3_600_000_000,
    "d": 86_400_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_WHOLE = re.compile(r"^(?:\s*\d+(?:\.\d+)?\s*[a-z]+)+\s*$")


def parse_duration(value: Any) -> timedelta:
    """Parse a duration given as text, seconds, a ``timedelta`` or Symbiont's ``{secs, nanos}``."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValueError(f"duration must be a number of seconds or text like '15s', got {value!r}")
    elif isinstance(value, int | float):
        result = timedelta(seconds=value)
    elif isinstance(value, dict) and set(value) <= {"secs", "nanos"} and "secs" in value:
        result = timedelta(seconds=value["secs"], microseconds=value.get("nanos", 0) / 1000)
    elif isinstance(value, str):
        result = _parse_text(value) if len(value) <= _CACHED_TEXT else _parse(value)
    else:
        raise ValueError(
            f"duration must be a number of seconds or text like '15s' or '5m', got {value!r}"
        )
    if result < timedelta(0):
        raise ValueError(f"duration must not be negative, got {value!r}")
    return result


_CACHED_TEXT = 64
"""Every request a worker decodes carries the same few duration texts ("5m", "20s"): texts up to
this length are parsed once per process (``_parse_text``, an LRU of 256); longer ones each time."""


@lru_cache(maxsize=256)
def _parse_text(text: str) -> timedelta:
    return _parse(text)


def _parse(text: str) -> timedelta:
    lowered = text.strip().lower()
    try:
        return timedelta(seconds=float(lowered))
    except ValueError:
        pass
    if not _WHOLE.match(lowered):
        raise ValueError(
            f"invalid duration {text!r}: use a number of seconds or units us, ms, s, m, h, d "
            "(e.g. '15s', '5m', '1h30m')"
        )
    microseconds = Decimal(0)
    for number, unit in _PART.findall(lowered):
        if unit not in _UNIT_MICROSECONDS:
            raise ValueError(
                f"invalid duration {text!r}: unknown unit {unit!r}; use us, ms, s, m, h or d"
            )
        microseconds += Decimal(number) * _UNIT_MICROSECONDS[unit]
    try:
        return timedelta(microseconds=int(microseconds.to_integral_value()))
    except OverflowError:
        raise ValueError(
            f"invalid duration {text!r}: too long (the limit is about 2.7 million years)"
        ) from None


def format_duration(value: timedelta) -> str:
    """Write a duration as the shortest exact string: ``5m``, ``30s``, ``1h30m``, ``500ms``."""
    total_us = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    if total_us == 0:
        return "0s"
    if total_us % 1000:
        return f"{total_us}us"
    if total_us % 1_000_000:
        return f"{total_us // 1000}ms"
    seconds = total_us // 1_000_000
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


_format_kept = lru_cache(maxsize=4096)(format_duration)
"""``format_duration`` of the durations met most recently: the same few (a task's timeouts and
delays) are written again with every reasoning request and record the coordinator encodes."""

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(_format_kept, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^(\s*\d+(\.\d+)?\s*[a-zA-Z]+)+\s*$"},
                {"type": "number", "minimum": 0},
            ],
            "description": "A duration: '15s', '5m', '1h30m', '250ms' or a number of seconds.",
        }
    ),
]


class DurationDefaultsSchema(GenerateJsonSchema):
    """A JSON Schema generator that writes a duration's default as task files write it
    (``"5m"``), not as pydantic's ISO 8601 (``"PT5M"``, which :func:`parse_duration` refuses):
    every default the schema prints loads back."""

    def encode_default(self, dft: Any) -> Any:
        """``format_duration`` for a duration; pydantic's encoding for anything else."""
        if isinstance(dft, timedelta):
            return format_duration(dft)
        return super().encode_default(dft)
