"""Baseline loop detectors of shipped agents, re-stated for the replay in ``stagnation_eval.py``.

Each baseline sees the raw (action, observation) text of every step, exactly as the shipped
detector would (no masking), and answers a :class:`StagnationLevel`:

- :class:`OpenHandsBaseline`: OpenHands' stuck detector, scenarios 1 and 2: the last 4
  (action, observation) pairs identical, or the last 3 identical actions meeting the same error.
  It marks the run STUCK and stops, so its single trigger maps to ASK_HUMAN (and so REPLAN).
- :class:`GeminiCycleBaseline`: Gemini CLI's tool-call loop check: a cycle of period 1..5
  repeated 5 times in the last 25 call keys (the key is the action text, the observation is
  ignored). Gemini injects a "take a step back" turn on the first detection (REPLAN) and halts
  on the second (ASK_HUMAN); after the first detection the key history starts again, so the
  second needs the pattern to be re-established.
- :class:`StepBudgetBaseline`: a bare step counter that fires at 75% of a 50-step budget (the
  38th step). It has one trigger and no notion of escalation, so it maps to both levels.
- :class:`NaiveOutputHashBaseline`: the same digit-masked observation 3 times in a row, empty
  acknowledgements included (the labelled set's scorer states it the same way). One trigger,
  both levels.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import deque
from dataclasses import dataclass, field

from shared.stagnation import StagnationLevel

__all__ = [
    "GeminiCycleBaseline",
    "NaiveOutputHashBaseline",
    "OpenHandsBaseline",
    "StepBudgetBaseline",
]

_DIGITS = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass(slots=True)
class OpenHandsBaseline:
    """4 identical (action, observation) pairs, or 3 identical actions with identical errors."""

    name: str = "openhands"
    pair_threshold: int = 4
    error_threshold: int = 3
    _recent: deque[tuple[str, str, bool]] = field(default_factory=lambda: deque(maxlen=4))
    _stuck: bool = False

    def observe(self, action: str, observation: str, is_error: bool) -> StagnationLevel:
        """The level after this step (ASK_HUMAN once stuck: the run would have stopped)."""
        self._recent.append((action, observation, is_error))
        if not self._stuck:
            self._stuck = self._same_pairs() or self._same_errors()
        return StagnationLevel.ASK_HUMAN if self._stuck else StagnationLevel.NONE

    def _same_pairs(self) -> bool:
        recent = list(self._recent)[-self.pair_threshold :]
        return len(recent) == self.pair_threshold and len({(a, o) for a, o, _ in recent}) == 1

    def _same_errors(self) -> bool:
        recent = list(self._recent)[-self.error_threshold :]
        if len(recent) < self.error_threshold or not all(e for _, _, e in recent):
            return False
        return len({(a, o) for a, o, _ in recent}) == 1


@dataclass(slots=True)
class GeminiCycleBaseline:
    """A k-cycle (k = 1..5) of call keys repeated 5 times; nudge first, halt on the second."""

    name: str = "gemini-cli"
    repeats: int = 5
    max_period: int = 5
    _keys: deque[str] = field(default_factory=lambda: deque(maxlen=25))
    _detections: int = 0

    def observe(self, action: str, observation: str, is_error: bool) -> StagnationLevel:
        """REPLAN after the first detection, ASK_HUMAN after the second."""
        del observation, is_error  # Gemini CLI's tool-call check looks at the call only
        self._keys.append(hashlib.sha256(action.encode("utf-8", "surrogatepass")).hexdigest())
        if self._detections < 2 and self._looping():
            self._detections += 1
            self._keys.clear()
        if self._detections >= 2:
            return StagnationLevel.ASK_HUMAN
        return StagnationLevel.REPLAN if self._detections else StagnationLevel.NONE

    def _looping(self) -> bool:
        keys = list(self._keys)
        for period in range(1, self.max_period + 1):
            span = period * self.repeats
            if len(keys) < span:
                continue
            tail = keys[-span:]
            if all(tail[i] == tail[i % period] for i in range(span)):
                return True
        return False


@dataclass(slots=True)
class StepBudgetBaseline:
    """Fires once the step count reaches 75% of the budget; one trigger for both levels."""

    name: str = "step-75%"
    budget: int = 50
    share: float = 0.75
    _steps: int = 0

    def observe(self, action: str, observation: str, is_error: bool) -> StagnationLevel:
        """ASK_HUMAN (and so REPLAN) from the ``ceil(share * budget)``-th step on."""
        del action, observation, is_error
        self._steps += 1
        fired = self._steps >= math.ceil(self.share * self.budget)
        return StagnationLevel.ASK_HUMAN if fired else StagnationLevel.NONE


@dataclass(slots=True)
class NaiveOutputHashBaseline:
    """The same digit-masked observation ``run`` times in a row; ASK_HUMAN (and REPLAN) after."""

    name: str = "naive-hash"
    run: int = 3
    _last: deque[str] = field(default_factory=lambda: deque(maxlen=3))
    _fired: bool = False

    def observe(self, action: str, observation: str, is_error: bool) -> StagnationLevel:
        """ASK_HUMAN from the first run of ``run`` identical masked observations on."""
        del action, is_error
        masked = _DIGITS.sub("#", observation).strip()
        self._last.append(hashlib.sha256(masked.encode("utf-8", "surrogatepass")).hexdigest())
        full = len(self._last) == self.run and len(set(self._last)) == 1
        self._fired = self._fired or full
        return StagnationLevel.ASK_HUMAN if self._fired else StagnationLevel.NONE
