"""Fingerprints of a tool event: what was called, what was observed, which error came back.

Every fingerprint is a 64-bit BLAKE2b digest in hex (16 characters): short enough to keep a few
thousand in the persisted detector state, long enough that collisions never matter there.

Outputs are compared after :func:`mask`, which applies
:func:`shared.volatile.normalize_volatile` (numbers, hex ids, timestamps, temp paths, UUIDs) and
then normalises whitespace (CRLF, trailing blanks on a line, blank edges), so that
``/bin/bash: line 334`` and ``line 352`` are the same observation; an output made of volatile
tokens only (``331.0``, ``57%``) is compared unmasked (:func:`comparable`).

Call signatures are canonical JSON (keys sorted recursively) of the arguments, masked the same
way, so that a display counter or ``max_depth+1`` in the arguments does not make a repeated call
look new.

What is compared is what the model was shown, masked: a host's ``output_hash`` (a digest of the
raw output, volatile tokens included) is never used, or a retried command whose traceback line
numbers change would look new every time. Two more reductions make information-free outputs
equal: a short output that only echoes the call's own arguments (``No matches found for "X"``,
``X: command not found``) has them masked (:func:`without_echo`), and ``run_command``'s
``exit code: N`` header is not content (the exit code is compared on its own).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.novelty import NOVELTY_CHARS
from shared.volatile import normalize_volatile

__all__ = [
    "GIST_CHARS",
    "EventFingerprint",
    "canonical_json",
    "comparable",
    "digest",
    "fingerprint",
    "mask",
    "without_echo",
]

GIST_CHARS = 600
"""How much of a masked output tells a near-duplicate result from new information."""

_TRAILING_BLANKS = re.compile(r"[ \t]+$", re.MULTILINE)
_ERROR_LINE_CHARS = 200
# run_command's first line; the exit code is compared on its own.
_EXIT_HEADER = re.compile(r"\Aexit code: -?\d+[ \t]*(?:\n|\Z)")
# An echo is looked for in short outputs only: one- to three-line messages such as "no match for
# 'x'" or "x: command not found". In a longer output an argument is part of the content.
_ECHO_MAX_LINES = 3
_ECHO_MAX_CHARS = 600
_ECHO_MIN_WORD = 3
_WORD_SEPARATORS = re.compile(r"[\s'\"`,;|&<>()\[\]{}]+")
_ECHO = "<arg>"
_QUOTED = re.compile(r"(['\"])(.+?)\1")
# normalize_volatile's placeholders, or (group 1) a letter that is not part of one
# A line range in an edit's call: ``edit 72:83``, ``sed -i '72,83d'``.
_LINE_RANGE = re.compile(r"(?<![\w.\[,])\d+[:,]\d+(?![.\],])")
_LETTER_OR_PLACEHOLDER = re.compile(r"<(?:ts|uuid|tmp|hex|n)>|([^\W\d_])")


def digest(*parts: str) -> str:
    """A 16-hex BLAKE2b digest of ``parts``; ``("ab", "c")`` differs from ``("a", "bc")``."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with keys sorted at every depth and no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def mask(text: str, *, numbers: bool = True) -> str:
    """Volatile tokens masked, line endings unified, trailing blanks and blank edges removed.

    ``numbers=False`` keeps bare numbers (see :func:`shared.volatile.normalize_volatile`).
    """
    return _whitespace(normalize_volatile(text, numbers=numbers))


def comparable(text: str, *, keep_numbers: bool = False) -> str:
    """The form of an output that is compared: masked, unless its numbers are its content.

    With ``keep_numbers`` (a short successful answer of a command or another tool: a
    calculator's ``331.0``, ``Content-Length: 5``, ``count: 2``) bare numbers are kept. Any
    other output is masked entirely: ``/bin/bash: line 334`` and ``line 352`` are the same
    error, and in a file, a listing or a test report the numbers are mostly line numbers,
    counters and timings. An output made of volatile tokens only is compared unmasked.
    """
    if keep_numbers and _is_short(text):
        return mask(text, numbers=False)
    masked = mask(text)
    # Stop at the first letter outside a placeholder: one short scan for ordinary outputs.
    if any(match.group(1) for match in _LETTER_OR_PLACEHOLDER.finditer(masked)):
        return masked
    return _whitespace(text)


def _is_short(text: str) -> bool:
    return len(text) <= _ECHO_MAX_CHARS and text.strip().count("\n") < _ECHO_MAX_LINES


def _argument_words(value: Any, words: set[str]) -> None:
    """The strings of ``value`` (at any depth) that an output may echo.

    Each whole string, the quoted parts of it, its first word (the program a shell line runs)
    and its words that are not plain lower-case English (``fastjson/``, ``find.``, ``JDK``,
    ``*.gradle``): those name things; ``for`` or ``this`` do not.
    """
    if isinstance(value, str):
        words.add(value.strip())
        words.update(match.group(2) for match in _QUOTED.finditer(value))
        split = [word for word in _WORD_SEPARATORS.split(value) if word]
        words.update(split[:1])
        words.update(word for word in split if not word.isalpha() or not word.islower())
    elif isinstance(value, dict):
        for item in value.values():
            _argument_words(item, words)
    elif isinstance(value, list | tuple):
        for item in value:
            _argument_words(item, words)


def without_echo(text: str, arguments: dict[str, Any], *, failed: bool = True) -> str:
    """``text`` with the call's argument words masked, when it is a short message.

    ``No matches found for "install JDK"`` and ``No matches found for "build script"`` tell the
    same thing: nothing; so do ``cd..: command not found`` and ``find.: command not found``.
    Only outputs of at most three lines and 600 characters are touched, and only words of at
    least three characters, longest first. In a successful output only a quoted echo is masked:
    a search hit that contains its own pattern (``a.py:3: foo()`` for ``foo``) is content.
    """
    if not _is_short(text):
        return text
    if not failed and '"' not in text and "'" not in text:  # no quote: no quoted echo to mask
        return text
    words: set[str] = set()
    _argument_words(arguments, words)
    for word in sorted(words, key=len, reverse=True):
        if len(word) < _ECHO_MIN_WORD or word not in text:
            continue
        if failed:
            text = text.replace(word, _ECHO)
        else:
            for quote in ('"', "'"):
                text = text.replace(f"{quote}{word}{quote}", f"{quote}{_ECHO}{quote}")
    return text


def _is_empty(masked: str) -> bool:
    """Nothing but punctuation and blanks: ``""``, ``[]``, ``{}``."""
    return not any(char.isalnum() for char in masked)


def _body(event: ToolEvent) -> str:
    """The output without ``run_command``'s ``exit code: N`` header line."""
    if event.exit_code is None:
        return event.output
    return _EXIT_HEADER.sub("", event.output, count=1)


def _whitespace(text: str) -> str:
    """Line endings unified, trailing blanks and blank edges removed; nothing masked."""
    return _TRAILING_BLANKS.sub("", text.replace("\r\n", "\n")).strip()


@dataclass(frozen=True, slots=True)
class EventFingerprint:
    """The digests of one event, computed once when it is observed.

    - ``call``: tool name plus masked canonical arguments;
    - ``outcome``: what the world showed, keyed per kind: for a read, the content shown; for a
      command, tool, exit code and output (a silent success: the call itself, since silence
      says something only the first time a call is made); for a write, path and after-state;
      for a failure, tool, exit code and error text;
    - ``pair``: call and outcome together, the unit of exact repetition;
    - ``error``: tool plus the first and last lines of the masked error text, whatever the
      arguments (None when the call succeeded or the error text is empty);
    - ``path``: digest of the path, if any;
    - ``state``: the whole-content state a read saw (from ``content_hash``), if given;
    - ``after`` / ``before``: a successful write's after-state and, if known, before-state.
      ``state``, ``after`` and ``before`` share one space, so a write that puts back what a read
      saw is recognised;
    - ``write_call``: a successful write's path and call (line ranges masked), so that
      re-applying the same edit is recognised even when each application changes the file (an
      insertion duplicated) or shifts its lines;
    - ``is_ack``: an empty acknowledgement of a tool that is neither a read nor a command;
    - ``info_free``: a successful read or search that showed nothing;
    - ``gist``: the first :data:`GIST_CHARS` characters of the masked output, lower-cased, to
      tell a near-duplicate result (the same page with OCR noise) from new information;
    - ``head``: the first :data:`~shared.stagnation.novelty.NOVELTY_CHARS` characters of the
      masked output, read for the content words it shows that no earlier result showed.
    """

    call: str
    outcome: str
    pair: str
    error: str | None
    path: str | None
    state: str | None
    after: str | None
    before: str | None
    write_call: str | None
    is_ack: bool
    info_free: bool
    gist: str = ""
    head: str = ""


def _write_after(event: ToolEvent, masked_output: str) -> str:
    """The after-state of a write: the host's hash, else what was written and what came back."""
    if event.after_hash is not None:
        return digest("state", event.after_hash)
    return digest("written", canonical_json(event.arguments), masked_output)


def _write_call(event: ToolEvent) -> str | None:
    """Path and call of a write whose after-state the host reported, else None.

    Only a host's after-hash can change while the same edit is re-applied (an insertion
    duplicated each time); an after-state derived from the call and its output changes with
    them. The call is compared exactly but for its line ranges (``edit 72:83``, ``sed
    '72,83d'``): deleting line 72 and writing the block back, then 71, then 70 (deepseek-coder
    ``databind-4013``), is one edit re-applied as the lines shift. The same text put at
    another single line (``insert_at``), or with other numbers in it, is another edit.
    """
    if event.after_hash is None:
        return None
    call = _LINE_RANGE.sub("<n>:<n>", canonical_json(event.arguments))
    return digest("wcall", event.path or "", event.tool_name, call)


def _read_state(event: ToolEvent) -> str | None:
    if event.kind is ToolKind.READ and not event.failed and event.content_hash is not None:
        return digest("state", event.content_hash)
    return None


def _outcome(event: ToolEvent, masked: str, call: str, after: str | None) -> str:
    shown = digest("text", masked)
    if event.failed:
        return digest("error", event.tool_name, str(event.exit_code), shown)
    if event.kind is ToolKind.READ:
        # What was shown: the same lines again (other line numbers, after masking) are not new,
        # whatever else changed in the file; a page not yet shown is.
        return digest("read", shown)
    if event.kind is ToolKind.WRITE and after is not None:
        return digest("write", event.path or "", after)
    if event.kind is ToolKind.COMMAND:
        if not masked:
            return digest("silent", call)
        return digest("command", event.tool_name, str(event.exit_code), shown)
    return digest("other", event.tool_name, shown)


def _error_fingerprint(event: ToolEvent, masked: str) -> str | None:
    """Tool plus the first and last non-empty lines of the masked error text, or None.

    The first line names the failure, the last line usually its cause (a traceback's exception,
    a linter's verdict); what lies between echoes the arguments and is left out, so that the
    same error met with other arguments keeps its fingerprint.
    """
    if not event.failed or not masked:
        return None
    lines = [line for line in masked.splitlines() if line.strip()]
    first, last = lines[0][:_ERROR_LINE_CHARS], lines[-1][:_ERROR_LINE_CHARS]
    return digest("fault", event.tool_name, first, last)


def _is_ack(event: ToolEvent, body: str, acknowledgements: Collection[str]) -> bool:
    """An empty acknowledgement of an *other* tool: neither progress nor evidence of a loop.

    A read or a search that shows nothing is information-free (stale), and a command's silent
    success is judged as a result; a write is judged by its after-state.
    """
    if event.failed or event.kind is not ToolKind.OTHER:
        return False
    return body.strip().lower() in acknowledgements


def fingerprint(event: ToolEvent, acknowledgements: Collection[str]) -> EventFingerprint:
    """Compute every digest of ``event``: the output is masked and hashed exactly once."""
    body = _body(event)
    answer = not event.failed and event.kind in (ToolKind.COMMAND, ToolKind.OTHER)
    shown = without_echo(body, event.arguments, failed=event.failed)
    masked = comparable(shown, keep_numbers=answer)
    is_write = event.kind is ToolKind.WRITE and not event.failed
    after = _write_after(event, masked) if is_write else None
    known_before = is_write and event.before_hash is not None  # "" is "did not exist"
    before = digest("state", event.before_hash or "") if known_before else None
    call = digest("call", event.tool_name, mask(canonical_json(event.arguments)))
    outcome = _outcome(event, masked, call, after)
    error = _error_fingerprint(event, masked)
    return EventFingerprint(
        call=call,
        outcome=outcome,
        pair=digest(call, outcome),
        error=error,
        path=digest("path", event.path) if event.path else None,
        state=_read_state(event),
        after=after,
        before=before,
        write_call=_write_call(event) if is_write else None,
        is_ack=_is_ack(event, body, acknowledgements),
        info_free=event.kind is ToolKind.READ and not event.failed and _is_empty(masked),
        gist=" ".join(masked[: GIST_CHARS * 2].lower().split())[:GIST_CHARS],
        head=masked[:NOVELTY_CHARS],
    )
