"""How many failed logins the inbox takes: per client address and per user name, in a fixed
window, counted in Redis so that every inbox replica behind one address shares the count.

A login form with a wrong token, a wrong basic-auth password and a wrong bearer token are
failures; a request without credentials is not. Once either count reaches the limit, every
attempt from that address or for that name is refused (429 with ``Retry-After``) without being
checked, right or wrong, until the window ends.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import redis

from shared import keys

__all__ = ["LoginThrottle"]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LoginThrottle:
    """At most ``max_failures`` failed logins per ``window_s`` from one address or for one name."""

    redis: redis.Redis
    max_failures: int = 10
    window_s: int = keys.inbox_login_window_s

    def _keys(self, address: str, user: str) -> list[str]:
        return [
            keys.inbox_login_failures_key("addr", _digest(address)),
            keys.inbox_login_failures_key("user", _digest(user)),
        ]

    def retry_after_s(self, address: str, user: str) -> int | None:
        """Seconds until an attempt from ``address`` for ``user`` is checked again; None when it
        is checked now."""
        pipe = self.redis.pipeline(transaction=False)
        for key in self._keys(address, user):
            pipe.get(key)
            pipe.ttl(key)
        counts_and_ttls: list[Any] = pipe.execute()
        waits = [
            max(1, int(ttl))
            for count, ttl in zip(counts_and_ttls[::2], counts_and_ttls[1::2], strict=True)
            if count is not None and int(count) >= self.max_failures
        ]
        return max(waits) if waits else None

    def failed(self, address: str, user: str) -> None:
        """Count a failed login from ``address`` for ``user`` (the window starts at the first)."""
        pipe = self.redis.pipeline(transaction=True)
        for key in self._keys(address, user):
            pipe.set(key, 0, ex=self.window_s, nx=True)
            pipe.incr(key)
        pipe.execute()

    def refusal(self, retry_after_s: int) -> str:
        """What a refused reviewer is told."""
        return (
            f"too many failed logins from this address or for this name ({self.max_failures} "
            f"within {self.window_s} s): try again in {retry_after_s} s"
        )
