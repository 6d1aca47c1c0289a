"""Cost of two loop primitives: the stagnation detector per observation, and pre-hydration.

Run: ``.venv/bin/python bench/primitives_bench.py`` (``--quick`` for fewer repetitions). Pure
Python, no Redis; the tracker's cost at 1 KB / 64 KB / 1 MB is ``bench/tracker_cost.py``.

**Detector.** One observation costs the detector's ``observe`` (mask and hash the output once,
update the windows), and in the coordinator also a restore and a snapshot of its state around
every apply (``StagnationDetector.from_state`` ... ``to_state``), because a task's state lives in
Redis between observations. Both are timed per observation, for outputs of 1 KB, 64 KB and 1 MB,
with a detector that has already seen 0, 500 or 2,048 distinct outputs (2,048 is the default
``max_seen_hashes``, the most it remembers). Events alternate between new output (progress) and
a repeat of an earlier one, so both paths of the detector run. Beside it, in the same run: one
BLAKE2b hash of the same output, the least any comparison of outputs must cost. (Tool outputs
reach the detector capped at 64 KB by the tools; 1 MB shows how the cost scales.)

**Pre-hydration.** Ten references, each resolved by a function that takes 200 ms, through
``PreHydrationEngine.hydrate`` with a ``FunctionResolver``: the resolutions run concurrently, so
the wall time should be near 200 ms, not the 2 s of resolving them one after the other (which
is printed beside it, measured the same way).

Target (the script prints PASS or FAIL and exits 0 either way): pre-hydration wall time below
300 ms (1.5 x one resolution). The detector has no target of its own; its figures are there to
compare with the coordinator's per-iteration cost in ``bench/runtime_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.pre_hydration import (
    FunctionResolver,
    PreHydrationConfig,
    PreHydrationEngine,
)
from shared.stagnation import StagnationConfig, StagnationDetector, ToolEvent, ToolKind

KB = 1024
SIZES = (1 * KB, 64 * KB, 1024 * KB)
OBSERVATIONS = {1 * KB: 41, 64 * KB: 21, 1024 * KB: 5}
QUICK_OBSERVATIONS = {1 * KB: 11, 64 * KB: 5, 1024 * KB: 3}
FILLS = (0, 500, 2048)
RESOLUTION_S = 0.2
REFERENCES = 10
PREHYDRATION_TARGET_S = 1.5 * RESOLUTION_S


# -- detector ---------------------------------------------------------------------------------


def output_text(size: int, seed: int) -> str:
    """Seeded command output of about ``size`` characters (log-like lines)."""
    rng = random.Random(seed)
    words = ("ok", "PASSED", "test_", "module", "line", "value", "warning", "elapsed", "0x")
    lines: list[str] = []
    total = 0
    while total < size:
        line = " ".join(f"{rng.choice(words)}{rng.randint(0, 9999)}" for _ in range(8))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


def events(size: int, count: int, seed: int) -> list[ToolEvent]:
    """``count`` command events; every other one repeats the output of an earlier one."""
    novel = [output_text(size, seed + i) for i in range(count // 2 + 1)]
    made = []
    for i in range(count):
        text = novel[i // 2] if i % 2 == 0 else novel[max(0, i // 2 - 1)]
        made.append(
            ToolEvent(
                tool_name="run_command",
                arguments={"command": f"pytest -k case{i % 7}"},
                output=text,
                exit_code=0 if i % 3 else 1,
                kind=ToolKind.COMMAND,
            )
        )
    return made


def filled_detector(config: StagnationConfig, fill: int) -> StagnationDetector:
    """A detector that has already seen ``fill`` distinct small outputs (numbers are masked as
    volatile, so the outputs differ by a word spelled from ``i``)."""
    detector = StagnationDetector(config)
    for i in range(fill):
        word = "".join(chr(ord("g") + (i // 20**k) % 20) for k in range(4))
        detector.observe(ToolEvent(tool_name="grep", output=f"found {word}", kind=ToolKind.OTHER))
    return detector


@dataclass(frozen=True)
class DetectorCost:
    """Per-observation milliseconds: ``observe`` alone, and restore + observe + snapshot."""

    size: int
    fill: int
    observe_ms: float
    apply_ms: float
    state_ms: float
    hash_ms: float


def detector_cost(size: int, fill: int, count: int) -> DetectorCost:
    """Time ``count`` observations both ways, on detectors filled to ``fill``."""
    config = StagnationConfig()
    sample = events(size, count, seed=size + fill)
    streaming = filled_detector(config, fill)
    observe = [_timed(streaming.observe, e) for e in sample]
    state = filled_detector(config, fill).to_state()
    applied: list[float] = []
    restore_and_snapshot: list[float] = []
    for event in sample:
        started = time.perf_counter()
        detector = StagnationDetector.from_state(config, state)
        restored = time.perf_counter()
        detector.observe_batch([event])
        observed = time.perf_counter()
        state = detector.to_state()
        ended = time.perf_counter()
        applied.append(ended - started)
        restore_and_snapshot.append((restored - started) + (ended - observed))
    hashed = [_timed(_blake2b, e.output) for e in sample]
    return DetectorCost(
        size,
        fill,
        _median_ms(observe),
        _median_ms(applied),
        _median_ms(restore_and_snapshot),
        _median_ms(hashed),
    )


def _timed(action: Callable[[Any], object], argument: object) -> float:
    started = time.perf_counter()
    action(argument)
    return time.perf_counter() - started


def _blake2b(text: str) -> bytes:
    return hashlib.blake2b(text.encode()).digest()


def _median_ms(seconds: Sequence[float]) -> float:
    return statistics.median(seconds) * 1000


# -- pre-hydration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PreHydrationCost:
    """Wall time of hydrating ``references`` concurrently and one after the other."""

    references: int
    resolved: int
    concurrent_s: float
    sequential_s: float


async def _slow_resolution(tool_name: str, arguments: dict[str, Any]) -> str:
    await asyncio.sleep(RESOLUTION_S)
    return f"{tool_name} resolved {arguments['input']}"


def reference_text(count: int) -> str:
    """A task goal naming ``count`` distinct URLs."""
    urls = " ".join(f"https://docs.example.test/page/{i}" for i in range(count))
    return f"Summarise these pages: {urls}"


async def hydrate_wall_time(count: int) -> tuple[float, int]:
    """Seconds to hydrate ``count`` references with the engine, and how many resolved."""
    config = PreHydrationConfig(resolution_tools={"url": "web_fetch"}, max_context_tokens=100_000)
    engine = PreHydrationEngine(config)
    references = engine.extract_references(reference_text(count))
    started = time.perf_counter()
    hydrated = await engine.hydrate(references, FunctionResolver(_slow_resolution))
    return time.perf_counter() - started, len(hydrated.resolved)


async def sequential_wall_time(count: int) -> float:
    """Seconds to resolve the same references one after the other (the comparison)."""
    started = time.perf_counter()
    for i in range(count):
        await _slow_resolution("web_fetch", {"input": str(i)})
    return time.perf_counter() - started


def prehydration_cost(count: int) -> PreHydrationCost:
    concurrent_s, resolved = asyncio.run(hydrate_wall_time(count))
    sequential_s = asyncio.run(sequential_wall_time(count))
    return PreHydrationCost(count, resolved, concurrent_s, sequential_s)


# -- report -----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def detector_table(costs: Sequence[DetectorCost]) -> str:
    lines = [
        "| output | outputs already seen | observe (ms) | restore + observe + snapshot, as in "
        "the coordinator (ms) | of which restore + snapshot (ms) | BLAKE2b of the output (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.size // KB} KB | {c.fill} | {c.observe_ms:.3f} | {c.apply_ms:.3f} "
            f"| {c.state_ms:.3f} | {c.hash_ms:.3f} |"
        )
    return "\n".join(lines)


def prehydration_table(cost: PreHydrationCost) -> str:
    ok = cost.concurrent_s < PREHYDRATION_TARGET_S and cost.resolved == cost.references
    return "\n".join(
        [
            "| pre-hydration | wall time | compared with |",
            "|---|---|---|",
            f"| {cost.references} references x {RESOLUTION_S * 1000:.0f} ms, "
            f"PreHydrationEngine.hydrate ({cost.resolved} resolved) "
            f"| {cost.concurrent_s * 1000:.0f} ms "
            f"| one after the other: {cost.sequential_s * 1000:.0f} ms |",
            f"\nPre-hydration wall time {cost.concurrent_s * 1000:.0f} ms "
            f"(target < {PREHYDRATION_TARGET_S * 1000:.0f} ms): {verdict(ok)}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer observations per cell")
    args = parser.parse_args(argv)
    counts = QUICK_OBSERVATIONS if args.quick else OBSERVATIONS
    costs = [detector_cost(size, fill, counts[size]) for size in SIZES for fill in FILLS]
    print(detector_table(costs))
    print()
    print(prehydration_table(prehydration_cost(REFERENCES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
