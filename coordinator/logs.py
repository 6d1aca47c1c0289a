"""Logging at the process edge: one line per event, with its bound fields, and no secrets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from shared.redaction import redact_url as shared_redact_url

__all__ = ["EventFormatter", "RateGate", "configure_logging", "redact_url"]

_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class EventFormatter(logging.Formatter):
    """``time level logger event key=value ...``: the fields passed in ``extra`` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        if fields:
            line += " " + " ".join(f"{k}={v!r}" for k, v in sorted(fields.items()))
        return line


@dataclass
class RateGate:
    """Lets one event per key through every ``interval_s`` and counts the ones held back, so
    a flood (forged messages) costs one log line per key and minute, not one per message."""

    interval_s: float = 60.0
    max_keys: int = 10_000
    _seen: dict[str, tuple[float, int]] = field(default_factory=dict, init=False, repr=False)

    def admit(self, key: str, now: float) -> int | None:
        """How many were held back since the last one let through, when this one goes through;
        None when it is held back."""
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            return None
        if last is None and len(self._seen) >= self.max_keys:
            self._seen.clear()  # forget old keys rather than grow without bound
        self._seen[key] = (now, 0)
        return last[1] if last is not None else 0


def configure_logging(level: str) -> None:
    """Log events to stderr at ``level`` (``ORGA_LOG_LEVEL``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(EventFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def redact_url(url: str) -> str:
    """The URL as logs and banners show it: :func:`shared.redaction.redact_url` (no userinfo,
    the query as ``***``, token-like path segments as ``***``, each URL of a ``;`` or ``,``
    list and each node of a cluster URL redacted), the one implementation."""
    return shared_redact_url(url)
