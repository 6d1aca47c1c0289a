"""Bounded memories of the detector: every operation is O(1) or O(max_period) per event.

- :class:`BoundedLru`: what was seen (digest -> compaction epoch of first sight) and the last known
  state of each path; the least recently seen entry is forgotten once ``capacity`` is reached.
- :class:`RecentCounts`: one key (or None) per event over the last ``n`` events, with counts.
- :class:`StaleWindow`: the (call, result) pairs and error fingerprints since the last new state
  change, at most ``history`` of them, with running counts; the run lengths that reveal a
  cycle of period ``p`` (how many events in a row equal the one ``p`` places earlier); and, over
  the last ``history`` events whatever came in between, the results (a failure, a refusal or an
  answer) and the errors the world gave.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Generic, TypeVar

__all__ = ["BoundedLru", "RecentCounts", "StaleWindow"]

V = TypeVar("V")


class BoundedLru(Generic[V]):
    """A mapping that keeps at most ``capacity`` keys, evicting the least recently used."""

    def __init__(self, capacity: int, items: list[tuple[str, V]] | None = None) -> None:
        self.capacity = capacity
        self._data: OrderedDict[str, V] = OrderedDict(items or [])
        self._trim()

    def _trim(self) -> None:
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def get(self, key: str) -> V | None:
        """The value (refreshing its recency), or None."""
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def set(self, key: str, value: V) -> None:
        """Store ``value`` as the most recent entry."""
        self._data[key] = value
        self._data.move_to_end(key)
        self._trim()

    def remember(self, key: str, value: V) -> V | None:
        """The value stored before (refreshed, kept), or None after storing ``value``."""
        previous = self.get(key)
        if previous is None:
            self.set(key, value)
        return previous

    def items(self) -> list[tuple[str, V]]:
        """Entries from least to most recently used (the order a restore needs)."""
        return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)


class RecentCounts:
    """One key (or None) per event over the last ``size`` events, with O(1) counts."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: deque[str | None] = deque(maxlen=size)
        self._counts: Counter[str] = Counter()

    def add(self, key: str | None) -> None:
        """Record the next event's key, forgetting the oldest beyond ``size``."""
        if len(self._keys) == self.size:
            oldest = self._keys[0]
            if oldest is not None:
                self._counts[oldest] -= 1
                if not self._counts[oldest]:
                    del self._counts[oldest]
        self._keys.append(key)
        if key is not None:
            self._counts[key] += 1

    def count(self, key: str | None) -> int:
        """How often ``key`` occurs in the last ``size`` events (0 for None)."""
        return self._counts[key] if key is not None else 0

    def clear(self) -> None:
        """Forget every event."""
        self._keys.clear()
        self._counts.clear()

    def dump(self) -> list[str | None]:
        """The keys, oldest first."""
        return list(self._keys)

    def load(self, keys: list[str | None]) -> None:
        """Restore what :meth:`dump` returned (trimmed to ``size``)."""
        self.clear()
        for key in keys[-self.size :]:
            self.add(key)


class StaleWindow:
    """The pairs and errors since the last new state change, with O(1) counts.

    Repeat and error counts cover the current episode only: a new state change restarts them
    from that event. Cycle runs look at the continuous sequence of pairs instead, so the first
    round of a cycle (whose events were new) counts as its first repetition; a new state change
    breaks every run by itself, since its pair was never seen before.
    """

    def __init__(self, history: int, max_period: int) -> None:
        self.history = history
        self.max_period = max_period
        self._entries: deque[tuple[str, str | None]] = deque(maxlen=history)
        self._pairs: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._recent: deque[str] = deque(maxlen=max_period)
        # _runs[p - 1]: events in a row equal to the event p places earlier (p = 1..max_period)
        self._runs: list[int] = [0] * max_period
        # per event of the last ``history``, new ones too: its recurrence key (a failure's pair,
        # a refusal, an answer's pair; None for a successful write) and the world's error
        self._results = RecentCounts(history)
        self._world_errors = RecentCounts(history)

    def clear(self) -> None:
        """Forget everything (after a milestone or a reviewer's reset)."""
        self._clear_episode()
        self._recent.clear()
        self._runs = [0] * self.max_period
        self._results.clear()
        self._world_errors.clear()

    def _clear_episode(self) -> None:
        self._entries.clear()
        self._pairs.clear()
        self._errors.clear()

    def restart(self, pair: str, error: str | None) -> None:
        """A new state change: the episode's counts start again from this event."""
        self._clear_episode()
        self.push(pair, error)

    def push(self, pair: str, error: str | None) -> None:
        """Add an event of the episode, updating counts and cycle runs."""
        self._update_runs(pair)
        if len(self._entries) == self.history:
            self._forget(*self._entries[0])
        self._entries.append((pair, error))
        self._pairs[pair] += 1
        if error is not None:
            self._errors[error] += 1

    def forget_recurrences(self) -> None:
        """Forget what came back in the last ``history`` events (the retries and the world's
        errors counted across episodes): a comparison answered what they asked."""
        self._results.clear()
        self._world_errors.clear()

    def note(self, result: str | None, world_error: str | None = None) -> None:
        """Record every observed event (kept across episodes): its recurrence key and the error
        the world gave (None: none, or a harness's refusal of the model's reply)."""
        self._results.add(result)
        self._world_errors.add(world_error)

    def retries(self, result: str) -> int:
        """How often ``result`` came back in the last ``history`` events, whatever came between."""
        return self._results.count(result)

    def recent_errors(self, error: str | None) -> int:
        """How often the world gave ``error`` in the last ``history`` events, across episodes."""
        return self._world_errors.count(error)

    def _update_runs(self, pair: str) -> None:
        recent, size = self._recent, len(self._recent)
        for period in range(1, self.max_period + 1):
            same = size >= period and recent[size - period] == pair
            self._runs[period - 1] = self._runs[period - 1] + 1 if same else 0
        recent.append(pair)

    def _forget(self, pair: str, error: str | None) -> None:
        self._pairs[pair] -= 1
        if not self._pairs[pair]:
            del self._pairs[pair]
        if error is not None:
            self._errors[error] -= 1
            if not self._errors[error]:
                del self._errors[error]

    def count(self, pair: str) -> int:
        """How many times ``pair`` occurs in the episode (at most ``history`` back)."""
        return self._pairs[pair]

    def error_count(self, error: str | None) -> int:
        """How many times the error fingerprint occurs in the episode (0 for None)."""
        return self._errors[error] if error is not None else 0

    def cycle(self) -> tuple[int, int] | None:
        """``(period, repetitions)`` of the most repeated cycle of 2+ distinct pairs, if any.

        A cycle of period ``p`` repeated ``k`` times ends the sequence when the last
        ``(k-1)*p`` events each equal the one ``p`` places earlier; a unit made of one pair
        repeated is a repeat, not a cycle.
        """
        best: tuple[int, int] | None = None
        for period in range(2, self.max_period + 1):
            run = self._runs[period - 1]
            unit_is_one_pair = self._runs[0] >= period - 1
            repetitions = 1 + run // period
            if run >= period and not unit_is_one_pair and (best is None or repetitions > best[1]):
                best = (period, repetitions)
        return best

    def dump(self) -> tuple[list[tuple[str, str | None]], list[str], list[int]]:
        """Episode entries (oldest first), recent pairs and cycle runs, for the saved state."""
        return list(self._entries), list(self._recent), list(self._runs)

    def dump_failures(self) -> list[str | None]:
        """The recurrence keys of the last events (None for successful writes), oldest first."""
        return self._results.dump()

    def dump_errors(self) -> list[str | None]:
        """The world's errors of the last events (None for the others), oldest first."""
        return self._world_errors.dump()

    def load(
        self,
        entries: list[tuple[str, str | None]],
        recent: list[str],
        runs: list[int],
        failures: list[str | None] | None = None,
        errors: list[str | None] | None = None,
    ) -> None:
        """Restore what :meth:`dump`, :meth:`dump_failures` and :meth:`dump_errors` returned
        (trimmed to bounds)."""
        self.clear()
        self._results.load(failures or [])
        self._world_errors.load(errors or [])
        for pair, error in entries[-self.history :]:
            self._entries.append((pair, error))
            self._pairs[pair] += 1
            if error is not None:
                self._errors[error] += 1
        self._recent.extend(recent[-self.max_period :])
        self._runs = (list(runs) + [0] * self.max_period)[: self.max_period]
