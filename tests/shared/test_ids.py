"""Identifiers from the pooled randomness: UUID4s like ``uuid.uuid4()``'s, never repeated,
per thread, and a forked child does not hand out its parent's."""

from __future__ import annotations

import os
import threading
import uuid

from shared import ids


def test_identifiers_are_version_4_uuids_and_do_not_repeat() -> None:
    drawn = [ids.uuid4() for _ in range(5000)]  # more than one pool's worth
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in drawn)
    assert len(set(drawn)) == len(drawn)


def test_threads_draw_different_identifiers() -> None:
    drawn: list[list[uuid.UUID]] = [[], []]

    def draw(into: list[uuid.UUID]) -> None:
        into.extend(ids.uuid4() for _ in range(300))

    threads = [threading.Thread(target=draw, args=(d,)) for d in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not set(drawn[0]) & set(drawn[1])


def test_a_forked_child_does_not_repeat_its_parents_identifiers() -> None:
    ids.uuid4()  # the pool is filled: the child inherits it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next identifier and leave
        os.close(read)
        os.write(write, ids.uuid4().bytes)
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert uuid.UUID(bytes=child) != ids.uuid4()


def test_random_bytes_larger_than_the_pool() -> None:
    assert len(ids.random_bytes(10_000)) == 10_000
