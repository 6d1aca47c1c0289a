"""The deny-list of destructive shell commands that :class:`DefaultPolicyGate` applies.

Each rule is a named regex matched against a *normalised* command (:func:`normalise_command`):
line continuations joined, backslashes dropped (``\\rm`` is ``rm``), quotes removed, and the
shell metacharacters inside quoted data blanked so that ``git commit -m "fix; halt"`` is not read
as running ``halt``. Quoted text that is code (after ``sh -c``, ``eval``, ``su -c``, ``ssh host``)
keeps its metacharacters, and so does ``$(...)`` inside double quotes, which the shell runs.

A rule matches a command word only where a command starts: at the beginning, after ``;``,
``&&``, ``||``, ``|``, ``&``, ``(``, ``{``, a backtick, ``$(``, ``then``/``do``/``else``,
``find -exec``, and after wrappers such as ``sudo``, ``env X=1``, ``nohup``, ``timeout 10``,
``xargs`` or ``bash -c``. So ``echo reboot`` and ``grep -r shutdown src/`` are allowed while
``sudo reboot`` is not. This is a guard rail against an agent's mistakes, not a sandbox: a
determined author can always obfuscate a command (the tools' own workspace checks and the
operator's container are the other layers).

The built-in rules are the project's own Python ``re`` patterns (they need lookarounds and
backreferences). Configured extra patterns come from a task or a policy, so they are RE2
patterns (:mod:`shared.safe_regex`): matching them takes time linear in the command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.errors import ConfigError
from shared.safe_regex import UserPattern, compile_user_pattern

__all__ = [
    "BUILTIN_COMMAND_RULES",
    "CommandRule",
    "build_command_rules",
    "normalise_command",
]


@dataclass(frozen=True, slots=True)
class CommandRule:
    """A named regex over a normalised command, with the reason a match is refused."""

    name: str
    description: str
    pattern: re.Pattern[str] | UserPattern

    @classmethod
    def custom(cls, name: str, pattern: str, description: str) -> CommandRule:
        """A rule from a configured (untrusted) pattern, compiled by RE2; ConfigError if refused."""
        compiled = compile_user_pattern(pattern, where=f"deny pattern {name!r}")
        return cls(name=name, description=description, pattern=compiled)

    @classmethod
    def compile(cls, name: str, pattern: str, description: str) -> CommandRule:
        """A rule from trusted regex text (Python ``re``); ConfigError naming it if invalid."""
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"deny pattern {name!r}: {pattern!r} is not a valid regular expression ({exc}); "
                "fix the pattern (Python `re` syntax)"
            ) from exc
        return cls(name=name, description=description, pattern=compiled)

    def matches(self, normalised_command: str) -> bool:
        """Whether the rule fires on a command already passed through normalise_command."""
        return self.pattern.search(normalised_command) is not None


# -- normalisation ---------------------------------------------------------------------------

_DATA_METACHARACTERS = frozenset(";&|(){}<>`\n")
_CODE_QUOTE_INTRODUCER = re.compile(
    r"(?:\b(?:ba|z|k|da|fi)?sh(?:\s+-\w+)*\s+-\w*c|\beval|\bsu(?:\s+\S+)*\s+-c|\bssh(?:\s+\S+)+)"
    r"\s*$"
)


def normalise_command(command: str) -> str:
    """The command as the rules read it: one line, no quotes, quoted data defused."""
    text = command.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char in "'\"":
            position = _copy_quoted(text, position, out)
        elif char == "\\":
            position = _copy_escaped(text, position, out)
        else:
            out.append(char)
            position += 1
    return re.sub(r"[ \t\r\f\v]+", " ", "".join(out).replace("\n", " ; ")).strip()


def _copy_quoted(text: str, start: int, out: list[str]) -> int:
    """Copy a quoted string without its quotes; returns the index after the closing quote."""
    quote = text[start]
    is_code = _CODE_QUOTE_INTRODUCER.search("".join(out[-200:])) is not None
    depth, backtick = 0, False
    position = start + 1
    while position < len(text) and text[position] != quote:
        runs = False
        if quote == '"' and text[position] == "\\" and position + 1 < len(text):
            position += 1
        else:
            depth, backtick, runs = _substitution(quote, text, position, depth, backtick)
        char = text[position]
        out.append(char if is_code or runs else _defuse(char))
        position += 1
    return position + 1


def _substitution(
    quote: str, text: str, position: int, depth: int, backtick: bool
) -> tuple[int, bool, bool]:
    """Track ``$(...)`` and backticks in double quotes, which the shell runs.

    Returns the new ``$(`` depth, whether a backtick substitution is open, and whether the
    character at ``position`` belongs to a substitution.
    """
    if quote != '"':
        return depth, backtick, False
    char = text[position]
    if char == "`":
        return depth, not backtick, True
    if text.startswith("$(", position):
        return depth + 1, backtick, True
    if char == ")" and depth > 0:
        return depth - 1, backtick, True
    return depth, backtick, depth > 0 or backtick


def _defuse(char: str) -> str:
    return " " if char in _DATA_METACHARACTERS else char


def _copy_escaped(text: str, start: int, out: list[str]) -> int:
    """Drop the backslash; an escaped metacharacter (``\\;``) is data, so it is defused."""
    if start + 1 < len(text):
        out.append(_defuse(text[start + 1]))
    return start + 2


# -- building blocks of the built-in rules ----------------------------------------------------

_SEP_CHARS = r";&|(){}`"
_SEG = rf"[^{_SEP_CHARS}]"  # a character of the same simple command
_END = rf"(?=\s|$|[{_SEP_CHARS}])"
_SEP = r"(?:^|[;&|(){}`!]|\$\(|\b(?:then|do|else)\b|\s-(?:exec|execdir|ok)\b)\s*"
_WRAPPER_WORDS = (
    r"(?:sudo|doas|exec|nohup|nice|ionice|time|command|builtin|eval|env|xargs|watch|timeout"
    r"|busybox|stdbuf)\b"
)
# A flag's argument is never a wrapper word: that ambiguity would make matching exponential.
_WRAPPER = (
    r"(?:"
    rf"{_WRAPPER_WORDS}(?:\s+--?\w[\w-]*(?:=\S*)?(?:\s+(?!-|{_WRAPPER_WORDS})[\w./:-]+)?)*"
    r"(?:\s+\d+(?:\.\d+)?[smhd]?)?\s+"
    r"|[A-Za-z_]\w*=\S*\s+"
    r"|(?:\S*/)?(?:ba|z|k|da|fi)?sh(?:\s+-\w+)*\s+-\w*c\s+"
    r")"
)
_CMD = rf"{_SEP}{_WRAPPER}*(?:\S*/)?"
_SYSTEM_DIRS = r"(?:bin|boot|dev|etc|home|lib|lib32|lib64|opt|proc|root|sbin|srv|sys|usr|var)"
_ROOTISH = rf"(?:/+\*?|~/*\*?|\$\{{?HOME\}}?/*\*?|/+{_SYSTEM_DIRS}/*\*?)"
_WIPE_TARGET = r"(?:\.{0,2}/*\*|\.{1,2}/*)"
_RECURSIVE_FLAG = rf"(?={_SEG}*\s(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive){_END})"
_DISK = r"/dev/(?:sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk\d|md\d|dm-\d|mapper/)"
_SHELLS = r"(?:\S*/)?(?:(?:ba|z|k|da|fi|c|tc)?sh|python[\d.]*|perl|ruby|node|php)\b"
_WORD_START = rf"(?<![^\s{_SEP_CHARS}])"
_PROTECTED = r"(?:main|master|trunk|develop|production|prod|stable|release(?:/\S*)?)"
_PROTECTED_REF = rf"(?:\S*:)?(?:refs/heads/)?{_PROTECTED}{_END}"
_GIT_PUSH = rf"{_CMD}git(?:\s+-[Cc]\s+\S+|\s+--\S+)*\s+push\b"
_FORCE_FLAG = (
    rf"(?={_SEG}*\s(?:--force(?:-with-lease|-if-includes)?(?:=\S*)?|-[a-zA-Z]*f[a-zA-Z]*){_END})"
)
_SYSTEM_WRITE_DIR = (
    rf"/+(?:etc|boot|usr|bin|sbin|lib|lib32|lib64|sys|proc|root|var/lib|var/spool/cron)(?:/|{_END})"
)


def _alternatives(*patterns: str) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


_BUILTIN_SOURCES: tuple[tuple[str, str, str], ...] = (
    (
        "rm-root",
        "recursive delete of /, the home directory or a system directory",
        _alternatives(
            rf"{_CMD}rm\b{_RECURSIVE_FLAG}{_SEG}*\s{_ROOTISH}{_END}",
            rf"{_CMD}rm\b{_SEG}*\s--no-preserve-root\b",
        ),
    ),
    (
        "rm-workspace-wipe",
        "recursive delete of the whole working directory (*, ., .., .*)",
        rf"{_CMD}rm\b{_RECURSIVE_FLAG}{_SEG}*\s{_WIPE_TARGET}{_END}",
    ),
    (
        "disk-format",
        "formatting or wiping a file system (mkfs, mke2fs, mkswap, wipefs)",
        rf"{_CMD}(?:mkfs(?:\.\w+)?|mke2fs|mkswap|wipefs|mkdosfs|mkntfs){_END}",
    ),
    (
        "raw-device-write",
        "writing raw data onto a device (dd of=/dev/..., > /dev/sdX, shred /dev/...)",
        _alternatives(
            rf"{_CMD}dd\b{_SEG}*\bof=/dev/(?!null\b|zero\b|stdout\b|stderr\b)",
            rf">\s*{_DISK}",
            rf"{_CMD}(?:shred|wipe)\b{_SEG}*\s{_DISK}",
        ),
    ),
    (
        "fork-bomb",
        "a fork bomb",
        _alternatives(
            r"(?<![\w:.])([\w:.]+)\s*\(\s*\)\s*\{\s*\1\s*\|\s*\1\s*&\s*\}",
            r"\bfunction\s+([\w:.]+)\s*(?:\(\s*\))?\s*\{\s*\2\s*\|\s*\2\s*&\s*\}",
        ),
    ),
    (
        "power-state",
        "shutting down, rebooting or halting the machine",
        rf"{_CMD}(?:shutdown|reboot|halt|poweroff|(?:tel)?init\s+[06]"
        r"|systemctl(?:\s+-\S+)*\s+(?:poweroff|reboot|halt|kexec|suspend|hibernate))"
        rf"{_END}",
    ),
    (
        "permissions-system",
        "changing permissions or ownership of /, the home directory or a system directory",
        rf"{_CMD}(?:chmod|chown|chgrp)\b{_SEG}*\s{_ROOTISH}{_END}",
    ),
    (
        "pipe-to-shell",
        "running a downloaded script (curl/wget piped or substituted into a shell or interpreter)",
        _alternatives(
            rf"\b(?:curl|wget|fetch)\b[^;&\n]*(?<!\|)\|(?!\|)\s*{_WRAPPER}*{_SHELLS}",
            rf"{_WORD_START}{_SHELLS}(?:\s+-\S+)*\s+<\(\s*(?:curl|wget)\b",
            r"\b(?:ba|z|k|da)?sh\s+-\w*c\s+\$\(\s*(?:curl|wget)\b",
            r"(?:^|[;&|(\s])(?:source|\.)\s+<\(\s*(?:curl|wget)\b",
        ),
    ),
    (
        "git-protected-branch",
        "force push to a protected branch (main, master, trunk, develop, production, prod, "
        "stable, release/*), a force push that does not name its branch, or deleting a "
        "protected branch",
        _alternatives(
            rf"{_GIT_PUSH}{_FORCE_FLAG}{_SEG}*\s{_PROTECTED_REF}",
            rf"{_GIT_PUSH}{_SEG}*\s\+{_PROTECTED_REF}",
            rf"{_GIT_PUSH}(?={_SEG}*\s(?:--delete|-d)\s){_SEG}*\s{_PROTECTED}{_END}",
            rf"{_GIT_PUSH}{_SEG}*\s:(?:refs/heads/)?{_PROTECTED}{_END}",
            rf"{_GIT_PUSH}{_FORCE_FLAG}(?:\s+-\S+)*(?:\s+[^\s{_SEP_CHARS}-]\S*(?:\s+-\S+)*)?\s*"
            rf"(?=$|[{_SEP_CHARS}])",
        ),
    ),
    (
        "system-write",
        "writing into a system directory (/etc, /boot, /usr, /bin, /lib, /root, /var/lib, ...)",
        _alternatives(
            rf"(?:\d|&)?>{{1,2}}\s*{_SYSTEM_WRITE_DIR}",
            rf"{_CMD}tee(?:\s+-\S+)*(?:\s+[^\s{_SEP_CHARS}]+)*?\s+{_SYSTEM_WRITE_DIR}",
            rf"{_CMD}(?:cp|mv|install|ln|rsync)\b{_SEG}*\s{_SYSTEM_WRITE_DIR}\S*\s*"
            rf"(?=$|[{_SEP_CHARS}])",
            rf"{_CMD}sed\b(?={_SEG}*\s-\w*i){_SEG}*\s{_SYSTEM_WRITE_DIR}",
            rf"{_CMD}truncate\b{_SEG}*\s{_SYSTEM_WRITE_DIR}",
        ),
    ),
    (
        "kill-all-processes",
        "killing every process (kill -1, killall5)",
        _alternatives(
            rf"{_CMD}kill(?:\s+-\S+)*\s+-1\s*(?=$|[{_SEP_CHARS}])",
            rf"{_CMD}killall5{_END}",
        ),
    ),
)

BUILTIN_COMMAND_RULES: tuple[CommandRule, ...] = tuple(
    CommandRule.compile(name, pattern, description)
    for name, description, pattern in _BUILTIN_SOURCES
)


def build_command_rules(
    extra_patterns: Mapping[str, str] | Iterable[str] = (),
    disabled: Iterable[str] = (),
    *,
    other_rule_names: Iterable[str] = (),
) -> tuple[CommandRule, ...]:
    """The built-in rules minus the disabled ones, plus the extra patterns.

    ``extra_patterns`` is either ``{name: regex}`` or a list of regexes (named ``custom-1``,
    ``custom-2``, ...); extra patterns are matched against the normalised command too.
    ``other_rule_names`` are the names of non-command rules that may also be disabled; an
    unknown name in ``disabled`` is a ConfigError listing the known names.
    """
    disabled_names = frozenset(disabled)
    known = {rule.name for rule in BUILTIN_COMMAND_RULES} | set(other_rule_names)
    unknown = sorted(disabled_names - known)
    if unknown:
        raise ConfigError(
            f"disabled_rules: unknown rule name(s) {unknown}; known rules: {sorted(known)}"
        )
    kept = tuple(rule for rule in BUILTIN_COMMAND_RULES if rule.name not in disabled_names)
    return kept + _extra_rules(extra_patterns)


def _extra_rules(extra_patterns: Mapping[str, str] | Iterable[str]) -> tuple[CommandRule, ...]:
    if isinstance(extra_patterns, Mapping):
        named = list(extra_patterns.items())
    else:
        named = [(f"custom-{i}", p) for i, p in enumerate(extra_patterns, start=1)]
    return tuple(
        CommandRule.custom(name, pattern, f"matches the configured deny pattern {pattern!r}")
        for name, pattern in named
    )
