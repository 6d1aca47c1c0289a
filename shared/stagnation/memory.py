"""Bounded memories of the detector: every operation is O(1) or O(max_period) per event.

- :class:`BoundedLru`: what was seen (digest -> compaction epoch of first sight) and the last known
  state of each path; the least recently seen entry is forgotten once ``capacity`` is reached.
- :class:`StaleWindow`: the (call, result) pairs and error fingerprints since the last new state
  change, at most ``history`` of them, with running counts; the run lengths that reveal a
  cycle of period ``p`` (how many events in a row equal the one ``p`` places earlier); and the
  failed (call, result) pairs of the last ``history`` events, whatever came in between.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Generic, TypeVar

__all__ = ["BoundedLru", "StaleWindow"]

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
        # failed pairs (None for any other event) of the last ``history`` events, new ones too
        self._failures: deque[str | None] = deque(maxlen=history)
        self._failure_counts: Counter[str] = Counter()

    def clear(self) -> None:
        """Forget everything (after a milestone or a reviewer's reset)."""
        self._clear_episode()
        self._recent.clear()
        self._runs = [0] * self.max_period
        self._failures.clear()
        self._failure_counts.clear()

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

    def note(self, failed_pair: str | None) -> None:
        """Record every observed event: its pair if it failed, else None (kept across episodes)."""
        if len(self._failures) == self.history:
            oldest = self._failures[0]
            if oldest is not None:
                self._failure_counts[oldest] -= 1
                if not self._failure_counts[oldest]:
                    del self._failure_counts[oldest]
        self._failures.append(failed_pair)
        if failed_pair is not None:
            self._failure_counts[failed_pair] += 1

    def retries(self, pair: str) -> int:
        """How often ``pair`` failed in the last ``history`` events, whatever came between."""
        return self._failure_counts[pair]

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
        """The failed pairs of the last events (None for the others), oldest first."""
        return list(self._failures)

    def load(
        self,
        entries: list[tuple[str, str | None]],
        recent: list[str],
        runs: list[int],
        failures: list[str | None] | None = None,
    ) -> None:
        """Restore what :meth:`dump` and :meth:`dump_failures` returned (trimmed to bounds)."""
        self.clear()
        for failed_pair in (failures or [])[-self.history :]:
            self.note(failed_pair)
        for pair, error in entries[-self.history :]:
            self._entries.append((pair, error))
            self._pairs[pair] += 1
            if error is not None:
                self._errors[error] += 1
        self._recent.extend(recent[-self.max_period :])
        self._runs = (list(runs) + [0] * self.max_period)[: self.max_period]
