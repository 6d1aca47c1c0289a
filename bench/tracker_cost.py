"""Cost of ``ProgressTracker.record_and_check`` on large errors, next to plain Levenshtein.

Run: ``.venv/bin/python bench/tracker_cost.py``. Inputs are seeded, stack-trace-like text:

- *similar*: successive variants of one trace whose line numbers, addresses and timestamps all
  differ, with ~2% of the frames really changed and a few frames inserted at a random place;
- *dissimilar*: independent traces.

Each call compares the previous error with a new one, as in a real retry loop (so the previous
error's normalisation is already cached, the new one's is not). The plain column is rapidfuzz's
full normalised Levenshtein on the same raw pairs; at 1 MB it takes about 40 s a pair here, so
it is extrapolated from 64 KB (x256, quadratic) unless ``--plain-1mb`` times it once.

"agree" counts the calls whose decision equals that of the exact computation (normalised
Levenshtein of the normalised errors against the threshold): every pair up to 64 KB, the first
pair at 1 MB (computed with a banded cutoff, about a second). The last table puts the tracker's
similarity for the first pair (an estimate at 1 MB) next to the exact one.

The target is at most 5 ms per call at 1 MB, similar and dissimilar; the script prints PASS or
FAIL and exits 0 either way.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rapidfuzz.distance import Levenshtein

from shared.progress_tracker import (
    EXACT_SIMILARITY_MAX_CHARS,
    ProgressTracker,
    StepIterationConfig,
    normalized_similarity,
    similarity_at_least,
)
from shared.volatile import normalize_volatile

KB = 1024
SIZES = (1 * KB, 10 * KB, 64 * KB, 1024 * KB)
CALLS = {1 * KB: 41, 10 * KB: 21, 64 * KB: 9, 1024 * KB: 9}
PLAIN_RUNS = {1 * KB: 41, 10 * KB: 11, 64 * KB: 3, 1024 * KB: 1}
TARGET_MS = 5.0
TARGET_SIZE = 1024 * KB
THRESHOLD = StepIterationConfig().similarity_threshold

_WORDS = (
    "request",
    "response",
    "handler",
    "session",
    "client",
    "server",
    "router",
    "worker",
    "queue",
    "task",
    "retry",
    "timeout",
    "parse",
    "decode",
    "encode",
    "load",
    "save",
    "fetch",
    "commit",
    "rollback",
    "connect",
    "close",
    "open",
    "read",
    "write",
    "flush",
    "cache",
    "token",
    "schema",
    "field",
    "value",
    "index",
    "record",
    "batch",
    "stream",
    "buffer",
    "socket",
    "lock",
    "event",
)
_ERRORS = ("ValueError", "KeyError", "TimeoutError", "ConnectionResetError", "RuntimeError")


@dataclass(frozen=True, slots=True)
class _Frame:
    module: str
    function: str
    statement: str


def _frames(structure: random.Random, count: int) -> list[_Frame]:
    def word() -> str:
        return structure.choice(_WORDS)

    return [
        _Frame(
            f"{word()}/{word()}_{word()}", f"{word()}_{word()}", f"{word()} = {word()}({word()})"
        )
        for _ in range(count)
    ]


def _render(frame: _Frame, volatile: random.Random) -> str:
    day = f"2025-{volatile.randint(1, 12):02d}-{volatile.randint(1, 28):02d}"
    clock = f"{volatile.randint(0, 23):02d}:{volatile.randint(0, 59):02d}:00"
    stamp = f"{day}T{clock}.{volatile.randint(0, 999):03d}Z"
    where = f'"/srv/app/{frame.module}.py", line {volatile.randint(1, 2000)}'
    return (
        f"  File {where}, in {frame.function}\n"
        f"    {frame.statement}  # at 0x{volatile.getrandbits(48):012x} {stamp}\n"
    )


def _trace(structure_seed: int, variant_seed: int, size: int, *, mutate: bool) -> str:
    """About ``size`` characters of traceback: frames fixed by one seed, noise by the other."""
    structure = random.Random(structure_seed)
    variant = random.Random(variant_seed)
    frames = _frames(structure, max(1, size // 110))
    if mutate:
        frames = [_frames(variant, 1)[0] if variant.random() < 0.02 else f for f in frames]
        at = variant.randrange(len(frames))
        frames[at:at] = _frames(variant, 1 + len(frames) // 200)
    head = f"Traceback (most recent call last):  # worker pid {variant.randint(100, 99999)}\n"
    tail = f"{_ERRORS[structure_seed % len(_ERRORS)]}: failed after {variant.randint(1, 60)}s\n"
    body = "".join(_render(frame, variant) for frame in frames)
    text = (head + body)[: size - len(tail)]
    return text[: text.rfind("\n") + 1] + tail


def _errors(size: int, kind: str, count: int) -> list[str]:
    if kind == "similar":
        return [_trace(size, 1000 + i, size, mutate=True) for i in range(count)]
    return [_trace(size * 7 + i, 2000 + i, size, mutate=False) for i in range(count)]


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _tracker_run(errors: list[str]) -> tuple[float, list[bool]]:
    """Median ms per record_and_check over successive errors, and each call's decision."""
    tracker = ProgressTracker(StepIterationConfig(max_reattempts_per_step=10**9))
    tracker.begin_step("step")
    tracker.record_attempt("step", errors[0])
    samples: list[float] = []
    stops: list[bool] = []
    for error in errors[1:]:
        started = time.perf_counter()
        decision = tracker.record_and_check("step", error)
        samples.append(time.perf_counter() - started)
        stops.append(decision.stop)
    return _median_ms(samples), stops


def _plain_ms(errors: list[str], runs: int) -> float:
    samples = []
    for i in range(runs):
        a, b = errors[i % (len(errors) - 1)], errors[i % (len(errors) - 1) + 1]
        started = time.perf_counter()
        Levenshtein.normalized_similarity(a, b)
        samples.append(time.perf_counter() - started)
    return _median_ms(samples)


def _exact_similarity(a: str, b: str) -> float:
    """Exact normalised similarity of the normalised pair; 0.0 stands for "below threshold"."""
    na, nb = normalize_volatile(a), normalize_volatile(b)
    if max(len(na), len(nb)) <= EXACT_SIMILARITY_MAX_CHARS:
        return normalized_similarity(na, nb)
    return Levenshtein.normalized_similarity(na, nb, score_cutoff=THRESHOLD, score_hint=THRESHOLD)


def _agreement(errors: list[str], stops: list[bool], size: int) -> tuple[int, int]:
    pairs = len(stops) if size <= EXACT_SIMILARITY_MAX_CHARS else 1
    exact = [_exact_similarity(errors[i], errors[i + 1]) >= THRESHOLD for i in range(pairs)]
    return sum(e == s for e, s in zip(exact, stops, strict=False)), pairs


def _first_pair(errors: list[str]) -> str:
    a, b = errors[0], errors[1]
    tracker = similarity_at_least(a, b, 0.0)
    exact = _exact_similarity(a, b)
    exact_text = f"{exact:.3f}" if exact > 0.0 else f"< {THRESHOLD:.2f}"
    return f"tracker {tracker:.3f}  exact {exact_text}"


@dataclass(frozen=True, slots=True)
class _Row:
    size: int
    kind: str
    tracker_ms: float
    plain_ms: float
    plain_note: str
    stops: int
    calls: int
    agree: tuple[int, int]
    first_pair: str


def _measure(size: int, kind: str, plain_64k: dict[str, float], plain_1mb: bool) -> _Row:
    errors = _errors(size, kind, CALLS[size])
    tracker_ms, stops = _tracker_run(errors)
    if size < TARGET_SIZE or plain_1mb:
        plain_ms, note = _plain_ms(errors, PLAIN_RUNS[size]), ""
    else:
        plain_ms, note = plain_64k[kind] * (size / (64 * KB)) ** 2, "~"
    if size == 64 * KB:
        plain_64k[kind] = plain_ms
    agree = _agreement(errors, stops, size)
    return _Row(
        size, kind, tracker_ms, plain_ms, note, sum(stops), len(stops), agree, _first_pair(errors)
    )


def _print_rows(rows: list[_Row]) -> None:
    columns = f"{'tracker ms':>10} {'plain ms':>11} {'ratio':>9} {'stops':>7} {'agree':>6}"
    print(f"{'size':>7} {'pair':<10} {columns}")
    for r in rows:
        plain = f"{r.plain_note}{r.plain_ms:.2f}"
        print(
            f"{r.size // KB:>5}KB {r.kind:<10} {r.tracker_ms:>10.3f} {plain:>11} "
            f"{r.tracker_ms / r.plain_ms:>9.5f} {r.stops:>3}/{r.calls:<3}"
            f" {r.agree[0]:>3}/{r.agree[1]:<2}"
        )
    print(f"\nfirst pair of each row (threshold {THRESHOLD}):")
    for r in rows:
        print(f"{r.size // KB:>5}KB {r.kind:<10} {r.first_pair}")


def main() -> int:
    """Print the tables and the verdict on the 1 MB target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--plain-1mb", action="store_true", help="time plain Levenshtein at 1 MB once"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    plain_64k: dict[str, float] = {}
    rows = [
        _measure(size, kind, plain_64k, args.plain_1mb)
        for size in SIZES
        for kind in ("similar", "dissimilar")
    ]
    _print_rows(rows)
    if not args.plain_1mb:
        print("~ extrapolated from 64 KB (x256); --plain-1mb times it (about 40 s a pair)")
    worst = max(r.tracker_ms for r in rows if r.size == TARGET_SIZE)
    verdict = "PASS" if worst <= TARGET_MS else "FAIL"
    print(
        f"\n{verdict}: record_and_check at 1 MB takes {worst:.3f} ms per call"
        f" (worse median of similar and dissimilar); target {TARGET_MS:.0f} ms."
    )
    print(f"total {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
