"""What ``orga worker`` becomes when it starts more than one Celery worker: a process that
starts them, stops them all when one exits or when it is told to stop, and imports nothing but
the standard library, until it forks its workers.

By default (``ORGA_WORKER_FORK``, :data:`FORK_VARIABLE`) it does not start each worker as a
new interpreter: it imports what every worker imports, freezes it (:func:`gc.freeze`), and
forks the workers from itself (:func:`fork_workers`), so that the reasoning workers
(``ORGA_REASONING_PROCESSES``), the tool worker and its pool processes share those modules'
pages instead of holding a copy each (docs/performance.md, issue 27). Each forked worker builds
its own Celery app from its own environment and reads its own model key socket, as a started
one would. The supervisor then
runs again as itself (``execve``, the same pid: the workers stay its children), told their
pids by :data:`PIDS_VARIABLE`, with the standard library only.

The CLI that builds the workers' commands has imported Typer, pydantic and the settings: about
45 MB that a process doing nothing but wait on its children would keep for its whole life. So
``orga worker`` builds the commands, then replaces itself (``execve``, the same process id, so
the signals an operator or a service manager sends still reach it) with ``python -m
orga.supervisor``, which holds about 6 MB (the standard library modules it runs: no ``typing``,
``dataclasses`` or ``subprocess`` once its workers are forked).

The commands reach it in the environment variable :data:`COMMANDS_VARIABLE`, as JSON: each
child's argv, the variables of the supervisor's environment it must not inherit, the few it
sets, and the file descriptors it inherits. No model key (nor API token, webhook or inbox
secret) is in the supervisor's environment, nor in any child's: each reasoning worker
inherits a socket holding the keys (:mod:`workers.key_handoff`), which the supervisor closes
as soon as that worker has started, before it starts the tool worker. :func:`start` and
:func:`stop` are also what the embedded runtime uses.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time

# The supervisor's own image holds what it runs and no more (issue 27): ``typing``,
# ``dataclasses`` (which imports ``inspect``, ``ast``, ``dis``...) and ``subprocess`` are
# about 2.5 MB of a process that only waits on its children. So the names used only in
# annotations are imported for the type checker alone, and ``subprocess`` where a worker is
# started (:func:`start`, :func:`stop`), not when the supervisor waits on forked workers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import NoReturn, Protocol

__all__ = [
    "COMMANDS_VARIABLE",
    "FORK_VARIABLE",
    "PIDS_VARIABLE",
    "SIGHUP_EXIT_CODE",
    "WORKER_MODULE",
    "Child",
    "Forked",
    "decode",
    "encode",
    "fork_workers",
    "main",
    "shared_custom_pool",
    "start",
    "stop",
    "supervise",
]

COMMANDS_VARIABLE = "ORGA_SUPERVISE_COMMANDS"
"""Where ``orga worker`` hands the supervisor its children (see the module's docstring)."""
FORK_VARIABLE = "ORGA_SUPERVISE_FORK"
"""Set (to ``1``) by ``orga worker`` when ``ORGA_WORKER_FORK`` is on: the supervisor forks
its workers instead of starting them (:func:`fork_workers`)."""
PIDS_VARIABLE = "ORGA_SUPERVISE_PIDS"
"""The workers a supervisor forked before it ran again as itself (``execve``): it waits on
them instead of starting its children."""
CUSTOM_POOL_VARIABLE = "CELERY_CUSTOM_WORKER_POOL"
"""Celery's ``-P custom`` pool, read when :mod:`celery.concurrency` is imported."""
WORKER_MODULE = "orga.worker_main"
"""The module of a worker command, ``[python, -m, orga.worker_main, ...]``: the only kind of
child the supervisor forks."""
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP}
SIGHUP_EXIT_CODE = 1
"""The supervisor's exit code after SIGHUP: its workers stopped (a warm shutdown), not 0, so
that a service manager restarting on failure starts ``orga worker`` again."""
POLL_S = 0.2
STOP_TIMEOUT_S = 10.0


class Child:
    """One process to start: its argv, its whole environment, and the file descriptors it
    inherits (handed over: :func:`start` closes them in this process once it started).
    Compared by value; read-only by convention (not a dataclass: see the imports)."""

    __slots__ = ("argv", "env", "pass_fds")

    def __init__(
        self, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()
    ) -> None:
        self.argv = argv
        self.env = env
        self.pass_fds = pass_fds

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Child):
            return NotImplemented
        return (self.argv, self.env, self.pass_fds) == (other.argv, other.env, other.pass_fds)

    __hash__ = None  # type: ignore[assignment]  # mutable fields, as the dataclass had

    def __repr__(self) -> str:
        env = f"<{len(self.env)} variables>"
        return f"Child(argv={self.argv!r}, env={env}, pass_fds={self.pass_fds!r})"


def encode(children: Sequence[Child], environ: Mapping[str, str]) -> str:
    """The children as the supervisor reads them, relative to ``environ`` (the environment it
    will run with): for each, its argv, the variables of ``environ`` it drops and those it sets
    or changes. A variable it sets that ``environ`` lacks is written out, so hand only
    environments derived from ``environ`` by dropping secrets, never by adding them."""
    return json.dumps(
        [
            {
                "argv": child.argv,
                "unset": sorted(k for k in environ if k not in child.env),
                "set": {k: v for k, v in child.env.items() if environ.get(k) != v},
                "fds": list(child.pass_fds),
            }
            for child in children
        ]
    )


def decode(text: str, environ: Mapping[str, str]) -> list[Child]:
    """:func:`encode`'s output back into children, their environments built from ``environ``;
    a ``ValueError`` that says what is wrong when it is not that."""
    try:
        raw = json.loads(text)
        children = []
        for item in raw:
            unset = set(item["unset"])
            env = {k: v for k, v in environ.items() if k not in unset}
            env.update({str(k): str(v) for k, v in item["set"].items()})
            env.pop(COMMANDS_VARIABLE, None)
            env.pop(FORK_VARIABLE, None)
            fds = tuple(int(fd) for fd in item.get("fds", ()))
            children.append(Child([str(a) for a in item["argv"]], env, fds))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"{COMMANDS_VARIABLE} is not a list of {{argv, unset, set}} objects ({exc}): "
            "it is written by `orga worker`; start the workers with that command"
        ) from exc
    if not children:
        raise ValueError(f"{COMMANDS_VARIABLE} names no process to start")
    return children


if TYPE_CHECKING:

    class Process(Protocol):
        """What the supervisor needs of a child: a :class:`subprocess.Popen`, or
        :class:`Forked`."""

        @property
        def returncode(self) -> int | None: ...

        def poll(self) -> int | None: ...

        def send_signal(self, sig: int) -> None: ...


class Forked:
    """A worker forked by :func:`fork_workers`: ``poll``, ``send_signal`` and ``returncode``
    as :class:`subprocess.Popen` has them (``-n`` when signal ``n`` killed it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its status unknown
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def forkable(children: Sequence[Child]) -> bool:
    """Whether every child is a worker command of this interpreter (``python -m
    orga.worker_main ...``), which :func:`fork_workers` can run in a forked process."""
    return all(c.argv[:3] == [sys.executable, "-m", WORKER_MODULE] for c in children)


def fork_workers(children: Sequence[Child]) -> list[Forked]:
    """Run each worker command of ``children`` (:func:`forkable`) in a process forked from
    this one, after importing what every worker imports (:func:`orga.worker_main.preload`)
    and freezing it (:func:`gc.freeze`, Python's recipe for ``fork`` without ``exec``): the
    workers share those modules' pages, as a prefork pool's processes share their parent's
    (issue 27: about 80 MB less measured with three workers; less with the default two). The app is
    not built here: each worker builds it from its own environment, as a started one would,
    reading its model keys from its own socket; the supervisor never reads them.

    Each forked process gets what :func:`start` would give the command: its environment
    (``os.environ``: what Python code and the processes it starts see; ``/proc/PID/environ``
    still shows the supervisor's, which holds no secret), ``sys.argv``, the default signal
    handlers, and, of the descriptors above 2, only its own ``pass_fds``. Its
    ``/proc/PID/comm`` names its queue (``orga-reasoning``, ``orga-tools``): ``ps -o comm``
    and ``top`` tell the workers apart; its command line stays the supervisor's."""
    from orga import worker_main

    # Celery reads its custom pool's name when celery.concurrency is imported: before the fork.
    pool = shared_custom_pool(children)
    if pool is not None:
        os.environ[CUSTOM_POOL_VARIABLE] = pool
    queues = [_queue(c.argv) for c in children]
    worker_main.preload(prices=any(q in (None, "orga.reasoning") for q in queues))
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    forked: list[Forked] = []
    for index, (child, queue) in enumerate(zip(children, queues, strict=True)):
        # A stop signal that arrives during the fork waits until the child has Celery's
        # handlers' defaults (or, in the supervisor, until its own handler is back).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for later in children[index:]:
                _close(later.pass_fds)
            raise
        if pid == 0:
            _run_worker(child, queue)  # raises the worker's SystemExit: never returns here
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _close(child.pass_fds)
        forked.append(Forked(pid))
    return forked


def shared_custom_pool(children: Sequence[Child]) -> str | None:
    """The one :data:`CUSTOM_POOL_VARIABLE` of ``children``'s environments (None: none sets
    it), which workers forked from one process share: Celery reads it once, when
    :mod:`celery.concurrency` is imported. Raises ``ValueError`` when they name different
    pools: ``orga worker``'s reasoning workers set their own (:data:`orga.topology.POOL_PATH`),
    so a ``CELERY_CUSTOM_WORKER_POOL`` of the operator's environment, which the tool worker
    inherits, differs."""
    pools = {c.env[CUSTOM_POOL_VARIABLE] for c in children if CUSTOM_POOL_VARIABLE in c.env}
    if len(pools) > 1:
        raise ValueError(
            f"{CUSTOM_POOL_VARIABLE} is set in orga worker's environment, and the workers it "
            f"forks from one process would name different pools ({', '.join(sorted(pools))}); "
            "Celery reads that variable once per process. orga worker's reasoning workers set "
            f"their own pool: unset {CUSTOM_POOL_VARIABLE}, or set ORGA_WORKER_FORK=false to "
            "start each worker as its own process"
        )
    return pools.pop() if pools else None


def _queue(argv: Sequence[str]) -> str | None:
    """The ``-Q`` of a worker command (None: every queue)."""
    return argv[argv.index("-Q") + 1] if "-Q" in argv[:-1] else None


def _run_worker(child: Child, queue: str | None) -> NoReturn:
    """In a forked process: become the worker ``child`` names. Its end is a ``SystemExit``
    (Celery's exit code) or an exception, which unwinds to the interpreter's top level: the
    process exits as a started worker would, its exit handlers run."""
    for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    keep = set(child.pass_fds)
    for fd in _open_fds():
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    os.environ.clear()
    os.environ.update(child.env)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(f"orga-{(queue or 'worker').removeprefix('orga.')}"[:15])
    from orga import worker_main

    args = child.argv[3:]
    sys.argv = [worker_main.__file__ or WORKER_MODULE, *args]
    raise SystemExit(worker_main.main(args))


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def start(children: Sequence[Child], output: int | None = None) -> list[subprocess.Popen[bytes]]:
    """Start ``children`` in order; ``output`` (a file descriptor) receives their stdout and
    stderr. A child's ``pass_fds`` are closed here once it has started (and all of them when a
    start fails), so that no later child, nor anything it starts, inherits them."""
    import subprocess

    stderr = subprocess.STDOUT if output is not None else None
    started = []
    try:
        for child in children:
            process = subprocess.Popen(
                child.argv, env=child.env, stdout=output, stderr=stderr, pass_fds=child.pass_fds
            )
            _close(child.pass_fds)
            started.append(process)
    except BaseException:
        for child in children[len(started) :]:
            _close(child.pass_fds)
        raise
    return started


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def stop(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (Celery's warm shutdown) each process, SIGKILL those still alive after
    ``timeout_s``."""
    import subprocess

    _send(processes, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def supervise(children: Sequence[Child], running: Sequence[Process] | None = None) -> int:
    """Run ``children`` until one exits or this process is told to stop, then stop the others.
    They are started (:func:`start`), unless ``running`` already are they (forked by
    :func:`fork_workers`, maybe before an ``execve`` of this process that kept the stop
    signals blocked: they are unblocked once the handlers are set).

    Stopping is Celery's: SIGTERM to each (a warm shutdown: the calls they run finish), then
    wait for all of them with no deadline of its own, so that a long model call is not killed
    and paid for twice; the service manager's stop timeout (systemd's ``TimeoutStopSec``,
    compose's ``stop_grace_period``) bounds the wait. A second SIGTERM or SIGINT sends SIGQUIT,
    the cold shutdown, which stops each worker at once (a thread-pool tool worker's running
    calls are cancelled by :mod:`orga.celery`'s own handler, as Celery's kills a prefork
    worker's pool processes; a SIGHUP once the stop has begun changes nothing); a SIGQUIT is
    passed on as it is, at once (and then every later stop signal but SIGHUP). SIGHUP is a warm
    shutdown too, said on stderr, with exit code :data:`SIGHUP_EXIT_CODE`: the workers do not
    restart in place (their sockets are read and closed), the service manager starts ``orga
    worker`` again. The exit code is otherwise the first child to exit's (1 when it was 0: a
    worker is not meant to end on its own; ``128 + n`` when signal ``n`` killed it), 0 when told
    to stop."""
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    processes: Sequence[Process] = start(children) if running is None else running
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    code = 0
    while not signals:
        polled = [(c, p.poll()) for c, p in zip(children, processes, strict=True)]
        exited = [(c, returncode) for c, returncode in polled if returncode is not None]
        if exited:
            child, returncode = exited[0]
            code = exit_code(returncode)
            print(
                f"orga worker: {' '.join(child.argv[1:])} exited with code "
                f"{returncode}; stopping the others",
                file=sys.stderr,
                flush=True,
            )
            break
        time.sleep(POLL_S)
    if signals and signals[0] == signal.SIGHUP:
        print(
            "orga worker: SIGHUP: warm shutdown of every worker, exit code "
            f"{SIGHUP_EXIT_CODE} (a worker does not restart in place: its connection URLs and "
            "model keys were read once from sockets that are closed now; the service manager "
            "starts orga worker again)",
            file=sys.stderr,
            flush=True,
        )
        code = SIGHUP_EXIT_CODE
    told = len(signals)
    _send(processes, signal.SIGQUIT if signal.SIGQUIT in signals else signal.SIGTERM)
    while any(p.poll() is None for p in processes):
        later, told = signals[told:], len(signals)
        # Only a later SIGTERM, SIGINT or SIGQUIT hurries the stop: a SIGHUP once it has begun
        # (systemd's SendSIGHUP=yes, a terminal closed after Ctrl-C) changes nothing.
        if any(s != signal.SIGHUP for s in later):
            _send(processes, signal.SIGQUIT)
        time.sleep(POLL_S)
    return code


def exit_code(returncode: int) -> int:
    """The supervisor's exit code for a child's: 1 for 0, ``128 + n`` for signal ``n``."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1


def _send(processes: Sequence[Process], signum: int) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signum)


def _fork_refusal(children: Sequence[Child]) -> str | None:
    """Why ``children`` cannot be forked from this process (None: they can)."""
    if not forkable(children):
        return (
            f"{FORK_VARIABLE}=1 but not every command is `python -m {WORKER_MODULE}` of this "
            "interpreter: it is set by `orga worker`, run that instead"
        )
    try:
        shared_custom_pool(children)
    except ValueError as exc:
        return str(exc)
    return None


def main() -> int:
    """Supervise the children named in :data:`COMMANDS_VARIABLE`."""
    text = os.environ.get(COMMANDS_VARIABLE)
    if text is None:
        print(
            f"error: {COMMANDS_VARIABLE} is not set: this process is started by `orga worker`, "
            "run that instead",
            file=sys.stderr,
        )
        return 2
    try:
        children = decode(text, os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    environ = {k: v for k, v in os.environ.items() if k not in (FORK_VARIABLE, PIDS_VARIABLE)}
    os.environ.pop(COMMANDS_VARIABLE, None)
    fork = os.environ.pop(FORK_VARIABLE, "") == "1"
    pids = os.environ.pop(PIDS_VARIABLE, None)
    if pids is not None:  # this process forked them, then ran again as itself: see below
        return supervise(children, [Forked(int(pid)) for pid in json.loads(pids)])
    if not fork:
        return supervise(children)
    refusal = _fork_refusal(children)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    # Fork the workers, then run again as this module (execve: the same pid, so they stay its
    # children and the signals sent to it still reach it) without their modules: the pages
    # the workers have since copied are dropped from this process, which is back to the
    # standard library only. Stop signals stay blocked until the new image handles them.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    forked = fork_workers(children)
    environ[PIDS_VARIABLE] = json.dumps([process.pid for process in forked])
    try:
        os.execve(sys.executable, [sys.executable, "-m", "orga.supervisor"], environ)  # noqa: S606
    except OSError as exc:
        print(f"orga worker: the supervisor could not run again ({exc}); it keeps the "
              "workers' modules", file=sys.stderr, flush=True)  # fmt: skip
    return supervise(children, forked)


if __name__ == "__main__":
    sys.exit(main())
