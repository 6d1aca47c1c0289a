"""New content words: whether a result told the model something, whatever its page identity.

The model's side counts a plan as re-issued only when nothing new has come back since it was
made (:class:`~shared.stagnation.plans.PlanMemory`'s mark). The first rule moved the mark on a
new result that was not a near-duplicate of a recent one: its first 600 masked characters at
least 0.9 alike. On Who&When's web pages that rule errs both ways:

- a stuck WebSurfer that types into the same FedEx form, re-clicks a result that does not
  open, or lands on another block page returns a page whose beginning differs (another field
  filled in, the action line, a search box echo): the mark moves, and the orchestrator's
  reworded instruction is never a re-issue "with nothing new since" (hard ``23``, ``38``,
  ``13``; the ledger's own "in a loop" then drives the ladder rounds later);
- a batch of lookups returns pages whose first 600 characters are the same search template
  and whose news (the film, whether it streams) is further down: the mark stands still, and
  the batch's same-words instructions read as re-issues (hard ``36``, a false alarm).

:class:`WordNovelty` judges a result by its **new content words** instead: the content words
(:func:`~shared.stagnation.paraphrase.content_words`) of its first :data:`NOVELTY_CHARS`
masked characters that no earlier result showed. A result is news when it shows at least
``threshold`` (``plan_novelty``, 20) of them, or when at least :data:`NEW_SHARE` (a quarter)
of its own content words are new: a new window of code shows new lines mostly in identifiers
already seen (8 to 16 new words of 33 to 41 in a resolved Gemini run paging through a file),
while a re-rendered page shows a few new words among a hundred. A result no longer than the
compared beginning (600 characters: a record, a verdict, an error) is also news when it is not
a near-duplicate, as before. Pure Python, nothing downloaded; only results the output side
already counts as new are read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from shared.stagnation.paraphrase import content_words

__all__ = ["MAX_SEEN_WORDS", "NEW_SHARE", "NOVELTY_CHARS", "WordNovelty"]

NOVELTY_CHARS = 4_000
"""A result is read for new words on its first 4,000 masked characters (a page's title, its
metadata and the first screens of its OCR text; what a longer page adds past that is not
read, which bounds the cost: about 150 µs for 4,000 characters on one core)."""

NEW_SHARE = 0.25
"""A result whose content words are at least this share new is news, however few they are."""

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
        earlier result showed, or when at least :data:`NEW_SHARE` of its content words are
        new; its words are remembered either way."""
        words = content_words(text[:NOVELTY_CHARS])
        seen = self._seen
        new = 0
        for word in sorted(words):  # a set's order follows the hash seed: replays must agree
            if word in seen:
                seen.move_to_end(word)
            else:
                seen[word] = None
                new += 1
        self._trim()
        return new >= threshold or (new > 0 and new >= NEW_SHARE * len(words))

    def clear(self) -> None:
        """Forget every word (a milestone, a genuine user message)."""
        self._seen.clear()

    def dump(self) -> list[str]:
        """The words, least recently shown first (the order a restore needs)."""
        return list(self._seen)
