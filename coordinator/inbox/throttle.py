"""How many failed logins the inbox takes: per client address and per user name, in a fixed
window, counted in Redis so that every inbox replica behind one address shares the count.

A login form with a wrong token, a wrong basic-auth password and a wrong bearer token are
failures; a request without credentials is not. A bearer token names nobody, so its failures
count for the address only (one shared name would let anyone lock every bearer client out).
Once either count reaches the limit, every attempt from that address or for that name is
refused (429 with ``Retry-After``), right or wrong, until the window ends.

Checking the counts and counting a failure are one Lua script, one round trip: a failure is
counted only while the counts are under the limit, so however many requests arrive at once, at
most ``max_failures`` wrong credentials per window get an answer other than 429.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import redis
from redis.commands.core import Script

from shared import keys

__all__ = ["LoginThrottle"]

_ATTEMPT = """
-- KEYS: the failure counters (address, then name if any)
-- ARGV: max_failures, window_s, 1 to count this attempt as a failure (0: a right credential)
local max_failures = tonumber(ARGV[1])
local wait = 0
for _, key in ipairs(KEYS) do
    local count = tonumber(redis.call('GET', key) or '0')
    if count >= max_failures then
        local ttl = redis.call('TTL', key)
        if ttl < 1 then ttl = 1 end
        if ttl > wait then wait = ttl end
    end
end
if wait > 0 then return wait end
if ARGV[3] == '1' then
    for _, key in ipairs(KEYS) do
        if redis.call('INCR', key) == 1 then redis.call('EXPIRE', key, tonumber(ARGV[2])) end
    end
end
return 0
"""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LoginThrottle:
    """At most ``max_failures`` failed logins per ``window_s`` from one address or for one name."""

    redis: redis.Redis
    max_failures: int = 10
    window_s: int = keys.inbox_login_window_s
    _attempt: Script = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_attempt", self.redis.register_script(_ATTEMPT))

    def attempt(self, address: str, user: str | None, *, failed: bool) -> int | None:
        """Judge a login from ``address`` for ``user`` (None: a bearer token, counted for the
        address only) whose credential was ``failed`` (wrong) or right: the seconds to wait when
        the address or the name is at the limit (the attempt refused, not counted), else None
        (a failure counted; the window starts at the first). Atomic, in one round trip."""
        counters = [keys.inbox_login_failures_key("addr", _digest(address))]
        if user is not None:
            counters.append(keys.inbox_login_failures_key("user", _digest(user)))
        wait = self._attempt(
            keys=counters, args=[self.max_failures, self.window_s, "1" if failed else "0"]
        )
        return int(wait) or None

    def refusal(self, retry_after_s: int) -> str:
        """What a refused reviewer is told."""
        return (
            f"too many failed logins from this address or for this name ({self.max_failures} "
            f"within {self.window_s} s): try again in {retry_after_s} s"
        )
