"""The private kombu methods ``workers/broker.py`` overrides or calls, pinned to the kombu they
were written against: a kombu release that renames one, changes its signature or changes its
code fails here, naming the method, before a worker misbehaves (docs/deploy.md, "kombu's
private methods"). The behaviour itself is tested against a real Redis in ``test_broker.py``.
"""

from __future__ import annotations

import hashlib
import inspect
from importlib.metadata import version

import pytest
from kombu.transport import redis as kombu_redis

from workers import broker

OVERRIDDEN = {
    (kombu_redis.Channel, "_connparams"): ("(self, asynchronous=False)", "e9a4295085a8fb90"),
    (kombu_redis.Channel, "_brpop_read"): ("(self, **options)", "c42518699709f2df"),
    (kombu_redis.Transport, "_deliver"): ("(self, message, queue)", "799e242f3ec53863"),
}
"""(kombu class, private method workers/broker.py overrides): (signature, digest of its
source) in the kombu of :data:`CHECKED_WITH`."""

CALLED = {
    (kombu_redis.Channel, "_create_client"): ("(self, asynchronous=False)", "dae92bc4075dafb9"),
    (kombu_redis.Channel, "_q_for_pri"): ("(self, queue, pri)", "f3997660680dd00f"),
    (kombu_redis.QoS, "_remove_from_indices"): (
        "(self, delivery_tag, pipe=None)",
        "980a109d54ad9136",
    ),
}
"""Private kombu methods workers/broker.py calls without overriding them."""

CHECKED_WITH = "5.7.0"
"""The kombu whose code the digests are of (pyproject.toml holds kombu to 5.7.x)."""

PINNED = {**OVERRIDDEN, **CALLED}


def _digest(method: object) -> str:
    return hashlib.sha256(inspect.getsource(method).encode()).hexdigest()[:16]  # type: ignore[arg-type]


@pytest.mark.parametrize(("owner", "name"), list(PINNED), ids=lambda v: getattr(v, "__name__", v))
def test_each_private_kombu_method_is_the_one_the_transport_was_written_against(
    owner: type, name: str
) -> None:
    """Each private kombu method the transport overrides or calls exists with the signature
    and the code it was written against."""
    signature, digest = PINNED[owner, name]
    method = getattr(owner, name, None)
    where = f"kombu {version('kombu')}'s {owner.__name__}.{name}"
    assert method is not None, f"{where} is gone: workers/broker.py overrides or calls it"
    assert str(inspect.signature(method)) == signature, (
        f"{where} now takes {inspect.signature(method)}, not {signature}: adapt workers/broker.py"
    )
    assert _digest(method) == digest, (
        f"{where} changed since kombu {CHECKED_WITH}: review workers/broker.py's use of it "
        "against the new code (docs/deploy.md, kombu's private methods), then update its digest"
    )


def test_every_private_kombu_method_the_transport_overrides_is_pinned() -> None:
    """No private method of kombu's Redis transport is overridden in workers/broker.py without
    being listed (and pinned) here and in docs/deploy.md."""
    overridden = set()
    for ours in (broker.QoS, broker.Channel, broker.Transport):
        for name in vars(ours):
            private = name.startswith("_") and not name.startswith("__")
            base = ours.__mro__[1]
            if private and callable(getattr(base, name, None)):
                overridden.add((getattr(base, name).__qualname__.split(".")[0], name))
    assert overridden == {(owner.__name__, name) for owner, name in OVERRIDDEN}
