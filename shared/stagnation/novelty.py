"""New content words: whether a result told the model something, wherever on the page.

The model's side counts a plan as re-issued only when nothing new has come back since it was
made (:class:`~shared.stagnation.plans.PlanMemory`'s mark). The first rule moved the mark on a
new result that was not a near-duplicate of a recent one: its first 600 masked characters at
least 0.9 alike. A batch of web lookups defeats it: every page is the same search template for
its first 600 characters, and its news (the film looked up, whether it streams) comes further
down. The mark stood still, and the orchestrator's same-words requests about one film after
another read as re-issues with nothing new since (Who&When ``36``, a false alarm).

:class:`WordNovelty` reads a result for its **new content words**: the content words
(:func:`~shared.stagnation.paraphrase.content_words`) of its first :data:`NOVELTY_CHARS`
masked characters that no earlier result showed. A result that shows at least
``plan_novelty`` (20) of them moves the mark too, whatever its beginning looks like. It only
adds news: a result that is not a near-duplicate still moves the mark however few new words
it shows (a new window of code shows new lines in words already seen; judging it by its words
alone made a resolved Gemini run's paging through a file read as re-issued plans). Pure
Python, nothing downloaded; only results the output side already counts as new are read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from shared.stagnation.paraphrase import content_words

__all__ = ["MAX_SEEN_WORDS", "NOVELTY_CHARS", "WordNovelty"]

NOVELTY_CHARS = 4_000
"""A result is read for new words on its first 4,000 masked characters (a page's title, its
metadata and the first screens of its OCR text; what a longer page adds past that is not
read, which bounds the cost: about 150 µs for 4,000 characters on one core)."""

MAX_SEEN_WORDS = 4_096
"""Content words remembered (the least recently shown is forgotten first)."""


class WordNovelty:
    """The content words the results showed, least recently shown first, bounded."""

    def __init__(self, words: Iterable[str] = ()) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict.fromkeys(words)
        self._trim()

    def _trim(self) -> None:
        while len(self._seen) > MAX_SEEN_WORDS:
            self._seen.popitem(last=False)

    def is_news(self, text: str, threshold: int) -> bool:
        """True when ``text`` (a result, masked) shows at least ``threshold`` content words no
        earlier result showed, or, when it has fewer than ``2 * threshold`` content words, at
        least half of them; its words are remembered either way."""
        words = content_words(text[:NOVELTY_CHARS])
        seen = self._seen
        new = 0
        for word in words:
            if word in seen:
                seen.move_to_end(word)
            else:
                seen[word] = None
                new += 1
        self._trim()
        return new >= threshold

    def clear(self) -> None:
        """Forget every word (a milestone, a genuine user message)."""
        self._seen.clear()

    def dump(self) -> list[str]:
        """The words, least recently shown first (the order a restore needs)."""
        return list(self._seen)
