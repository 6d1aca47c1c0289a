"""Logging at the process edge: one line per event, with its bound fields, and no secrets."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

__all__ = ["EventFormatter", "configure_logging", "redact_url"]

_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class EventFormatter(logging.Formatter):
    """``time level logger event key=value ...``: the fields passed in ``extra`` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        if fields:
            line += " " + " ".join(f"{k}={v!r}" for k, v in sorted(fields.items()))
        return line


def configure_logging(level: str) -> None:
    """Log events to stderr at ``level`` (``ORGA_LOG_LEVEL``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(EventFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for logs and banners)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
