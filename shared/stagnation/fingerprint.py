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
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from shared.stagnation.events import ToolEvent, ToolKind
from shared.volatile import normalize_volatile

__all__ = ["EventFingerprint", "canonical_json", "comparable", "digest", "fingerprint", "mask"]

_TRAILING_BLANKS = re.compile(r"[ \t]+$", re.MULTILINE)
_ERROR_LINE_CHARS = 200
# normalize_volatile's placeholders, or (group 1) a letter that is not part of one
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


def mask(text: str) -> str:
    """Volatile tokens masked, line endings unified, trailing blanks and blank edges removed."""
    return _whitespace(normalize_volatile(text))


def comparable(text: str) -> str:
    """The form of an output that is compared: masked, unless masking would erase all of it.

    A calculator's ``331.0``, a counter's ``42`` or a poll's ``57%`` is nothing but volatile
    tokens; masked, every such result would look the same. Those are compared as they are
    (whitespace-normalised); any output with words in it is compared masked.
    """
    masked = mask(text)
    # Stop at the first letter outside a placeholder: one short scan for ordinary outputs.
    if any(match.group(1) for match in _LETTER_OR_PLACEHOLDER.finditer(masked)):
        return masked
    return _whitespace(text)


def _whitespace(text: str) -> str:
    """Line endings unified, trailing blanks and blank edges removed; nothing masked."""
    return _TRAILING_BLANKS.sub("", text.replace("\r\n", "\n")).strip()


@dataclass(frozen=True, slots=True)
class EventFingerprint:
    """The digests of one event, computed once when it is observed.

    - ``call``: tool name plus masked canonical arguments;
    - ``outcome``: what the world showed, keyed per kind: for a read, the content shown and the
      state it was shown from; for a command, tool, exit code and output; for a write, path and
      after-state; for a failure, tool, exit code and error text;
    - ``pair``: call and outcome together, the unit of exact repetition;
    - ``error``: tool plus the first and last lines of the masked error text, whatever the
      arguments (None when the call succeeded or the error text is empty);
    - ``path``: digest of the path, if any;
    - ``state``: the whole-content state a read saw (from ``content_hash``), if given;
    - ``after`` / ``before``: a successful write's after-state and, if known, before-state.
      ``state``, ``after`` and ``before`` share one space, so a write that puts back what a read
      saw is recognised.
    """

    call: str
    outcome: str
    pair: str
    error: str | None
    path: str | None
    state: str | None
    after: str | None
    before: str | None
    is_ack: bool


def _output_digest(event: ToolEvent, masked: str) -> str:
    return digest("out", event.output_hash) if event.output_hash else digest("text", masked)


def _write_after(event: ToolEvent, masked_output: str) -> str:
    """The after-state of a write: the host's hash, else what was written and what came back."""
    if event.after_hash is not None:
        return digest("state", event.after_hash)
    return digest("written", canonical_json(event.arguments), masked_output)


def _read_state(event: ToolEvent) -> str | None:
    if event.kind is ToolKind.READ and not event.failed and event.content_hash is not None:
        return digest("state", event.content_hash)
    return None


def _outcome(event: ToolEvent, output_digest: str, after: str | None) -> str:
    if event.failed:
        return digest("error", event.tool_name, str(event.exit_code), output_digest)
    if event.kind is ToolKind.READ:
        # What was shown, of which state: a new page of a long file is new; the same lines
        # again (other line numbers, after masking) are not.
        return digest("read", event.content_hash or "", output_digest)
    if event.kind is ToolKind.WRITE and after is not None:
        return digest("write", event.path or "", after)
    if event.kind is ToolKind.COMMAND:
        return digest("command", event.tool_name, str(event.exit_code), output_digest)
    return digest("other", event.tool_name, output_digest)


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


def _is_ack(event: ToolEvent, acknowledgements: Collection[str]) -> bool:
    """An empty acknowledgement ("exit 0, no output"): neither progress nor evidence of a loop."""
    if event.failed or event.kind is ToolKind.WRITE or event.output_hash:
        return False
    return event.output.strip().lower() in acknowledgements


def fingerprint(event: ToolEvent, acknowledgements: Collection[str]) -> EventFingerprint:
    """Compute every digest of ``event``: the output is masked and hashed exactly once."""
    masked = comparable(event.output)
    output_digest = _output_digest(event, masked)
    is_write = event.kind is ToolKind.WRITE and not event.failed
    after = _write_after(event, masked) if is_write else None
    known_before = is_write and event.before_hash is not None  # "" is "did not exist"
    before = digest("state", event.before_hash or "") if known_before else None
    call = digest("call", event.tool_name, mask(canonical_json(event.arguments)))
    outcome = _outcome(event, output_digest, after)
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
        is_ack=_is_ack(event, acknowledgements),
    )
