"""Paraphrase similarity: the same request in other words.

A Who&When orchestrator that is stuck re-issues its instruction reworded ("look up the USPS
rates for a DVD from Hartford to Colombia", then "please continue to look up the shipping rates
... using USPS"), and a character-level similarity of 0.9 sees two plans. :func:`content_words`
reduces a text to the set of its content words (lower-case words of three letters or more, a
short list of function and instruction words dropped, a plural ``-ies`` read as ``-y``, else a
plural ``-s`` or an ``-ing``/``-ed`` ending cut),
and :func:`paraphrase_similarity` is the Jaccard index of two such sets: the share of content
words the two texts have in common. Pure Python, no model, nothing downloaded: about 10 µs for a
600-character plan on one core.

Scope: a batch that asks the same question about another entity ("check the availability of
'Munich' on Netflix", then "... of 'Casino Royale' ...") shares its instruction words but not
the entity's, and reads about 0.5 alike; the detector only counts a paraphrase when nothing new
has come back since the earlier plan (:class:`~shared.stagnation.plans.PlanMemory`).
"""

from __future__ import annotations

import re

__all__ = ["STOP_WORDS", "content_words", "paraphrase_similarity"]

_STOP_TEXT = (
    "the a an and or of to in on for with from by at as is are was were be been this that "
    "these those it its into any all each your you please then also if not no can could "
    "would should will we our i me my their there here which what when where how find "
    "search visit look use using try page website site information specific specifically "
    "provide list gather identify check continue more other another"
)

STOP_WORDS = frozenset(re.findall(r"\S+", _STOP_TEXT))
"""Function words and the verbs every instruction uses ("please find", "search", "visit",
"identify"): they say how to ask, not what is asked."""

_WORD = re.compile(r"[a-z][a-z0-9']+")
_SUFFIXES = ("ing", "ed", "s")


def content_words(text: str) -> frozenset[str]:
    """The content words of ``text``: lower-cased, three letters or more, not in
    :data:`STOP_WORDS`, with a plural ``-ies`` read as ``-y`` ("families" is "family"), else one
    ``-ing``, ``-ed`` or plural ``-s`` (not ``-ss``) cut, when a stem of three letters or more is
    left."""
    words = set()
    for found in set(_WORD.findall(text.lower())):  # a long page repeats its words
        if len(found) < 3 or found in STOP_WORDS:
            continue
        stem = found
        if found.endswith("ies") and len(found) > 4:
            stem = found[:-3] + "y"
        else:
            for suffix in _SUFFIXES:
                if (
                    found.endswith(suffix)
                    and not found.endswith("ss")
                    and len(found) > len(suffix) + 2
                ):
                    stem = found[: -len(suffix)]
                    break
        words.add(stem)
    return frozenset(words)


def paraphrase_similarity(first: frozenset[str], second: frozenset[str]) -> float:
    """The Jaccard index of two sets of content words (0.0 when either is empty)."""
    if not first or not second:
        return 0.0
    return len(first & second) / len(first | second)
