"""The ``orga`` command line.

Without ``ORGA_REDIS_URL`` every command that needs the runtime uses the embedded default (a
private Redis in ``ORGA_HOME``, a worker subprocess and an in-process coordinator); with it,
commands talk to that Redis and expect ``orga coordinator`` and ``orga worker`` to be running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from coordinator.client import (
    OrgaClient,
    TaskFinishedError,
    TaskNotFoundError,
    TaskRejectedError,
)
from coordinator.state import TERMINAL_STATUSES, TaskStatus
from orga.cli_agents import agents_app
from orga.cli_schedules import schedule_app
from orga.cli_tokens import TokenPrinter
from orga.embedded import (
    EmbeddedRuntime,
    EmbeddedRuntimeError,
)
from orga.redis_client import RedisClients
from orga.topology import Role, supervisor_exec, worker_commands
from shared import aio
from shared.errors import OrgaError
from shared.events import JournalEntry
from shared.pricing import format_usd
from shared.settings import OrgaSettings, TelemetrySettings
from shared.task_spec import TaskSpec, TaskSpecError, load_task_file, task_json_schema
from shared.tokens import TokenEntry
from workers import key_handoff
from workers.telemetry import configure_tracing

__all__ = ["app", "main"]

# Plain help (rich_markup_mode=None): typer's rich panels show every flag as taking a <bool>.
app = typer.Typer(
    name="orga",
    help="Run long-running LLM agents on Celery workers.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
review_app = typer.Typer(
    help="Escalations waiting for a human decision.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(review_app, name="review")
app.add_typer(agents_app, name="agents")
app.add_typer(schedule_app, name="schedule")
out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output for pipelines.")]
TaskId = Annotated[str, typer.Argument(metavar="TASK_ID", help="A task id.")]
ReviewId = Annotated[str, typer.Argument(metavar="REVIEW_ID", help="A review id.")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"orga {version('orga-queue')}")
        raise typer.Exit


@app.callback()
def _main(
    _version_flag: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Run long-running LLM agents on Celery workers."""


def _say(*parts: str | tuple[str, str], console: Console = out) -> None:
    """Print text literally (user and model text is never Rich markup), unwrapped.

    A part is a string, or ``(text, style)`` for a styled piece.
    """
    console.print(Text.assemble(*parts), soft_wrap=True)


def _fail(prefix: str, message: object, code: int) -> typer.Exit:
    _say((prefix, "red"), " ", str(message), console=err)
    return typer.Exit(code)


def _settings() -> OrgaSettings:
    """The settings, with the secrets this command handed itself before it ran again without
    them in its environment (:func:`_hand_off_model_keys`)."""
    return OrgaSettings(**_handed_secrets())


_HANDED_SECRETS: dict[str, Any] | None = None


def _handed_secrets() -> dict[str, Any]:
    """The :data:`~workers.key_handoff.PROCESS_SECRET_VARIABLES` this command wrote into the
    socket :data:`~workers.key_handoff.SECRETS_FD_VARIABLE` names, as settings fields; read
    once, at the process edge, and the socket closed (before any worker starts)."""
    global _HANDED_SECRETS  # noqa: PLW0603 - read once per process, like the environment
    if _HANDED_SECRETS is None:
        text = os.environ.pop(key_handoff.SECRETS_FD_VARIABLE, "").strip()
        secrets = key_handoff.receive(int(text), key_handoff.SECRETS_FD_VARIABLE) if text else {}
        fields: dict[str, Any] = {}
        for name, value in secrets.items():
            field = name.removeprefix("ORGA_").lower()
            fields[field] = _json_or_text(value) if field == "webhooks" else value
        _HANDED_SECRETS = fields
    return _HANDED_SECRETS


def _json_or_text(value: str) -> Any:
    """``value`` parsed as JSON (as the settings parse a list from the environment); the
    text itself when it is not JSON, for the settings to refuse with their own message."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _deployment(settings: OrgaSettings) -> OrgaClient:
    """A client of the deployment at ORGA_REDIS_URL (a Redis Cluster on ORGA_REDIS_CLUSTER)."""
    clients = RedisClients.from_settings(settings)
    return OrgaClient(
        clients.url,
        partitions=settings.partitions,
        client=clients.sync(decode_responses=True),
    )


def _home() -> Path:
    return Path(os.environ.get("ORGA_HOME", ".orga")).resolve()


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except (TaskSpecError, TaskRejectedError) as exc:
        raise _fail("invalid task:", exc, 2) from exc
    except (TaskNotFoundError, EmbeddedRuntimeError, OrgaError) as exc:
        raise _fail("error:", exc, 1) from exc


def _with_runtime(body: Callable[[OrgaClient, bool], Any]) -> Any:
    """Run ``body(client, embedded)`` against ORGA_REDIS_URL, or inside the embedded runtime."""
    settings = _settings()
    if settings.redis_url:
        return body(_deployment(settings), False)

    key_fds = _hand_off_model_keys(settings)
    # The coordinator runs in this process: its spans go to stderr, stdout is the result's.
    configure_tracing(TelemetrySettings(), "orga-coordinator", out=sys.stderr)

    async def embedded() -> Any:
        _STOP.on_signals(asyncio.get_running_loop())
        async with EmbeddedRuntime(settings, _home(), key_fds=key_fds) as runtime:
            client = OrgaClient(runtime.url, partitions=settings.partitions)
            return await asyncio.to_thread(body, client, True)

    return aio.run(embedded())


class _StopRequest:
    """SIGINT or SIGTERM received by a command that holds the embedded runtime: it is not
    killed, it stops what it follows (:func:`_follow` raises :class:`_Unfinished`) and then
    runs its normal shutdown, which stops its workers and its Redis."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._event = threading.Event()

    def on_signals(
        self, loop: asyncio.AbstractEventLoop, interrupt: asyncio.Task[Any] | None = None
    ) -> None:
        """Handle SIGINT and SIGTERM on ``loop`` (the main thread's) from now on; with
        ``interrupt``, a signal also cancels that task (for a body that does not poll)."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.request, signum, interrupt)

    def request(self, signum: int, interrupt: asyncio.Task[Any] | None = None) -> None:
        """Ask the command to stop (the first signal counts)."""
        if self.signum is None:
            self.signum = signum
        self._event.set()
        if interrupt is not None:
            interrupt.cancel()

    @property
    def requested(self) -> bool:
        """Whether a stop signal came."""
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless a stop is requested meanwhile; whether one was."""
        return self._event.wait(seconds)


_STOP = _StopRequest()
"""The process's stop request (one command per process)."""


class _Unfinished(Exception):  # noqa: N818 - a control signal, not an error
    """The followed task had not ended when the command had to stop: at its ``--timeout``
    (exit code :data:`TIMEOUT_EXIT_CODE`) or on a signal (``128 + N``)."""

    def __init__(self, task_id: str, why: str, code: int) -> None:
        super().__init__(f"task {task_id} {why}")
        self.task_id = task_id
        self.why = why
        self.code = code


TIMEOUT_EXIT_CODE = 4
"""`orga run` whose task did not end within ``--timeout``."""
CANCEL_WAIT_S = 30.0
"""How long a cancelling command waits for the coordinator to abort the task."""


def _hand_off_model_keys(settings: OrgaSettings) -> list[int] | None:
    """Before this command starts the embedded runtime's workers, of which it is then an
    ancestor: keep its model keys, the serving side's secrets (API tokens, webhooks, the
    inbox's credentials) and ``ORGA_BROKER_URL`` out of its ``/proc/PID/environ`` (which
    ``os.environ.pop`` does not change). When the environment holds any, the keys go into one
    socket per reasoning worker, the other secrets into one socket for this command itself, and
    the command runs again in the same process (``execve``) without them; it returns the key
    sockets, for :class:`EmbeddedRuntime` to hand over (:func:`_settings` reads the secrets
    back)."""
    keys = key_handoff.model_keys(os.environ)
    # ORGA_BROKER_URL (on the embedded runtime ORGA_REDIS_URL is unset) rides with the
    # serving side's secrets: the workers get it from EmbeddedRuntime, through their own socket.
    secrets = key_handoff.process_secrets(os.environ) | key_handoff.connection_urls(os.environ)
    if keys or secrets:
        env = key_handoff.without_keys(os.environ)
        if keys:
            fds = [key_handoff.send(keys) for _ in range(settings.reasoning_processes)]
            env[key_handoff.KEYS_FD_VARIABLE] = ",".join(str(fd) for fd in fds)
        elif key_handoff.KEYS_FD_VARIABLE in os.environ:
            env[key_handoff.KEYS_FD_VARIABLE] = os.environ[key_handoff.KEYS_FD_VARIABLE]
        if secrets:
            env[key_handoff.SECRETS_FD_VARIABLE] = str(key_handoff.send(secrets))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)  # noqa: S606 - this same command
    return key_handoff.fds(os.environ) or None


# -- run / submit ---------------------------------------------------------------------------


@app.command()
def run(
    task_file: Annotated[Path, typer.Argument(metavar="TASK_FILE", help="A YAML or JSON task.")],
    as_json: JsonFlag = False,
    timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="How long to wait for the result; then exit 4. On the embedded runtime the "
            "task is then cancelled; on a deployment it runs on (`orga cancel ID` stops it).",
        ),
    ] = 3600.0,
) -> None:
    """Submit a task, show its progress, print its result (SIGINT or SIGTERM on the embedded
    runtime: the task is cancelled, the runtime stopped, exit 128 + N)."""
    with _errors():
        spec = load_task_file(task_file)
        result = _with_runtime(
            lambda client, embedded: _run(client, spec, as_json, timeout, embedded)
        )
    _exit_for(result)


def _run(
    client: OrgaClient, spec: TaskSpec, as_json: bool, timeout: float, embedded: bool
) -> dict[str, Any]:
    task_id = client.submit(spec)
    if not as_json:
        _say(("task", "bold"), f" {task_id}: {spec.goal}")
    try:
        record_status = _follow(client, task_id, timeout, quiet=as_json)
    except _Unfinished as unfinished:
        return _left_unfinished(client, unfinished, as_json, embedded)
    result = client.result(task_id)
    if record_status == TaskStatus.AWAITING_REVIEW.value:
        result["review"] = client.status(task_id).get("review_id")
    if as_json:
        out.print_json(json.dumps(result))
    else:
        _print_result(client, result, embedded)
    return result


def _left_unfinished(
    client: OrgaClient, unfinished: _Unfinished, as_json: bool, embedded: bool
) -> dict[str, Any]:
    """The task of an `orga run` that stops first. On the embedded runtime it is cancelled
    (aborted, its milestones kept): left running, it would resume inside the next `orga`
    command on this ORGA_HOME, with that command's model key. On a deployment it runs on,
    and the command to stop it is printed."""
    task_id = unfinished.task_id
    if embedded:
        status = _cancel_and_wait(client, task_id, f"orga run stopped: {unfinished.why}")
        note = f"{unfinished}: cancelled it ({status}; its milestones are kept)"
    else:
        status = str(client.status(task_id)["status"])
        note = f"{unfinished}; it is still {status} on the deployment"
    result = {**client.result(task_id), "unfinished": unfinished.why, "exit_code": unfinished.code}
    if as_json:
        out.print_json(json.dumps(result))
        return result
    _say((note, "yellow"), console=err)
    if not embedded and status not in {s.value for s in TERMINAL_STATUSES}:
        _say("stop it with:", console=err)
        _say("  ", _command_line(["cancel", task_id], embedded=False), console=err)
        _say("(with ORGA_REDIS_URL set as for this command)", console=err)
    return result


def _cancel_and_wait(client: OrgaClient, task_id: str, reason: str) -> str:
    """Cancel the task and wait (at most CANCEL_WAIT_S) until it ended: its status."""
    with contextlib.suppress(TaskFinishedError):
        client.cancel(task_id, reason)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while True:
        status = str(client.status(task_id)["status"])
        if status in {s.value for s in TERMINAL_STATUSES}:
            return status
        if time.monotonic() > deadline:
            raise OrgaError(
                f"task {task_id} was asked to cancel but is still {status} after "
                f"{CANCEL_WAIT_S:g}s; run the same command again"
            )
        time.sleep(0.1)


def _follow(client: OrgaClient, task_id: str, timeout: float, quiet: bool) -> str:
    """Show steps and iterations until the task ends or waits for a human; raise
    :class:`_Unfinished` at ``timeout`` or when the command is told to stop."""
    deadline = time.monotonic() + timeout
    columns = (TextColumn("{task.description}", markup=False), BarColumn(),
               TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=out, disable=quiet, transient=False) as progress:
        bar = progress.add_task("waiting", total=None, detail="")
        raw = None if out.is_terminal else sys.stdout  # a pipe or a file: piece by piece
        tokens = None if quiet else TokenPrinter(progress.console, raw)
        while time.monotonic() < deadline:
            if _STOP.requested:
                signum = _STOP.signum or signal.SIGTERM
                name = signal.Signals(signum).name
                raise _Unfinished(task_id, f"was interrupted ({name})", 128 + signum)
            try:
                status = client.status(task_id)
            except TaskNotFoundError:
                _STOP.wait(0.05)
                continue
            if tokens is not None:
                tokens.show(client.tokens(task_id, tokens.after))
            progress.update(
                bar,
                description=_progress_label(status),
                total=max(status["steps_total"], 1),
                completed=status["steps_done"],
                detail=_progress_detail(status),
            )
            if status["status"] in {s.value for s in TERMINAL_STATUSES}:
                return str(status["status"])
            if status["status"] == "awaiting_review" and not _runs_beside_held(client, task_id):
                return str(status["status"])
            _STOP.wait(0.1)
    raise _Unfinished(task_id, f"did not finish within {timeout:g}s", TIMEOUT_EXIT_CODE)


def _runs_beside_held(client: OrgaClient, task_id: str) -> bool:
    """Calls of the turn still run beside its held calls: followed until they answered, so the
    embedded runtime is not stopped under them when the command returns for the review."""
    awaiting = client.record(task_id).awaiting
    return awaiting is not None and bool(awaiting.held) and bool(awaiting.in_flight())


def _progress_detail(status: dict[str, Any]) -> str:
    """``iteration 3  running``, and what it waits on when that is its provider or policy
    engine (an outage, a retry wait)."""
    detail = f"iteration {status['iteration']}  {status['status']}"
    waiting = (status.get("dispatch") or {}).get("waiting")
    return f"{detail}  {waiting}" if waiting else detail


def _progress_label(status: dict[str, Any]) -> str:
    step = status["step"] or "-"
    return f"step {step} ({status['steps_done']}/{status['steps_total']})"


def _print_result(client: OrgaClient, result: dict[str, Any], embedded: bool) -> None:
    table = Table(title=Text(f"task {result['task_id']}: {result['status']}"))
    for column in ("step", "status", "verified", "iterations", "note"):
        table.add_column(column)
    for step in result["steps"]:
        cells = (step["id"], step["status"], "yes" if step["verified"] else "no",
                 str(step["iterations"]), (step["note"] or "")[:80])  # fmt: skip
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)
    _say(f"milestones: {', '.join(result['milestones']) or 'none'}")
    _say(usage_line(result))
    if result.get("output"):
        _say(f"output: {result['output']}")
    if result.get("error"):
        _say((str(result["error"]), "yellow"))
    review_id = result.get("review")
    if review_id:
        _print_decide_commands(client, review_id, embedded)


def usage_line(result: dict[str, Any]) -> str:
    """``usage: 1234 tokens (1000 prompt, 234 completion), cost $0.0123 of $0.5000``."""
    usage = result.get("usage") or {}
    limit = result.get("max_cost_usd")
    cost = format_usd(float(usage.get("cost_usd", 0.0)))
    of = f" of {format_usd(float(limit))}" if limit is not None else ""
    return (
        f"usage: {usage.get('total_tokens', 0)} tokens ({usage.get('prompt_tokens', 0)} prompt, "
        f"{usage.get('completion_tokens', 0)} completion), cost {cost}{of}"
    )


def _print_decide_commands(client: OrgaClient, review_id: str, embedded: bool) -> None:
    """How to decide the review: whole commands that run as printed, pasted in any shell."""
    review = client.review(review_id)
    _say(("escalated to human review", "bold yellow"), f" ({review.source}): {review.reason}")
    choices = [["--retry", "--hint", "what to try instead"], ["--skip"], ["--abort"]]
    if "critic" in review.snapshot:  # a step's result: its critic's decisions first
        choices = [["--approve"], ["--revise", "what to change"], *choices]
    if review.call is not None:  # one held tool call
        _say("held call: ", (f"{review.call.name} {review.call.arguments}", "bold"))
        choices = [["--approve"], ["--edit", "--args", review.call.arguments],
                   ["--reject", "why, for the model"], ["--abort"]]  # fmt: skip
    _say("decide it with one of:")
    for flags in choices:
        _say("  ", _command_line(["review", "decide", review_id, *flags], embedded))
    _say("see the context first with:")
    _say("  ", _command_line(["review", "show", review_id], embedded))
    if not embedded:
        _say("(with ORGA_REDIS_URL set as for this command)")


def _command_line(arguments: list[str], embedded: bool) -> str:
    """A shell command running this same ``orga`` with ``arguments``: the executable by its
    absolute path and, for the embedded runtime, the home and workspace root it used."""
    words = _orga_executable() + arguments
    env = _embedded_env() if embedded else {}
    if env:
        words = ["env", *(f"{name}={value}" for name, value in env.items()), *words]
    return shlex.join(words)


def _orga_executable() -> list[str]:
    """The words that start the running ``orga`` from anywhere, without an active venv."""
    invoked = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if invoked is not None and invoked.suffix != ".py" and os.access(invoked, os.X_OK):
        return [os.path.abspath(invoked)]
    beside = shutil.which("orga", path=str(Path(sys.executable).parent))
    if beside:
        return [os.path.abspath(beside)]
    return [os.path.abspath(sys.executable), "-m", "orga.cli"]


def _embedded_env() -> dict[str, str]:
    """What a later embedded command needs to find this one's state and workspaces."""
    env = {"ORGA_HOME": str(_home())}
    root = os.environ.get("ORGA_WORKSPACE_ROOT")
    if root:
        env["ORGA_WORKSPACE_ROOT"] = os.path.abspath(os.path.expanduser(root))
    partitions = os.environ.get("ORGA_PARTITIONS")
    if partitions:  # the state was created with it: a command with another count is refused
        env["ORGA_PARTITIONS"] = partitions
    return env


def _exit_for(result: dict[str, Any]) -> None:
    if result.get("exit_code"):
        raise typer.Exit(int(result["exit_code"]))
    if result.get("review"):
        raise typer.Exit(3)
    if result["status"] != TaskStatus.COMPLETED.value:
        raise typer.Exit(1)


@app.command()
def submit(
    task_file: Annotated[Path, typer.Argument(metavar="TASK_FILE", help="A YAML or JSON task.")],
    as_json: JsonFlag = False,
) -> None:
    """Submit a task to ORGA_REDIS_URL and print its id (needs a running coordinator)."""
    with _errors():
        spec = load_task_file(task_file)
        _require_url()
        client = _deployment(_settings())
        task_id = client.submit(spec)
    out.print_json(json.dumps({"task_id": task_id})) if as_json else _say(task_id)


def _require_url() -> str:
    url = _settings().redis_url
    if not url:
        needs = "this command needs a running deployment; `orga run` works without one"
        raise _fail("error:", f"set ORGA_REDIS_URL ({needs})", 2)
    return url


# -- reading --------------------------------------------------------------------------------


@app.command()
def status(
    task_id: Annotated[
        str | None, typer.Argument(metavar="TASK_ID", help="A task id; none: the recent tasks.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """One task's status, or the most recent tasks."""
    timeout_s = _settings().heartbeat_timeout_s
    with _errors():
        if task_id:
            data = _read(lambda client: client.status(task_id))
        else:
            data, load = _read(lambda client: (client.list_tasks(), client.load(timeout_s)))
    if as_json or task_id:
        out.print_json(json.dumps(data))
        return
    table = Table("task", "status", "waits on")
    for row in data:
        table.add_row(Text(row["task_id"]), Text(row["status"] or "?"), Text(_waits_on(row)))
    out.print(table)
    queued = ", ".join(f"{queue} {n}" for queue, n in _on_the_broker(load["queued"]).items())
    _say(f"queued: {queued}; running: {load['running']}")
    _say(f"partitions: {_holders(load['partitions'])}")


def _on_the_broker(queued: dict[str, int]) -> dict[str, Any]:
    """The queues' depths: read from the broker when it is not the state Redis (RabbitMQ),
    whose lists are empty then; the broker unreachable is said so."""
    from coordinator.relay import CeleryPublisher

    settings = _settings()
    if settings.broker_url in (None, settings.redis_url):
        return queued
    publisher = CeleryPublisher.from_settings(settings)
    try:
        depths = publisher.queue_depths(list(queued))
    except Exception as exc:
        return dict.fromkeys(queued, f"? (broker unreachable: {type(exc).__name__})")
    finally:
        publisher.close()
    return dict(depths) if depths is not None else queued


def _holders(partitions: dict[str, Any]) -> str:
    """``c1 8 (0-7), c2 8 (8-15)``: each coordinator's partition leases; the unheld ones."""
    held = [f"{name} {len(ps)} ({_ranges(ps)})" for name, ps in partitions["held"].items()]
    if partitions["unheld"]:
        held.append(f"unheld {len(partitions['unheld'])} ({_ranges(partitions['unheld'])})")
    return ", ".join(held) or "none"


def _ranges(numbers: list[int]) -> str:
    """``0-3,7,9-10`` for [0, 1, 2, 3, 7, 9, 10]."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _waits_on(row: dict[str, Any]) -> str:
    """``reason: 1 running`` for a task waiting on a model call (``act``: its tool calls);
    ``reason: waiting on the provider openai (HTTP 503; retry at ...)`` for one held by an
    outage."""
    dispatch = row.get("dispatch")
    if not dispatch:
        return ""
    if dispatch.get("waiting"):
        return f"{dispatch['kind']}: {dispatch['waiting']}"
    parts = [f"{dispatch[k]} {k}" for k in ("queued", "running", "answered") if dispatch[k]]
    return f"{dispatch['kind']}: {', '.join(parts) or 'nothing yet'}"


def _read(body: Callable[[OrgaClient], Any]) -> Any:
    """A read-only command: against ORGA_REDIS_URL, or the embedded Redis without a worker."""
    settings = _settings()
    if settings.redis_url:
        return body(_deployment(settings))

    async def embedded() -> Any:
        _STOP.on_signals(asyncio.get_running_loop(), interrupt=asyncio.current_task())
        async with EmbeddedRuntime(settings, _home(), start_worker=False) as runtime:
            client = OrgaClient(runtime.url, partitions=settings.partitions)
            return await asyncio.to_thread(body, client)

    try:
        return aio.run(embedded())
    except asyncio.CancelledError:
        if _STOP.signum is None:
            raise
        raise typer.Exit(128 + _STOP.signum) from None  # the runtime was stopped first


@app.command()
def result(task_id: TaskId, as_json: JsonFlag = False) -> None:
    """The result of a task (a stopped task keeps its completed steps)."""
    with _errors():
        data = _read(lambda client: client.result(task_id))
    out.print_json(json.dumps(data)) if as_json else out.print_json(json.dumps(data, indent=2))


@app.command()
def journal(
    task_id: TaskId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new entries.")
    ] = False,
    tokens: Annotated[
        bool,
        typer.Option(
            help="With --follow, also print the model's answers as they stream, one "
            '{"tokens": {...}} line per piece (docs/protocol.md, the tokens stream).'
        ),
    ] = True,
) -> None:
    """A task's journal, one JSON entry per line."""

    def body(client: OrgaClient) -> None:
        entries: Iterator[JournalEntry | TokenEntry] = iter(client.journal(task_id))
        if follow:
            follows = client.follow_with_tokens if tokens else client.follow_journal
            entries = follows(task_id)
        for entry in entries:
            if isinstance(entry, TokenEntry):
                sys.stdout.write(json.dumps({"tokens": entry.as_json()}) + "\n")
            else:
                sys.stdout.write(entry.model_dump_json() + "\n")
            sys.stdout.flush()

    with _errors():
        _read(body)


# -- reviews --------------------------------------------------------------------------------


@review_app.command("list")
def review_list(as_json: JsonFlag = False) -> None:
    """Escalations waiting for a decision."""
    with _errors():
        items = _read(lambda client: client.reviews())
    if as_json:
        out.print_json(json.dumps([i.model_dump() for i in items]))
        return
    table = Table("review", "task", "step", "source", "reason", "default at deadline")
    for item in items:
        at = time.strftime("%H:%M:%S", time.localtime(item.deadline))
        cells = (item.review_id, item.task_id, item.step_id, item.source, item.reason[:70],
                 f"{item.default_decision} at {at}")  # fmt: skip
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)


@review_app.command("show")
def review_show(review_id: ReviewId) -> None:
    """One escalation with its context snapshot."""
    with _errors():
        item = _read(lambda client: client.review(review_id))
    out.print_json(item.model_dump_json())


@review_app.command("decide")
def review_decide(
    review_id: ReviewId,
    retry: Annotated[bool, typer.Option("--retry", help="Resume the step.")] = False,
    skip: Annotated[bool, typer.Option("--skip", help="Skip the step.")] = False,
    abort: Annotated[
        bool, typer.Option("--abort", help="Abort the task, keeping milestones.")
    ] = False,
    approve: Annotated[
        bool, typer.Option("--approve", help="A step's result (critic review): accept it.")
    ] = False,
    revise: Annotated[
        str | None,
        typer.Option(
            metavar="REASON",
            help="A step's result (critic review): send it back to the worker with REASON.",
        ),
    ] = None,
    hint: Annotated[
        str | None, typer.Option(metavar="TEXT", help="With --retry: a hint the model will read.")
    ] = None,
    edit: Annotated[
        bool,
        typer.Option(
            "--edit",
            help="A held tool call: run it with the arguments of --args JSON or --args-file.",
        ),
    ] = False,
    args: Annotated[
        str | None,
        typer.Option(
            "--args", metavar="JSON", help="With --edit: the call's new arguments, a JSON object."
        ),
    ] = None,
    args_file: Annotated[
        Path | None,
        typer.Option(
            "--args-file", metavar="FILE", help="With --edit: read the new arguments from FILE."
        ),
    ] = None,
    reject: Annotated[
        str | None,
        typer.Option(
            metavar="MESSAGE",
            help="A held tool call: do not run it; the model reads MESSAGE as its result.",
        ),
    ] = None,
    as_json: JsonFlag = False,
    timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="On the embedded runtime, how long to follow the task after the decision; "
            "then it is cancelled and the command exits 4, as `orga run --timeout` does.",
        ),
    ] = 3600.0,
) -> None:
    """Decide an escalation: --retry [--hint TEXT], --skip or --abort; a step's result (a
    critic review): --approve or --revise REASON; a held tool call: --approve, --edit --args
    JSON (or --args-file FILE), --reject MESSAGE or --abort."""
    flags = (("retry", retry), ("skip", skip), ("abort", abort), ("approve", approve),
             ("revise", revise is not None), ("edit", edit),
             ("reject", reject is not None))  # fmt: skip
    chosen = [name for name, flag in flags if flag]
    if len(chosen) != 1:
        raise _fail(
            "error:",
            "choose exactly one of --retry, --skip, --abort, --approve, --revise, --edit, --reject",
            2,
        )
    if hint and chosen[0] != "retry":
        raise _fail("error:", "--hint goes with --retry", 2)
    if revise is not None and not revise.strip():
        raise _fail("error:", "--revise needs a reason: what the worker must change", 2)
    decision = chosen[0]
    arguments = _edited_arguments(decision, args, args_file)
    if decision == "revise":
        hint = revise
    if decision == "reject":
        hint = reject

    def body(client: OrgaClient, embedded: bool) -> dict[str, Any]:
        task_id = client.decide(
            review_id,
            decision,
            hint=hint,
            by=os.environ.get("USER", "cli"),
            arguments=arguments,
        )
        if not as_json:
            _say(f"decision {decision} applied to task {task_id}")
        if embedded:
            return _follow_decided(client, task_id, as_json, timeout)
        data = {"task_id": task_id, "decision": decision, **client.status(task_id)}
        if as_json:
            out.print_json(json.dumps(data))
        else:
            _say(f"task {task_id} is now {data['status']}")
        return data

    with _errors():
        data = _with_runtime(body)
    _exit_after_decision(decision, data)


def _edited_arguments(
    decision: str, args: str | None, args_file: Path | None
) -> dict[str, Any] | None:
    """The ``--edit`` arguments from ``--args`` or ``--args-file`` (exit 2 naming the problem)."""
    if decision != "edit":
        if args is not None or args_file is not None:
            raise _fail("error:", "--args and --args-file go with --edit", 2)
        return None
    if (args is None) == (args_file is None):
        raise _fail("error:", "--edit needs the new arguments: --args JSON or --args-file FILE", 2)
    where = "--args" if args is not None else f"--args-file {args_file}"
    try:
        text = args if args is not None else Path(str(args_file)).read_text(encoding="utf-8")
        value = json.loads(text)
    except OSError as exc:
        raise _fail("error:", f"{where} cannot be read: {exc}", 2) from exc
    except ValueError as exc:
        raise _fail("error:", f"{where} is not JSON ({exc}); write an object, e.g. "
                    '\'{"command": "git push origin feature"}\'', 2) from exc  # fmt: skip
    if not isinstance(value, dict):
        raise _fail("error:", f"{where} must be a JSON object, got {type(value).__name__}", 2)
    return value


def _follow_decided(
    client: OrgaClient, task_id: str, as_json: bool, timeout: float
) -> dict[str, Any]:
    """The embedded runtime runs the task on from the decision: follow it for ``timeout``
    seconds, print its result (a command told to stop, or out of time, cancels it first, as
    `orga run` does)."""
    try:
        final = _follow(client, task_id, timeout, quiet=as_json)
    except _Unfinished as unfinished:
        return _left_unfinished(client, unfinished, as_json, embedded=True)
    data = client.result(task_id)
    if final == TaskStatus.AWAITING_REVIEW.value:
        data["review"] = client.status(task_id).get("review_id")
    if as_json:
        out.print_json(json.dumps(data))
    else:
        _print_result(client, data, embedded=True)
    return data


def _exit_after_decision(decision: str, data: dict[str, Any]) -> None:
    """0 when the task completed, runs on, or was aborted as decided; 1 when it failed (or
    ended aborted after another decision); 3 when it waits for a human again; ``128 + N``
    when signal N stopped the command (the task cancelled)."""
    if data.get("exit_code"):
        raise typer.Exit(int(data["exit_code"]))
    status = data.get("status")
    if data.get("review") or status == TaskStatus.AWAITING_REVIEW.value:
        raise typer.Exit(3)
    if status == TaskStatus.FAILED.value:
        raise typer.Exit(1)
    if status == TaskStatus.ABORTED.value and decision != "abort":
        raise typer.Exit(1)


# -- processes ------------------------------------------------------------------------------


def _same_dir(entry: str, directory: Path) -> bool:
    """Whether the ``sys.path`` entry ``entry`` names ``directory`` ("" is no directory)."""
    try:
        return bool(entry) and Path(entry).resolve() == directory
    except OSError:
        return False


@app.command()
def coordinator() -> None:
    """Run a coordinator against ORGA_REDIS_URL (several may run at once)."""
    _require_url()
    _settings()  # invalid settings are refused here, in the command line's words
    # The same process runs `python -m orga.coordinator_main` (execve, the same pid): the
    # coordinator without this command line's imports (Typer, Rich, httpx: about 6 MB).
    # -P: not the working directory first on sys.path (as `python -m` would put it), which
    # could hold a package named like one of ours. The directory this command's own `orga`
    # came from goes first on PYTHONPATH only when the new interpreter would not find it
    # anyway (a checkout run from its own directory): an installed `orga` is in
    # site-packages, which must stay behind the standard library.
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    if not any(_same_dir(entry, root) for entry in sys.path[1:]):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-P", "-m", "orga.coordinator_main"]
    os.execve(sys.executable, argv, env)  # noqa: S606


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    role: Annotated[
        Role,
        typer.Option(
            help="reasoning (ORGA_REASONING_PROCESSES processes, each with many model calls in "
            "flight on one event loop), tools (prefork, no model key), or all: both."
        ),
    ] = Role.ALL,
    concurrency: Annotated[
        int | None,
        typer.Option("-c", help="Calls in flight (reasoning) or processes (tools) per worker."),
    ] = None,
) -> None:
    """Run the Celery workers (other options, e.g. -E, -n, --loglevel, go to Celery)."""
    _require_url()
    settings = _settings()
    if concurrency:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    named = any(a == "-n" or a.startswith(("-n", "--hostname")) for a in ctx.args)
    if named and role is Role.ALL:
        raise _fail(
            "error:",
            "-n names one worker and --role all starts several: add --role reasoning or "
            "--role tools",
            2,
        )
    if named and role is Role.REASONING:
        # -n names one worker: one process, unless ORGA_REASONING_PROCESSES asks for more.
        if "reasoning_processes" in settings.model_fields_set and settings.reasoning_processes > 1:
            raise _fail(
                "error:",
                f"-n names one worker and ORGA_REASONING_PROCESSES={settings.reasoning_processes}"
                " starts that many reasoning workers: drop -n, or set ORGA_REASONING_PROCESSES=1",
                2,
            )
        settings = settings.model_copy(update={"reasoning_processes": 1})
    commands = worker_commands(role, settings, os.environ, ctx.args)
    if len(commands) == 1:
        argv, env = commands[0].argv, commands[0].env
    else:
        argv, env = supervisor_exec(commands, os.environ, fork=settings.worker_fork)
    # Becomes the worker, or the supervisor of several (orga/supervisor.py): same pid.
    os.execve(sys.executable, argv, env)  # noqa: S606


@app.command()
def cancel(
    task_id: TaskId,
    reason: Annotated[
        str, typer.Option(metavar="TEXT", help="Why, for the journal.")
    ] = "cancelled by operator",
) -> None:
    """Abort a task (its verified milestones are kept); without ORGA_REDIS_URL, a task of the
    embedded runtime in ORGA_HOME (waiting until it is aborted)."""
    with _errors():
        url = _settings().redis_url
        if url:
            _deployment(_settings()).cancel(task_id, reason)
            _say(f"cancellation of {task_id} sent")
            return
        status = _read(lambda client: _cancel_and_wait(client, task_id, reason))
    _say(f"task {task_id} {status}")


@app.command()
def inbox(
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to bind (beyond this host: behind TLS).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="Port to serve on.")] = 8765,
) -> None:
    """Serve the review inbox on the web (needs ORGA_INBOX_TOKEN or ORGA_INBOX_BASIC_AUTH)."""
    from coordinator.inbox import InboxConfigError
    from orga.inbox import run_inbox

    settings = _settings()
    key_fds = None if settings.redis_url else _hand_off_model_keys(settings)
    with _errors():
        try:
            run_inbox(settings, _home(), host, port, announce=_say, key_fds=key_fds)
        except InboxConfigError as exc:  # a missing or invalid setting: exit 2, as bad input
            raise _fail("error:", exc, 2) from exc


@app.command()
def api(
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to bind (beyond this host: behind TLS).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="Port to serve on.")] = 8766,
) -> None:
    """Serve the HTTP API (/v1/..., OpenAPI at /v1/openapi.json; needs ORGA_API_TOKENS)."""
    from orga.api import ApiConfigError, run_api

    settings = _settings()
    key_fds = None if settings.redis_url else _hand_off_model_keys(settings)
    with _errors():
        try:
            run_api(settings, _home(), host, port, announce=_say, key_fds=key_fds)
        except ApiConfigError as exc:  # no tokens, or a weak one: exit 2, as bad input
            raise _fail("error:", exc, 2) from exc


@app.command()
def schema() -> None:
    """The JSON Schema of a task file."""
    out.print_json(json.dumps(task_json_schema()))


def main() -> None:
    """Entry point of the ``orga`` script."""
    app()


if __name__ == "__main__":
    main()
