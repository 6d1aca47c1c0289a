"""Token logins kept server-side: a login is a record in Redis, and the signed session cookie
only carries its id, so logging out (or the record's expiry) ends it on every inbox replica,
even for a copy of the cookie taken before.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import cast

import redis

from shared import keys

__all__ = ["ReviewerSessions"]


@dataclass(frozen=True, slots=True)
class ReviewerSessions:
    """Starts, reads and ends the inbox's logins; a login lasts ``ttl_s`` at most."""

    redis: redis.Redis
    ttl_s: int = keys.inbox_session_ttl_s

    @staticmethod
    def _key(session_id: str) -> str:
        return keys.inbox_session_key(hashlib.sha256(session_id.encode()).hexdigest())

    def start(self, reviewer: str) -> str:
        """Record a login of ``reviewer``; its session id (a secret: it goes in the cookie)."""
        session_id = secrets.token_urlsafe(32)
        self.redis.set(self._key(session_id), reviewer, ex=self.ttl_s)
        return session_id

    def reviewer(self, session_id: str) -> str | None:
        """Who logged in with ``session_id``; None once it ended (logout, expiry) or never was."""
        return cast("str | None", self.redis.get(self._key(session_id))) if session_id else None

    def end(self, session_id: str) -> None:
        """Log out: the session id opens nothing from now on."""
        if session_id:
            self.redis.delete(self._key(session_id))
