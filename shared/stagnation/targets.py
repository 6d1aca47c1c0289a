"""Quoted targets: what a request names, in quotes, as the thing to act on.

A Who&When orchestrator that is stuck on one page asks for it again and again, each time in
other words: "Please visit the '10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain
Mama' page and gather the list ...", then "Please click on and explore the '10 Best ... Tales
of a Mountain Mama' link to gather the names ..." (hard ``38``: content words 0.56 alike, under
the paraphrase bar of 0.6), while WebSurfer clicks the same search result and stays on the
same results page. What the two requests share is their object, quoted word for word. A batch
names another object each time ("the availability of 'Munich'", then "of 'Casino Royale'"),
so a shared quoted object is what tells a request asked again from the next of a batch.

:func:`quoted_targets` reads them: a span of two words or more, 8 to 200 characters, in
straight or curly quotes that open after a non-word character and close before one (so the
apostrophe of "Fidelity's" opens nothing and "dragon's diet?" stays inside its title), in a
message addressed to its reader (*you*, *your*, *please* outside the quotes, as the re-asked
slot requires: a coding agent's own notes address nobody). Regular expressions only: a few
microseconds for a 600-character plan, nothing downloaded.
"""

from __future__ import annotations

import re

__all__ = ["quoted_targets"]

_QUOTED = re.compile(
    r"(?<!\w)(?:'(.{8,200}?)'|\"(.{8,200}?)\"|\u2018(.{8,200}?)\u2019|\u201c(.{8,200}?)\u201d)(?!\w)"
)
_ADDRESSED = re.compile(r"\b(?:you|your|yours|please)\b", re.IGNORECASE)


def quoted_targets(text: str) -> frozenset[str]:
    """The quoted spans of two words or more in ``text`` (stripped, as written), when the text
    outside the quotes addresses its reader; empty otherwise."""
    found = set()
    for match in _QUOTED.finditer(text):
        span = next(group for group in match.groups() if group is not None).strip()
        if " " in span:
            found.add(span)
    if not found or not _ADDRESSED.search(_QUOTED.sub(" ", text)):
        return frozenset()
    return frozenset(found)
