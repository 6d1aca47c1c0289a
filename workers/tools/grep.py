"""``grep``: a regular-expression search over the workspace's text files, in pure Python.

No shell and no external program: the pattern comes from the model, so it is an RE2 pattern
(:mod:`shared.safe_regex`: Python ``re`` syntax without backreferences or lookarounds) and each
line is searched in time linear in its length, whatever the pattern. Files are visited
depth-first in sorted order (so the output is deterministic), symbolic links are never followed
(each file is opened from the workspace root without following one), files with several hard
links are skipped (:mod:`workers.tools.confined`), and files with a NUL byte in their first
8 KiB are skipped as binary. The search stops at
``max_matches``, and at the context's ``timeout_s`` (so the worker thread does not outlive the
executor's timeout); each matching line is clipped to ``MAX_LINE_CHARS`` characters.

Metadata: ``kind=read``, ``path`` (the searched file or directory), ``output_hash`` (SHA-256 of
the full result before the byte cap; also given as ``content_hash``), ``matches``,
``files_searched``.
"""

from __future__ import annotations

import fnmatch
import itertools
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shared.errors import ConfigError
from shared.inference import ToolDefinition
from shared.safe_regex import UserPattern, compile_user_pattern
from workers.tools.arguments import BlockingTool
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.confined import check_path, open_for_search
from workers.tools.errors import WorkspacePathError
from workers.tools.files import line_pieces, os_failure, path_failure
from workers.tools.output import (
    BINARY_SNIFF_BYTES,
    cap_text,
    error_output,
    looks_binary,
    sha256_hex,
)
from workers.tools.workspace import (
    display_path,
    walk_entries,
    workspace_root,
)

__all__ = ["GREP_DEFINITION", "MAX_LINE_CHARS", "GrepTool"]

MAX_LINE_CHARS = 400
_DEFAULT_MAX_MATCHES = 100
_LINES_PER_CLOCK_CHECK = 1024

GREP_DEFINITION = ToolDefinition(
    name="grep",
    description=(
        "Search the workspace's text files for a regular expression (RE2 syntax: like Python "
        "re, without backreferences or lookarounds), line by line. Returns one "
        "'path:line:text' line per match, files in sorted order. Binary files and symbolic "
        "links are skipped. Use glob to restrict the files searched."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "minLength": 1,
                "description": "Regular expression searched in each line (RE2 syntax).",
            },
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "File or directory to search, relative to the workspace "
                "(default '.', the whole workspace).",
            },
            "glob": {
                "type": "string",
                "minLength": 1,
                "description": "Only search files whose name matches this glob, e.g. '*.py'; a "
                "glob containing '/' is matched against the workspace-relative path.",
            },
            "max_matches": {
                "type": "integer",
                "minimum": 1,
                "maximum": 10_000,
                "description": "Stop after this many matching lines (default 100).",
            },
            "ignore_case": {
                "type": "boolean",
                "description": "Match without regard to case (default false).",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
)


class GrepTool(BlockingTool):
    """``grep``: matching lines as ``path:line:text``, bounded and deterministic."""

    DEFINITION = GREP_DEFINITION
    KIND = "read"

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_grep`` (in a worker thread)."""
        return _grep(arguments, context)


def _compile(arguments: Mapping[str, Any]) -> UserPattern | ToolOutput:
    pattern = str(arguments["pattern"])
    ignore_case = bool(arguments.get("ignore_case", False))
    try:
        return compile_user_pattern(
            pattern, where="grep: invalid regular expression", ignore_case=ignore_case
        )
    except ConfigError as exc:
        return error_output(str(exc), error_type="invalid_arguments", kind="read")


def _grep(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    regex = _compile(arguments)
    if isinstance(regex, ToolOutput):
        return regex
    try:
        root = workspace_root(context.workspace)
        start = check_path(context.workspace, str(arguments.get("path", "."))).absolute
    except WorkspacePathError as exc:
        return path_failure(exc, kind="read")
    rel = display_path(root, start)
    try:
        exists = start.exists()
    except OSError as exc:  # a name too long, a permission denied on a parent...
        return os_failure("searching", rel, exc, kind="read", path=rel)
    if not exists:
        return error_output(
            f"{rel!r} does not exist; use file_list to find the right path",
            error_type="not_found",
            kind="read",
            path=rel,
        )
    search = _Search(regex, root, deadline=time.monotonic() + context.timeout_s)
    files = _candidate_files(start, root, arguments.get("glob"))
    limit = int(arguments.get("max_matches", _DEFAULT_MAX_MATCHES))
    found = list(itertools.islice(search.matches(files), limit + 1))
    return _grep_output(
        regex,
        rel,
        found,
        limit=limit,
        files_searched=search.files_searched,
        max_output_bytes=context.max_output_bytes,
        timed_out=search.timed_out,
    )


def _candidate_files(start: Path, root: Path, glob: str | None) -> Iterator[Path]:
    """``start`` itself when it is a file, else its regular files matching ``glob``."""
    if start.is_file():
        yield start
        return
    for entry in walk_entries(start, recursive=True):
        if not entry.is_file(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if glob is None or _glob_matches(glob, display_path(root, path)):
            yield path


def _glob_matches(glob: str, rel: str) -> bool:
    subject = rel if "/" in glob else rel.rsplit("/", 1)[-1]
    return fnmatch.fnmatchcase(subject, glob)


class _Search:
    """Matches of one pattern over a sequence of files until a deadline; counts the files."""

    def __init__(self, regex: UserPattern, root: Path, *, deadline: float) -> None:
        self._regex = regex
        self._root = root
        self._deadline = deadline
        self.files_searched = 0
        self.timed_out = False

    def matches(self, files: Iterator[Path]) -> Iterator[str]:
        for path in files:
            if self._out_of_time():
                return
            yield from self._matches_in(path, display_path(self._root, path))

    def _out_of_time(self) -> bool:
        self.timed_out = self.timed_out or time.monotonic() > self._deadline
        return self.timed_out

    def _matches_in(self, path: Path, rel: str) -> Iterator[str]:
        try:
            with open_for_search(self._root, path) as handle:
                if looks_binary(handle.read(BINARY_SNIFF_BYTES)):
                    return
                self.files_searched += 1
                handle.seek(0)
                for line_no, piece in line_pieces(handle):
                    if line_no % _LINES_PER_CLOCK_CHECK == 0 and self._out_of_time():
                        return
                    text = piece.decode("utf-8", errors="replace").rstrip("\r\n")
                    if self._regex.search(text) is not None:
                        yield f"{rel}:{line_no}:{_clip(text)}"
        except OSError:
            return


def _clip(text: str) -> str:
    if len(text) <= MAX_LINE_CHARS:
        return text
    return text[:MAX_LINE_CHARS] + f" [... {len(text) - MAX_LINE_CHARS} more characters]"


def _grep_output(
    regex: UserPattern,
    rel: str,
    found: list[str],
    *,
    limit: int,
    files_searched: int,
    max_output_bytes: int,
    timed_out: bool,
) -> ToolOutput:
    if not found:
        text = f"no match for {regex.pattern!r} in {rel} ({files_searched} files searched)"
    elif len(found) > limit:
        text = "\n".join(found[:limit]) + (
            f"\n[stopped after {limit} matches; narrow the pattern, path or glob, "
            "or raise max_matches]"
        )
    else:
        text = "\n".join(found)
    if timed_out:
        text += (
            f"\n[stopped at the time limit after {files_searched} files; narrow the path or glob]"
        )
    digest = sha256_hex(text.encode("utf-8"))
    metadata = {
        "kind": "read",
        "path": rel,
        "output_hash": digest,
        "content_hash": digest,
        "matches": str(min(len(found), limit)),
        "files_searched": str(files_searched),
    }
    hint = "narrow the pattern, path or glob"
    return ToolOutput(content=cap_text(text, max_output_bytes, hint=hint), metadata=metadata)
