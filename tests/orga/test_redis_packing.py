"""The state's asyncio clients pack a command in one call to hiredis (:mod:`orga.redis_client`):
the same bytes as redis-py's own packer for every argument it accepts, redis-py's own errors
for those it refuses, the connection class of each URL scheme, and a real Redis answering."""

from __future__ import annotations

import asyncio
import math
import random
import struct
from typing import Any

import hiredis
import pytest
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import DataError

from orga.redis_client import PackedConnection, RedisClients, packed_connection_class

ARGUMENT_LISTS: list[tuple[Any, ...]] = [
    ("SET", "key", "value"),
    ("XADD", b"{p:03}:stream", "MAXLEN", "~", 10_000, "*", "field", b"\x00\xff binary"),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", -1, 0, 2**63 - 1, -(2**63), 10**30),
    ("ZADD", "z", 1.5, "m", 0.1, "n", -0.0, "o", 1e300, "p", 5e-324, "q"),
    ("ZADD", "z", math.inf, "m", -math.inf, "n", math.nan, "o"),
    ("SET", "ключ", "значение ✓ 🚀", ""),
    ("CLIENT SETINFO", "LIB-NAME", "redis-py"),  # two words: split by redis-py's own packer
    (b"GET", "key"),
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "key", memoryview(b"a view")),
    ("SET", "key", bytearray(b"an array")),
    ("GET\tkey",),  # redis-py splits a command name on any whitespace, and drops it at the ends
    ("CLIENT\tSETINFO", "LIB-NAME", "x"),
    ("GET\n", "key"),
    ("",),
    ("SET", "key", 2**64 - 1, -(2**64) + 1, 2**64, 10**300),  # within 64 bits, and beyond
]


@pytest.mark.parametrize("args", ARGUMENT_LISTS, ids=lambda a: str(a[0]))
def test_the_packed_bytes_are_redis_pys_own(args: tuple[Any, ...]) -> None:
    ours, theirs = PackedConnection(), Connection()
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))


def test_random_doubles_and_integers_pack_as_redis_py_packs_them() -> None:
    """hiredis writes a float with ``repr``, as redis-py's encoder does: 20,000 random doubles
    (every bit pattern, so subnormals, NaNs and infinities too) and integers agree."""
    rng = random.Random(27)
    ours, theirs = PackedConnection(), Connection()
    for _ in range(20_000):
        double = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        integer = rng.randint(-(2**80), 2**80)
        args = ("ZADD", "z", double, integer)
        assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))


def test_what_redis_py_refuses_is_refused_alike() -> None:
    ours, theirs = PackedConnection(), Connection()
    refusals: tuple[Any, ...] = (True, None, object())
    for refused in refusals:
        with pytest.raises(DataError) as mine:
            ours.pack_command("SET", "key", refused)
        with pytest.raises(DataError) as its:
            theirs.pack_command("SET", "key", refused)
        assert str(mine.value) == str(its.value)
    with pytest.raises(UnicodeEncodeError):
        ours.pack_command("SET", "key", "\udc80")  # a lone surrogate: strict UTF-8, as redis-py
    # An int beyond Python's 4,300 digits: hiredis would crash the process writing it; redis-py
    # raises ValueError, and so does the packed connection.
    with pytest.raises(ValueError, match="4300 digits"):
        ours.pack_command("SET", "key", 10**4300)


def test_plain_arguments_are_packed_by_hiredis_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the packed connection: plain arguments reach ``hiredis.pack_command`` in
    one call, with none of redis-py's per-argument encoding; anything else reaches redis-py's."""
    packed: list[tuple[object, ...]] = []
    real_pack = hiredis.pack_command

    def counting_pack(args: tuple[Any, ...]) -> bytes:
        packed.append(args)
        result: bytes = real_pack(args)
        return result

    monkeypatch.setattr(hiredis, "pack_command", counting_pack)
    theirs: list[tuple[object, ...]] = []
    real_theirs = AbstractConnection.pack_command

    def counting_theirs(self: AbstractConnection, *args: Any) -> list[bytes]:
        theirs.append(args)
        return real_theirs(self, *args)

    monkeypatch.setattr(AbstractConnection, "pack_command", counting_theirs)
    connection = PackedConnection()
    connection.pack_command("XADD", b"stream", "*", "field", 12, 1.5)
    assert packed == [("XADD", b"stream", "*", "field", 12, 1.5)]
    assert theirs == []
    connection.pack_command("SET", "key", memoryview(b"v"))
    connection.pack_command("SET", "key", 2**70)
    assert [args[-1] for args in theirs][1:] == [2**70]
    assert len(theirs) == 2


def test_another_encoding_is_left_to_redis_py() -> None:
    """A client that encodes in another codec packs through redis-py's own encoder."""
    ours = PackedConnection(encoding="latin-1")
    theirs = Connection(encoding="latin-1")
    args = ("SET", "clé", "été")
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
    assert b"cl\xe9" in b"".join(ours.pack_command(*args))


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:6379/0", Connection),
        ("rediss://127.0.0.1:6380/0", SSLConnection),
        ("unix:///tmp/redis.sock?db=0", UnixDomainSocketConnection),
    ],
)
def test_each_scheme_keeps_its_connection_class(url: str, base: type) -> None:
    """Giving redis-py a ``connection_class`` overrides the one of the URL's scheme: the packed
    class is picked for the scheme, so TLS and Unix sockets stay what the URL says."""
    packed = packed_connection_class(url)
    assert issubclass(packed, base)
    client = RedisClients(url).asyncio()
    try:
        assert client.connection_pool.connection_class is packed
    finally:
        asyncio.run(client.aclose())


def test_a_real_redis_answers_the_packed_commands(redis_url: str) -> None:
    async def scenario() -> None:
        client = RedisClients(redis_url).asyncio(decode_responses=True)
        try:
            await client.delete("packing:z", "packing:s")
            await client.zadd("packing:z", {"a": 1.5, "b": -2, "ü": 1e300})
            assert await client.zrange("packing:z", 0, -1, withscores=True) == [
                ("b", -2.0),
                ("a", 1.5),
                ("ü", 1e300),
            ]
            await client.set("packing:s", "значение ✓")
            assert await client.get("packing:s") == "значение ✓"
            async with client.pipeline(transaction=True) as pipe:
                pipe.incrby("packing:n", 3)
                pipe.expire("packing:n", 60)
                assert (await pipe.execute())[0] >= 3
            await client.delete("packing:z", "packing:s", "packing:n")
        finally:
            await client.aclose()

    asyncio.run(scenario())
