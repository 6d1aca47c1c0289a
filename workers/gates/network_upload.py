"""The default gate's ``network-upload`` rule: a command that sends local data over the network.

The policy: the default gate lets a command use the network (downloads, package installs,
``git clone`` are an agent's ordinary work) but refuses one that *sends* local files or input
out, which is how a secret (``~/.ssh/id_rsa``, a ``.env``) leaves the machine. A task that must
upload lists the rule in its policy: ``policy: {kind: default, disabled_rules: [network-upload]}``.

The command is split with :mod:`shlex` (quotes, escapes) into simple commands at ``;``, ``&&``,
``||``, ``|``, ``&``, parentheses and backticks; a simple command's leading ``VAR=value``
assignments and wrappers (``sudo``, ``env``, ``timeout 10``, ``xargs``, ``nohup``, ...) are
skipped, a program is known by its base name (``/usr/bin/curl`` is ``curl``), and the scripts
given to ``sh -c`` / ``bash -c`` / ``eval`` and inside ``$(...)`` or backticks are read the same
way. What is refused:

- ``curl`` sending a file or its input: ``-d``/``--data``/``--data-binary``/``--data-ascii``/
  ``--json`` ``@file`` (or ``@-``), ``--data-urlencode``/``--url-query`` ``[name]@file``,
  ``-F``/``--form`` ``name=@file`` or ``name=<file``, ``-T``/``--upload-file``;
- ``wget --post-file`` / ``--body-file`` (also as ``-e post_file=...``);
- HTTPie (``http``, ``https``, ``xh``) with a ``field@file`` / ``field=@file`` item;
- ``nc`` / ``ncat`` / ``netcat`` / ``telnet`` (they send whatever they are given; a port check
  ``nc -z`` without input is allowed) and ``socat``;
- ``scp`` / ``rsync`` from a local path to a remote one (``host:path``, ``rsync://``);
  ``sftp`` in batch mode (``-b``) or with input;
- any network command above, or ``ssh``, fed a file (``< file``), a here-document, or a pipe
  (``cat file | nc host 80``) where it reads its input (``ssh``, HTTPie, ``nc``, ``curl ... @-``);
- any redirection through bash's ``/dev/tcp/`` or ``/dev/udp/``.

Like the rest of the default gate this is a guard rail against an agent's mistakes and injected
instructions, not a sandbox: a program that opens sockets itself (a Python one-liner) or data
passed through a variable or command substitution (``curl -d "$(cat key)"``) are not judged. An
operating-system sandbox without network access is the boundary.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from workers.gates.command_rules import normalise_command

__all__ = ["NETWORK_UPLOAD", "Upload", "find_upload"]

NETWORK_UPLOAD = "network-upload"
"""The rule's name, as denials show it and ``disabled_rules`` turns it off."""


@dataclass(frozen=True, slots=True)
class Upload:
    """A command that sends local data out: the program, and what it sends how."""

    program: str
    explanation: str


def find_upload(command: str) -> Upload | None:
    """The first simple command of ``command`` that sends local data over the network, or None."""
    return _find(command, depth=0)


# -- splitting into simple commands ------------------------------------------------------------

_MAX_DEPTH = 8
_DEV_NET = re.compile(r"/dev/(?:tcp|udp)/")
_QUOTING = re.compile(r"[\\'\"]")
_MENTIONS = re.compile(r"curl|wget|http|xhs?\b|nc|netcat|telnet|socat|scp|rsync|sftp|ssh|eval")
_PUNCTUATION = ";&|()<>`"
_REDIRECTS = frozenset({"<", "<<", "<<<", "<>", ">", ">>", ">&", "<&", "&>", "&>>", ">|"})
_HERE = frozenset({"<<", "<<<"})
_BACKTICKS = re.compile(r"`([^`]*)`")


@dataclass(slots=True)
class _Simple:
    """One simple command: its words, and where its standard input comes from (None: inherited)."""

    words: list[str]
    stdin: str | None = None


def _find(command: str, depth: int) -> Upload | None:
    unquoted = _QUOTING.sub("", command)
    if _DEV_NET.search(unquoted):
        return Upload("/dev/tcp", "opens a network connection through /dev/tcp or /dev/udp")
    if not _MENTIONS.search(unquoted):
        return None  # the cheap common case: no program that could send
    if depth > _MAX_DEPTH:
        return Upload("sh", f"nests commands more than {_MAX_DEPTH} deep, too deep to check")
    for simple in _simple_commands(command):
        upload = _judge(simple, depth)
        if upload is not None:
            return upload
    return None


def _tokens(command: str) -> list[str]:
    """Shell words and operators; a command shlex cannot split (an open quote) is split as the
    command rules read it (quotes dropped)."""
    text = command.replace("\\\r\n", " ").replace("\\\n", " ").replace("\n", " ; ")
    try:
        return _shlex(text)
    except ValueError:
        return _shlex(normalise_command(text).replace("\\", " "))


def _shlex(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a '#' inside a word (a URL's fragment) must not hide the rest
    return list(lexer)


def _simple_commands(command: str) -> Iterator[_Simple]:
    tokens = iter(_tokens(command))
    current = _Simple([])
    for token in tokens:
        if not _is_operator(token):
            current.words.append(token)
        elif token in _REDIRECTS:
            _redirect(current, token, next(tokens, ""))
        else:
            yield current
            piped = token.endswith("|") or token.endswith("|&")
            current = _Simple([], "a pipe" if piped else None)
    yield current


def _is_operator(token: str) -> bool:
    return bool(token) and all(char in _PUNCTUATION for char in token)


def _redirect(simple: _Simple, operator: str, target: str) -> None:
    if simple.words and simple.words[-1].isdigit():
        simple.words.pop()  # the descriptor of ``2>file``, not an argument
    if operator in _HERE:
        simple.stdin = "a here-document"
    elif operator in ("<", "<>") and target != "/dev/null":
        simple.stdin = f"the file {target!r}"


# -- one simple command ------------------------------------------------------------------------

_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox-sh"})
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user"}),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
    "xargs": frozenset({"-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "watch": frozenset({"-n", "--interval"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "exec": frozenset({"-a"}),
    **{
        name: frozenset()
        for name in ("nohup", "time", "command", "builtin", "busybox", "setsid", "chronic")
    },
}
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_COUNT = re.compile(r"[+-]?\d+(?:\.\d+)?[smhd]?")


def _judge(simple: _Simple, depth: int) -> Upload | None:
    for word in simple.words:
        for body in _substitutions(word):
            upload = _find(body, depth + 1)
            if upload is not None:
                return upload
    words = _without_prefixes(simple.words)
    if not words:
        return None
    program, arguments = os.path.basename(words[0]), words[1:]
    if program in _SHELLS or program == "eval":
        script = _script(program, arguments)
        return None if script is None else _find(script, depth + 1)
    check = _CHECKS.get(program)
    return None if check is None else check(program, arguments, simple.stdin)


def _substitutions(word: str) -> Iterator[str]:
    """The commands a quoted word runs: its outermost ``$(...)`` (to the matching parenthesis,
    or the end) and backtick substitutions."""
    start = word.find("$(")
    while start >= 0:
        depth, end = 1, start + 2
        while end < len(word) and depth:
            depth += {"(": 1, ")": -1}.get(word[end], 0)
            end += 1
        yield word[start + 2 : end - 1 if depth == 0 else end]
        start = word.find("$(", end)
    yield from (match.group(1) for match in _BACKTICKS.finditer(word))


def _without_prefixes(words: list[str]) -> list[str]:
    """The words from the program on: assignments and wrappers (with their options) dropped."""
    index = 0
    while index < len(words):
        word = words[index]
        wrapper = _WRAPPERS.get(os.path.basename(word))
        if _ASSIGNMENT.match(word):
            index += 1
        elif wrapper is not None:
            index = _after_wrapper_options(words, index + 1, wrapper)
        else:
            break
    return words[index:]


def _after_wrapper_options(words: list[str], index: int, with_value: frozenset[str]) -> int:
    while index < len(words):
        word = words[index]
        if word in with_value:
            index += 2
        elif (word.startswith("-") and word != "-") or _COUNT.fullmatch(word):
            index += 1
        else:
            break
    return index


def _script(program: str, arguments: list[str]) -> str | None:
    """The script a shell runs from its ``-c`` option, or what ``eval`` runs (None: a script
    file or the shell's input, not judged)."""
    if program == "eval":
        return " ".join(arguments)
    words = iter(arguments)
    for word in words:
        if word in ("-o", "+o", "-O", "+O"):
            next(words, None)  # a shell option's name
        elif word.startswith("--"):
            continue
        elif not word.startswith(("-", "+")):
            return None
        elif word.startswith("-") and "c" in word[1:]:
            return next(words, None)
    return None


# -- the programs ------------------------------------------------------------------------------

_Check = Callable[[str, list[str], str | None], Upload | None]

_CURL_SHORT_WITH_VALUE = frozenset("AbcCdDeEFHKmoPQrtTuUwxXyYz")
_CURL_DATA = frozenset({"-d", "--data", "--data-ascii", "--data-binary", "--json"})
_CURL_URLENCODE = frozenset({"--data-urlencode", "--url-query"})
_CURL_FORM = frozenset({"-F", "--form"})
_CURL_UPLOAD = frozenset({"-T", "--upload-file"})
_CURL_LONG_WITH_VALUE = _CURL_DATA | _CURL_URLENCODE | _CURL_FORM | _CURL_UPLOAD
_URLENCODED_FILE = re.compile(r"[^=]*@(?P<file>.*)")
_FORM_FILE = re.compile(r"[^=]*=\s*[@<](?P<file>[^;]*)")


def _curl_options(arguments: list[str]) -> Iterator[tuple[str, str]]:
    """``(option, value)`` for curl's options that take a value (short clusters such as
    ``-sd@file`` and ``-XPOST`` included); long options with ``=value`` too."""
    index = 0
    while index < len(arguments):
        word = arguments[index]
        index += 1
        if word == "--":
            return
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            if name in _CURL_LONG_WITH_VALUE:
                if not equals:
                    value, index = _next(arguments, index)
                yield name, value
            continue
        if not word.startswith("-") or word == "-":
            continue
        for position, letter in enumerate(word[1:], start=2):
            if letter in _CURL_SHORT_WITH_VALUE:
                value = word[position:]
                if not value:
                    value, index = _next(arguments, index)
                yield f"-{letter}", value
                break


def _next(arguments: list[str], index: int) -> tuple[str, int]:
    return (arguments[index], index + 1) if index < len(arguments) else ("", index)


def _curl_file(option: str, value: str) -> str | None:
    """The file (``-`` for the input) a curl option sends, or None."""
    if option in _CURL_DATA:
        return value[1:] if value.startswith("@") else None
    if option in _CURL_URLENCODE:
        match = _URLENCODED_FILE.fullmatch(value)
        return match.group("file") if match else None
    if option in _CURL_FORM:
        match = _FORM_FILE.match(value)
        return match.group("file").strip() if match else None
    if option in _CURL_UPLOAD:
        return value
    return None


def _check_curl(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    for option, value in _curl_options(arguments):
        sent = _curl_file(option, value)
        if sent in ("-", "."):
            where = f" ({stdin})" if stdin else ""
            return Upload(program, f"sends its input{where} ({option} {value})")
        if sent is not None:
            return Upload(program, f"sends the file {sent!r} ({option} {value})")
    return _fed_a_file(program, stdin)


_WGET_SENDS = ("--post-file", "--body-file")
_WGETRC_SENDS = re.compile(r"\s*(?:post|body)[_-]?file\s*=", re.IGNORECASE)


def _check_wget(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    for index, word in enumerate(arguments):
        name, equals, value = word.partition("=")
        if not equals:
            value = arguments[index + 1] if index + 1 < len(arguments) else ""
        if name in _WGET_SENDS:
            return Upload(program, f"sends the file {value!r} ({name})")
        if name in ("-e", "--execute") and _WGETRC_SENDS.match(value):
            return Upload(program, f"sends a file ({name} {value})")
    return _fed_a_file(program, stdin)


_HTTPIE_FILE_ITEM = re.compile(r"[^=:@\s]*(?:=|:=)?@(?P<file>.+)")


def _check_httpie(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    operands = [word for word in arguments if not word.startswith("-")]
    if operands and operands[0].isupper():
        operands = operands[1:]  # the method
    for item in operands[1:]:  # after the URL
        match = _HTTPIE_FILE_ITEM.fullmatch(item)
        if match:
            return Upload(program, f"sends the file {match.group('file')!r} (item {item!r})")
    return _fed(program, stdin)


def _check_netcat(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    scan = any(w.startswith("-") and not w.startswith("--") and "z" in w for w in arguments)
    if scan and stdin is None:
        return None
    return Upload(program, "opens a raw network connection, which sends whatever it is given")


def _check_socat(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    return Upload(program, "relays data between local and network endpoints")


_REMOTE = re.compile(r"(?:[\w.%+-]+@)?(?:[\w.-]+|\[[0-9A-Fa-f:.%\w]+\]):|(?:scp|sftp|rsync)://")
_SCP_WITH_VALUE = frozenset({"-c", "-D", "-F", "-i", "-J", "-l", "-o", "-P", "-S", "-X"})
_RSYNC_WITH_VALUE = frozenset(
    {"-e", "-f", "-B", "-T", "-M", "--rsh", "--rsync-path", "--exclude", "--include"}
    | {"--exclude-from", "--include-from", "--files-from", "--filter", "--password-file"}
    | {"--log-file", "--partial-dir", "--temp-dir", "--compare-dest", "--copy-dest"}
    | {"--link-dest", "--backup-dir", "--suffix", "--chmod", "--chown", "--timeout"}
    | {"--port", "--bwlimit", "--max-size", "--min-size", "--out-format", "--info", "--debug"}
)


def _operands(arguments: list[str], with_value: frozenset[str]) -> list[str]:
    """The words that are not options (nor the values of those in ``with_value``)."""
    operands: list[str] = []
    skip = False
    for word in arguments:
        if skip:
            skip = False
        elif word in with_value:
            skip = True
        elif not word.startswith("-") or word == "-":
            operands.append(word)
    return operands


def _copy_out(program: str, operands: list[str]) -> Upload | None:
    """A copy whose local source comes before a remote destination."""
    local: str | None = None
    for operand in operands:
        if _REMOTE.match(operand):
            if local is not None:
                return Upload(program, f"copies the local {local!r} to the remote {operand!r}")
        elif local is None:
            local = operand
    return None


def _check_scp(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    return _copy_out(program, _operands(arguments, _SCP_WITH_VALUE))


def _check_rsync(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    return _copy_out(program, _operands(arguments, _RSYNC_WITH_VALUE))


def _check_sftp(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    if any(w.startswith("-") and not w.startswith("--") and "b" in w for w in arguments):
        return Upload(program, "runs a batch of transfer commands (-b), which may put files")
    return _fed(program, stdin)


def _check_ssh(program: str, arguments: list[str], stdin: str | None) -> Upload | None:
    return _fed(program, stdin)


def _fed(program: str, stdin: str | None) -> Upload | None:
    """A network program that reads its input, given one (a pipe, a file, a here-document)."""
    if stdin is None:
        return None
    return Upload(program, f"sends its input ({stdin}) over the network")


def _fed_a_file(program: str, stdin: str | None) -> Upload | None:
    """A network program given a file on its input (``curl ... < file``)."""
    if stdin is None or not stdin.startswith("the file"):
        return None
    return Upload(program, f"is given {stdin} as its input")


_CHECKS: dict[str, _Check] = {
    "curl": _check_curl,
    "wget": _check_wget,
    **dict.fromkeys(("http", "https", "xh", "xhs"), _check_httpie),
    **dict.fromkeys(("nc", "ncat", "netcat", "telnet"), _check_netcat),
    "socat": _check_socat,
    "scp": _check_scp,
    "rsync": _check_rsync,
    "sftp": _check_sftp,
    "ssh": _check_ssh,
}
