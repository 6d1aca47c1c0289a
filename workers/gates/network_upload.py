"""The default gate's ``network-upload`` rule: a command that sends local data over the network.

The policy: the default gate lets a command use the network (downloads, package installs,
``git clone`` are an agent's ordinary work) but refuses one that *sends* local files or input
out, which is how a secret (``~/.ssh/id_rsa``, a ``.env``) leaves the machine. A task that must
upload lists the rule in its policy: ``policy: {kind: default, disabled_rules: [network-upload]}``.

The command is split with :mod:`shlex` (quotes, escapes) into simple commands at ``;``, ``&&``,
``||``, ``|``, ``&``, parentheses and backticks; a simple command's leading ``VAR=value``
assignments, shell keywords (``{``, ``!``, ``if``, ``then``, ``do``, ``coproc``, ...) and
wrappers (``sudo``, ``env``, ``timeout 10``, ``xargs``, ``parallel``, ``watch``, ``flock FILE``,
``nohup``, ...) are skipped, a program is known by its base name (``/usr/bin/curl`` is
``curl``), and the scripts given to ``sh -c`` / ``bash -c [--]`` / ``eval`` / ``su -c`` /
``runuser -c`` / ``script -c`` / ``env -S`` / ``watch`` / ``flock -c``, the commands of
``find -exec`` / ``-execdir`` / ``-ok``, and those inside ``$(...)`` or backticks are read the
same way. What is refused:

- ``curl`` sending a file or its input: ``-d``/``--data``/``--data-binary``/``--data-ascii``/
  ``--json`` ``@file`` (or ``@-``), ``--data-urlencode``/``--url-query`` ``[name]@file``,
  ``-F``/``--form`` ``name=@file`` or ``name=<file``, ``-T``/``--upload-file``;
- ``wget --post-file`` / ``--body-file`` (also as ``-e post_file=...``);
- HTTPie (``http``, ``https``, ``xh``) with a ``field@file`` / ``field=@file`` item;
- ``nc`` / ``ncat`` / ``netcat`` (also Debian's ``nc.openbsd``, ``netcat.traditional``, ...) /
  ``telnet`` (they send whatever they are given; a port check
  ``nc -z`` without input is allowed) and ``socat``;
- ``scp`` / ``rsync`` from a local path to a remote one (``host:path``, ``rsync://``);
  ``sftp`` in batch mode (``-b``) or with input;
- any network command above, or ``ssh``, fed a file (``< file``), a here-document, or a pipe
  (``cat file | nc host 80``) where it reads its input (``ssh``, HTTPie, ``nc``, ``curl ... @-``);
- any redirection through bash's ``/dev/tcp/`` or ``/dev/udp/``, and any redirection to a
  ``/dev/`` path holding a ``$`` (``/dev/$d/host/80``: which device it is is known only when run);
- failing closed, a program whose name is made when the command runs (a word with ``$``,
  ``$'...'``, backticks or glob characters: ``$c``, ``$'\\x63url'``, ``c?rl``, ``[c]url``, or the
  output of ``$(...)``) given an argument that would make ``curl`` or ``wget`` send a file.

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
_DEV_DYNAMIC = re.compile(r"[<>]&?\s*/dev/[^\s;&|<>()]*\$")
_QUOTING = re.compile(r"[\\'\"]")
_MENTIONS = re.compile(
    r"curl|wget|http|xhs?\b|nc|netcat|telnet|socat|scp|rsync|sftp|ssh|eval|[$`*?\[]"
)
_PUNCTUATION = ";&|()<>`"
_REDIRECTS = frozenset({"<", "<<", "<<<", "<>", ">", ">>", ">&", "<&", "&>", "&>>", ">|"})
_HERE = frozenset({"<<", "<<<"})
_BACKTICKS = re.compile(r"`([^`]*)`")


@dataclass(slots=True)
class _Simple:
    """One simple command: its words, and where its standard input comes from (None: inherited)."""

    words: list[str]
    stdin: str | None = None
    after_substitution: bool = False
    """Follows a ``$(...)`` or backticks: its first word may be an argument of their output."""
    find_rest: bool = False
    """Follows a ``;`` ending a ``find -exec``: it may be the rest of the find (``\\;`` and ``;``
    are one word to shlex), so it is judged both as a command and as find's arguments."""


def _find(command: str, depth: int) -> Upload | None:
    unquoted = _QUOTING.sub("", command)
    if _DEV_NET.search(unquoted):
        return Upload("/dev/tcp", "opens a network connection through /dev/tcp or /dev/udp")
    if _DEV_DYNAMIC.search(unquoted):
        return Upload(
            "/dev/tcp", "redirects to a /dev/ path made when it runs ('$'), maybe /dev/tcp"
        )
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
        pass
    try:
        return _shlex(normalise_command(text).replace("\\", " "))
    except ValueError:  # a quote normalising leaves unbalanced (``'"curl``): drop every quote
        return _shlex(_QUOTING.sub(" ", normalise_command(text)))


def _shlex(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a '#' inside a word (a URL's fragment) must not hide the rest
    return list(lexer)


def _simple_commands(command: str) -> Iterator[_Simple]:
    parts = iter(_tokens(command))
    current = _Simple([])
    in_backticks = False
    for part in parts:
        if not _is_operator(part):
            current.words.append(part)
        elif part in _REDIRECTS:
            _redirect(current, part, next(parts, ""))
        else:
            yield current
            piped = part.endswith("|") or part.endswith("|&")
            closing = part.endswith(")") or (part.endswith("`") and in_backticks)
            in_backticks ^= part.count("`") % 2 == 1
            find_rest = part == ";" and _open_exec(current.words)
            current = _Simple([], "a pipe" if piped else None, closing, find_rest)
    yield current


def _open_exec(words: list[str]) -> bool:
    """Whether ``words`` end inside a ``find -exec`` command (not closed by ``+``)."""
    for word in reversed(words):
        if word in _FIND_EXEC:
            return True
        if word == "+":
            return False
    return False


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
_KEYWORDS = (
    *("{", "}", "!", "if", "then", "elif", "else", "fi", "do", "done", "while", "until"),
    *("for", "in", "case", "esac", "coproc", "time", "select"),
)
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user"}),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
    "xargs": frozenset({"-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a"}),
    "parallel": frozenset(
        {"-j", "--jobs", "-I", "-n", "-N", "-L", "-d", "-E", "-S", "-a", "--arg-file"}
        | {"--sshlogin", "--delay", "--timeout", "--joblog", "--results", "--tmpdir"}
        | {"--workdir", "--colsep", "--halt", "--retries", "--memfree", "--load"}
    ),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "watch": frozenset({"-n", "--interval"}),
    "flock": frozenset({"-w", "--wait", "--timeout", "-E", "--conflict-exit-code"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "exec": frozenset({"-a"}),
    **{
        name: frozenset()
        for name in ("nohup", "command", "builtin", "busybox", "setsid", "chronic", *_KEYWORDS)
    },
}
_OPERANDS = {"flock": 1}
"""Wrappers whose command comes after this many operands (``flock FILE command``)."""
_ENV_SPLIT = re.compile(r"(?:-S|--split-string=?)(?P<script>.*)", re.DOTALL)
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_COUNT = re.compile(r"[+-]?\d+(?:\.\d+)?[smhd]?")


def _judge(simple: _Simple, depth: int) -> Upload | None:
    for word in simple.words:
        for body in _substitutions(word):
            upload = _find(body, depth + 1)
            if upload is not None:
                return upload
    upload = _judge_words(simple.words, simple.stdin, depth)
    if upload is None and simple.find_rest:
        upload = _judge_words(["find", *simple.words], simple.stdin, depth)
    if upload is None and simple.after_substitution:
        sends = _sends_a_file(simple.words)
        if sends is not None:
            upload = Upload(
                "$(...)",
                f"runs a program named by a substitution's output, which {sends.explanation}",
            )
    return upload


def _judge_words(all_words: list[str], stdin: str | None, depth: int) -> Upload | None:
    words = _without_prefixes(all_words)
    if not words:
        return None
    if any(char.isspace() for char in words[0]):
        # a command given as one word (``watch 'curl ...'``, ``flock f -c '...'``): a shell runs it
        return _nested(" ".join(words), depth)
    program, arguments = os.path.basename(words[0]), words[1:]
    if program in _SHELLS or program == "eval":
        script = _script(program, arguments)
        return None if script is None else _nested(script, depth)
    runner = _RUNNERS.get(program)
    if runner is not None:
        return _run(runner(arguments), stdin, depth)
    if _RUN_TIME_NAME.search(words[0]) and program not in ("[", "[["):
        upload = _sends_a_file(arguments)
        if upload is not None:
            return Upload(
                program,
                f"is a program named when the command runs, given arguments with which curl or "
                f"wget {upload.explanation}",
            )
    check = _check_for(program)
    return None if check is None else check(program, arguments, stdin)


def _run(runs: Iterator[str | list[str]], stdin: str | None, depth: int) -> Upload | None:
    """The first upload among the scripts and commands a runner (``find -exec``) runs."""
    for run in runs:
        upload = _nested(run, depth) if isinstance(run, str) else _nested_words(run, stdin, depth)
        if upload is not None:
            return upload
    return None


_RUN_TIME_NAME = re.compile(r"[$`*?\[]")


def _nested(script: str, depth: int) -> Upload | None:
    return _find(script, depth + 1)


def _nested_words(words: list[str], stdin: str | None, depth: int) -> Upload | None:
    if depth + 1 > _MAX_DEPTH:
        return Upload("sh", f"nests commands more than {_MAX_DEPTH} deep, too deep to check")
    return _judge_words(words, stdin, depth + 1)


def _sends_a_file(arguments: list[str]) -> Upload | None:
    """What ``arguments`` would send were they given to curl or wget (fail-closed: the program
    is not known)."""
    return _check_curl("curl", arguments, None) or _check_wget("wget", arguments, None)


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
        name = os.path.basename(word)
        wrapper = _WRAPPERS.get(name)
        if _ASSIGNMENT.match(word):
            index += 1
        elif wrapper is not None:
            index, split = _after_wrapper_options(words, index + 1, wrapper, name == "env")
            if split is not None:  # env -S 'command': the rest is one command line
                return [split, *words[index:]]
            for _ in range(_OPERANDS.get(name, 0)):
                index, _split = _after_wrapper_options(words, index + 1, wrapper, False)
        else:
            break
    return words[index:]


def _after_wrapper_options(
    words: list[str], index: int, with_value: frozenset[str], env: bool
) -> tuple[int, str | None]:
    """The index after a wrapper's options, and the string of ``env -S STRING`` if given."""
    while index < len(words):
        word = words[index]
        split = _ENV_SPLIT.fullmatch(word) if env else None
        if split is not None:
            if split.group("script"):
                return index + 1, split.group("script")
            return index + 2, words[index + 1] if index + 1 < len(words) else ""
        if word in with_value:
            index += 2
        elif (word.startswith("-") and word != "-") or _COUNT.fullmatch(word):
            index += 1
        else:
            break
    return index, None


def _script(program: str, arguments: list[str]) -> str | None:
    """The script a shell runs from its ``-c`` option, or what ``eval`` runs (None: a script
    file or the shell's input, not judged)."""
    if program == "eval":
        return " ".join(arguments)
    command = False  # -c seen: the first operand is the script
    words = iter(arguments)
    for word in words:
        if word in ("--", "-"):  # the end of the options
            return next(words, None) if command else None
        if word in ("-o", "+o", "-O", "+O"):
            next(words, None)  # a shell option's name
        elif word.startswith("--"):
            continue
        elif not word.startswith(("-", "+")):
            return word if command else None
        elif word.startswith("-") and "c" in word[1:]:
            command = True
    return None


def _command_option(arguments: list[str]) -> Iterator[str | list[str]]:
    """The command of ``su -c CMD`` / ``runuser -c CMD`` / ``script -qc CMD`` (also
    ``--command=CMD``), run by a shell; the words after ``--`` (``runuser -u USER -- CMD``)."""
    words = iter(arguments)
    for word in words:
        if word == "--":  # runuser -u USER -- COMMAND ARGS
            yield list(words)
            return
        if word.startswith("--command="):
            yield word.partition("=")[2]
        elif word in ("--command", "--session-command"):
            yield next(words, "")
        elif word.startswith("-") and not word.startswith("--") and "c" in word:
            value = word[word.index("c") + 1 :]
            yield value or next(words, "")


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find_exec(arguments: list[str]) -> Iterator[list[str]]:
    """The commands ``find ... -exec CMD ARGS ;`` (or ``+``) runs, like ``xargs`` runs its."""
    index = 0
    while index < len(arguments):
        if arguments[index] in _FIND_EXEC:
            end = index + 1
            while end < len(arguments) and arguments[end] not in (";", "+"):
                end += 1
            yield arguments[index + 1 : end]
            index = end
        index += 1


_Runner = Callable[[list[str]], Iterator[str | list[str]]]
_RUNNERS: dict[str, _Runner] = {
    "find": _find_exec,
    **dict.fromkeys(("su", "runuser", "script"), _command_option),
}


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


_NETCAT = re.compile(r"(?:nc|ncat|netcat)(?:\.[\w-]+)?")


def _check_for(program: str) -> _Check | None:
    """The check of ``program``: Debian's ``nc.openbsd``, ``netcat.traditional`` are netcat."""
    check = _CHECKS.get(program)
    if check is None and _NETCAT.fullmatch(program):
        return _check_netcat
    return check


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
