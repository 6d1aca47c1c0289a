#!/usr/bin/env python3
"""Replay real agent trajectories through the stagnation detector and three baselines.

Usage: ``python bench/stagnation_eval.py [--config CONFIG.json] [--sweep]``

Reads ``<repo>/../shared/agent-trajectories/normalized/*.jsonl.gz`` (or the folder named by
``ORGA_TRAJECTORIES``), maps every step to a :class:`ToolEvent` mechanically (the mapping is
documented in ``docs/stagnation.md``), and prints, per detector and dataset, the share of runs
that reach REPLAN and ASK_HUMAN among resolved runs (false alarms) and unresolved runs, the
detection step on the known 53-step SWE-agent loop, and the cost of one observation. Exits 0
with a message when the trajectories are absent. Standard library plus our package only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stagnation_baselines import (  # noqa: E402
    GeminiCycleBaseline,
    NaiveOutputHashBaseline,
    OpenHandsBaseline,
    StepBudgetBaseline,
)
from stagnation_holdout import (  # noqa: E402
    Interval,
    LosoResult,
    RunRecord,
    bootstrap_interval,
    leave_one_source_out,
    recall_within,
    record_for,
)

from shared.stagnation import (  # noqa: E402
    Ladder,
    ModelTurn,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    StagnationVerdict,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.plans import self_report  # noqa: E402
from shared.stagnation.shell import (  # noqa: E402
    SHELL_READS,
    first_word,
    strip_heredocs,
)
from shared.stagnation.shell import shell_kind as stagnation_shell_kind  # noqa: E402

DATASETS = (
    "mini-swe-agent-gemini3pro-verified",
    "swe-agent-java-5models",
    "tau-bench-gpt4o-airline",
    "who-and-when",
)
KNOWN_LOOP = ("swe-agent-java-5models", "deepseek-coder-v2", "fasterxml__jackson-databind-4249")


def trajectories_dir() -> Path:
    """``$ORGA_TRAJECTORIES`` if set, else ``../shared/agent-trajectories/normalized``."""
    override = os.environ.get("ORGA_TRAJECTORIES")
    if override:
        return Path(override)
    return REPO_ROOT.parent / "shared" / "agent-trajectories" / "normalized"


# -- one step, as every detector sees it ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One step: the index in the trajectory, the model's turn (its message and proposed
    calls) and our tool event, either of which may be absent, and the raw text for baselines.
    The baselines see the steps with a tool event only."""

    index: int
    event: ToolEvent | None
    action: str
    observation: str
    turn: ModelTurn | None = None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- shell commands (SWE-agent and mini-swe-agent) ----------------------------------------------

_ACI_READS = ("open", "goto", "scroll_down", "scroll_up", "search_file", "search_dir", "find_file")
_READ_COMMANDS = frozenset((*_ACI_READS, *SHELL_READS))
_SWE_WRITE_COMMANDS = frozenset({"edit", "create"})
_SWE_TOOLS = frozenset((*_ACI_READS, "edit", "create", "submit", "exit_cost"))
_OTHER_COMMANDS = frozenset({"exit_cost", "submit", "exit_context", "exit_format", "exit_error"})


def _first_word(command: str) -> str:
    return first_word(command)


def shell_kind(command: str) -> tuple[ToolKind, str | None]:
    """read / write / command / other for one command line (SWE-agent's ``edit`` and
    ``create`` write, its ACI commands read), and the written path; the shell rules are the
    detector's own (:mod:`shared.stagnation.shell`)."""
    if first_word(strip_heredocs(command)) in _SWE_WRITE_COMMANDS:
        return ToolKind.WRITE, None
    return stagnation_shell_kind(command, reads=_READ_COMMANDS, others=_OTHER_COMMANDS)


# -- SWE-agent 0.x -----------------------------------------------------------------------------

_SWE_ERROR = re.compile(
    r"^/bin/bash: line \d+:|^Usage: |^Error: |^No file open|^File .* not found"
    r"|Your proposed edit has introduced|Traceback \(most recent call last\)"
    r"|EXECUTION TIMED OUT|: command not found|BUILD FAILURE",
    re.M,
)
_SWE_FILE = re.compile(r"^\[File: (\S+) \(")


_WINDOW_LINE = re.compile(r"^\d+:", re.M)
_WINDOW_HEADER = re.compile(r"^\[File: .*\]$|^\(\d+ more lines (?:above|below)\)$", re.M)


def _window_content(observation: str) -> str:
    """The file content an edit's window shows: line-number prefixes and headers removed."""
    return _WINDOW_LINE.sub("", _WINDOW_HEADER.sub("", observation))


def swe_agent_step(raw: dict[str, Any]) -> ReplayStep | None:
    """SWE-agent: shell and ACI commands; a successful edit/create shows the file afterwards."""
    if raw["observation"] is None:
        return None
    action, observation = raw["action"].strip(), raw["observation"]
    kind, path = shell_kind(action)
    failed = bool(_SWE_ERROR.search(observation))
    after = content = None
    shown = _SWE_FILE.match(observation)
    if kind is ToolKind.WRITE and _first_word(action) in _SWE_WRITE_COMMANDS:
        path = shown.group(1) if shown else path
        failed = failed or shown is None
        after = None if failed else _sha(_window_content(observation))
    elif kind is ToolKind.READ and shown is not None and not failed:
        # open / goto / scroll show a window of the file: its content is the state seen.
        path, content = shown.group(1), _sha(_window_content(observation))
    word = _first_word(action)
    tool = word if word in _SWE_TOOLS else "bash"
    event = ToolEvent(
        tool_name=tool,
        arguments={"command": action},
        output=observation,
        kind=kind,
        path=path,
        content_hash=content,
        after_hash=after,
        is_error=failed,
    )
    turn = ModelTurn.from_message(raw["thought"] or "", [(tool, json.dumps({"command": action}))])
    return ReplayStep(raw["i"], event, action, observation, turn)


# -- mini-swe-agent (bash only) ------------------------------------------------------------------

_RETURNCODE = re.compile(r"^<returncode>(-?\d+)</returncode>\n?", re.S)
_OUTPUT_ONLY = re.compile(r"^<output>\n?(.*?)\n?</output>\s*$", re.S)
_RUNTIME_ERROR = ("Please always provide EXACTLY ONE action", "The last command <command>")


def _mini_output(observation: str) -> tuple[int | None, str]:
    match = _RETURNCODE.match(observation)
    if match is None:
        return None, observation
    body = observation[match.end() :]
    inner = _OUTPUT_ONLY.match(body)
    return int(match.group(1)), inner.group(1) if inner else body


def mini_swe_step(raw: dict[str, Any]) -> ReplayStep | None:
    """mini-swe-agent: one bash command per step, ``<returncode>N</returncode>`` parsed."""
    if raw["observation"] is None:
        return None
    action, observation = raw["action"], raw["observation"]
    exit_code, output = _mini_output(observation)
    refused = observation.startswith(_RUNTIME_ERROR)
    kind, path = shell_kind(action) if action.strip() else (ToolKind.OTHER, None)
    if refused:  # the harness refused the reply: no command ran, nothing was read or written
        kind, path = ToolKind.OTHER, None
    event = ToolEvent(
        tool_name="bash",
        arguments={"command": action},
        output=output,
        exit_code=exit_code,
        kind=kind,
        path=path,
        is_error=refused,
    )
    # the thought is the whole assistant message, its command block included
    turn = ModelTurn.from_message(raw["thought"] or action)
    return ReplayStep(raw["i"], event, action, observation, turn)


# -- tau-bench (function calls) -----------------------------------------------------------------

_TAU_WRITE = ("book_", "update_", "cancel_", "send_", "transfer_")


def _tau_kind(tool: str) -> ToolKind:
    return ToolKind.WRITE if tool.startswith(_TAU_WRITE) else ToolKind.READ


_TAU_THINK = "think"


_TAU_SAY = "say "


def tau_step(raw: dict[str, Any]) -> ReplayStep | None:
    """tau-bench: tool calls with their outputs; a reply to the user is a turn, no tool event.

    The agent's messages to the (simulated) user are the model's turns; the user's answers are
    conversation, not tool results (they differ every time and say nothing about the tools).
    A tool call is a turn (its thought, if any, and the call) and a tool event. ``think``
    records a thought and returns nothing: an *other* tool, whose empty answer is an
    acknowledgement.
    """
    tool = raw["tool"]
    action = raw["action"] or ""
    if tool is None:
        if not action.startswith(_TAU_SAY):
            return None
        turn = ModelTurn.from_message(action[len(_TAU_SAY) :])
        return ReplayStep(raw["i"], None, action, raw["observation"] or "", turn)
    observation = raw["observation"] or ""
    args_text = action[len(tool) + 1 :] or "{}"
    args = json.loads(args_text)
    failed = observation.startswith("Error")
    kind = ToolKind.OTHER if tool == _TAU_THINK else _tau_kind(tool)
    after = _sha(observation) if kind is ToolKind.WRITE and not failed else None
    event = ToolEvent(
        tool_name=tool,
        arguments=args,
        output=observation,
        kind=kind,
        path=args.get("reservation_id") or args.get("user_id"),
        after_hash=after,
        is_error=failed,
    )
    turn = ModelTurn.from_message(raw["thought"] or "", [(tool, args_text)])
    return ReplayStep(raw["i"], event, action, observation, turn)


# -- Who&When (multi-agent chat logs) -----------------------------------------------------------

_WW_TERMINALS = ("Computer_terminal", "ComputerTerminal")
_WW_READERS = ("WebSurfer", "FileSurfer")
_WW_EXIT = re.compile(r"exitcode: (-?\d+)")


_WW_LEDGER = "Updated Ledger"
_WW_HUMAN = "human"
_WW_BROADCAST = "Orchestrator (->"


def _ledger_turn(text: str) -> ModelTurn:
    """An orchestrator's progress ledger as a turn: its instruction, and its self-assessment."""
    body = text[len(_WW_LEDGER) :].lstrip(": \n")
    try:
        ledger = json.loads(body)
        instruction = str(ledger["instruction_or_question"]["answer"])
    except (ValueError, KeyError, TypeError):
        instruction = body
    return ModelTurn(text=instruction, stuck=self_report(text))


@dataclass(slots=True)
class WhoWhenMapper:
    """Who&When: tool agents' messages are the observations of the message that asked for them.

    A terminal message becomes a command (exit code parsed), a web or file surfer message a
    read; its arguments are the last message that asked for it. A message written by a model
    is a turn: an expert's or the assistant's message, and the orchestrator's progress ledger
    (one model call that answers ``is_in_loop`` and ``is_progress_being_made`` and writes the
    next instruction, the turn's text). The orchestrator's "-> WebSurfer" message only
    broadcasts that instruction (it is the request, not another turn); its other "(thought)"
    messages are not turns: "Next speaker WebSurfer", the plans it fills into a template, and
    its host's "Stalled.... Replanning...".
    """

    request: str = ""

    def __call__(self, raw: dict[str, Any]) -> ReplayStep | None:
        actor, text = raw["actor"] or "", raw["action"] or ""
        if not actor.startswith(_WW_TERMINALS + _WW_READERS):
            return self._model(raw["i"], actor, text)
        code = _WW_EXIT.search(text[:200])
        terminal = actor.startswith(_WW_TERMINALS)
        event = ToolEvent(
            tool_name=actor.split(" ")[0],
            arguments={"request": self.request},
            output=text,
            exit_code=int(code.group(1)) if terminal and code else None,
            kind=ToolKind.COMMAND if terminal else ToolKind.READ,
        )
        return ReplayStep(raw["i"], event, self.request, text)

    def _model(self, index: int, actor: str, text: str) -> ReplayStep | None:
        if "(thought)" in actor:
            if not text.startswith(_WW_LEDGER):
                return None
            return ReplayStep(index, None, text, "", _ledger_turn(text))
        if actor == _WW_HUMAN:
            return None
        self.request = text
        if actor.startswith(_WW_BROADCAST):
            return None
        return ReplayStep(index, None, text, "", ModelTurn.from_message(text))


StepMapper = Callable[[dict[str, Any]], "ReplayStep | None"]

MAPPERS: dict[str, Callable[[], StepMapper]] = {
    "mini-swe-agent-gemini3pro-verified": lambda: mini_swe_step,
    "swe-agent-java-5models": lambda: swe_agent_step,
    "tau-bench-gpt4o-airline": lambda: tau_step,
    "who-and-when": WhoWhenMapper,
}
"""Per dataset, a factory of step mappers: a fresh one per trajectory (Who&When keeps state)."""


def replay_steps(dataset: str, trajectory: dict[str, Any]) -> list[ReplayStep]:
    """Every tool step of ``trajectory`` as a :class:`ReplayStep`, in order."""
    mapper = MAPPERS[dataset]()
    return [step for raw in trajectory["steps"] if (step := mapper(raw)) is not None]


# -- detectors ----------------------------------------------------------------------------------


class Replayable(Protocol):
    """A detector the replay can drive: one level per step."""

    name: str

    def observe(self, action: str, observation: str, is_error: bool) -> StagnationLevel:
        """The level after this step."""
        ...


@dataclass(slots=True)
class Ours:
    """Our detector, timing each ``observe`` and remembering the kind at the first REPLAN."""

    config: StagnationConfig
    timings: list[float] = field(default_factory=list)
    turn_timings: list[float] = field(default_factory=list)
    name: str = "ours"
    detector: StagnationDetector = field(init=False)
    replan_kind: StagnationKind | None = None

    def __post_init__(self) -> None:
        self.detector = StagnationDetector(self.config)

    def observe_step(self, step: ReplayStep) -> StagnationLevel:
        """Observe one step (the turn, then the tool event), recording the cost of each call;
        the level after it."""
        verdict = self.detector.verdict()
        if step.turn is not None:
            started = time.perf_counter()
            verdict = self.detector.observe_turn(step.turn)
            self.turn_timings.append(time.perf_counter() - started)
        if step.event is not None:
            started = time.perf_counter()
            verdict = self.detector.observe(step.event)
            self.timings.append(time.perf_counter() - started)
        if verdict.level >= StagnationLevel.REPLAN and self.replan_kind is None:
            self.replan_kind = verdict.kind
        return verdict.level


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """Index of the first step at REPLAN or above, and at ASK_HUMAN or above (None: never)."""

    replan: int | None
    ask: int | None
    kind: StagnationKind | None = None


def replay(detector: Ours | Replayable, steps: list[ReplayStep]) -> RunOutcome:
    """Feed every step; remember where REPLAN and ASK_HUMAN were first reached."""
    replan = ask = None
    for step in steps:
        if isinstance(detector, Ours):
            level = detector.observe_step(step)
        elif step.event is None:
            continue
        else:
            level = detector.observe(step.action, step.observation, step.event.failed)
        if replan is None and level >= StagnationLevel.REPLAN:
            replan = step.index
        if ask is None and level >= StagnationLevel.ASK_HUMAN:
            ask = step.index
            break
    kind = detector.replan_kind if isinstance(detector, Ours) else None
    return RunOutcome(replan, ask, kind)


DetectorFactory = Callable[[], "Ours | Replayable"]


def detector_factories(
    config: StagnationConfig, timings: list[float], turn_timings: list[float]
) -> dict[str, DetectorFactory]:
    """Fresh detectors per run: ours (sharing the lists of timings) and the four baselines."""
    return {
        "ours": lambda: Ours(config, timings, turn_timings),
        "openhands": OpenHandsBaseline,
        "gemini-cli": GeminiCycleBaseline,
        "step-75%": StepBudgetBaseline,
        "naive-hash": NaiveOutputHashBaseline,
    }


# -- loading ------------------------------------------------------------------------------------


def load(folder: Path, dataset: str) -> Iterator[dict[str, Any]]:
    """The trajectories of one dataset, one dict per line."""
    path = folder / f"{dataset}.jsonl.gz"
    if not path.exists():
        return
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


@dataclass(slots=True)
class Tally:
    """Runs and runs reaching each level, per label."""

    runs: Counter[str] = field(default_factory=Counter)
    replan: Counter[str] = field(default_factory=Counter)
    ask: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)

    def add(self, label: str, outcome: RunOutcome) -> None:
        self.runs[label] += 1
        self.replan[label] += outcome.replan is not None
        self.ask[label] += outcome.ask is not None
        if outcome.kind is not None:
            self.kinds[outcome.kind.value] += 1


def _label(trajectory: dict[str, Any]) -> str:
    resolved = trajectory["label"]["resolved"]
    return "unknown" if resolved is None else ("R" if resolved else "U")


def _loop_start(steps: list[ReplayStep]) -> int:
    """Index of the first step of the longest run of identical actions."""
    best_start, best_len, start = 0, 0, 0
    for i in range(1, len(steps) + 1):
        if i == len(steps) or steps[i].action != steps[start].action:
            if i - start > best_len:
                best_start, best_len = start, i - start
            start = i
    return steps[best_start].index if steps else 0


# -- the run ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    """Everything the report prints."""

    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    by_exit: dict[str, Tally] = field(default_factory=dict)
    loop: dict[str, RunOutcome] = field(default_factory=dict)
    loop_start: int | None = None
    loop_length: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    turns: Counter[str] = field(default_factory=Counter)


def evaluate(
    folder: Path, factories: dict[str, DetectorFactory], datasets: tuple[str, ...] = DATASETS
) -> Results:
    """Replay every trajectory of ``datasets`` through every detector."""
    results = Results()
    for dataset in datasets:
        for trajectory in load(folder, dataset):
            steps = replay_steps(dataset, trajectory)
            results.steps[dataset] += sum(step.event is not None for step in steps)
            results.turns[dataset] += sum(step.turn is not None for step in steps)
            _replay_all(results, factories, dataset, trajectory, steps)
    return results


def _is_known_loop(dataset: str, trajectory: dict[str, Any]) -> bool:
    name, model, instance = KNOWN_LOOP
    return (
        dataset == name and trajectory["model"] == model and trajectory["instance_id"] == instance
    )


def _exit_label(trajectory: dict[str, Any]) -> str:
    """SWE-agent: "budget" when the run ended by exhausting its cost budget, else "submitted"."""
    return "budget" if "exit_cost" in (trajectory["label"]["exit_status"] or "") else "submitted"


def _replay_all(
    results: Results,
    factories: dict[str, DetectorFactory],
    dataset: str,
    trajectory: dict[str, Any],
    steps: list[ReplayStep],
) -> None:
    label = _label(trajectory)
    known_loop = _is_known_loop(dataset, trajectory)
    if known_loop:
        results.loop_start = _loop_start(steps)
        results.loop_length = Counter(s.action for s in steps).most_common(1)[0][1]
    for name, factory in factories.items():
        outcome = replay(factory(), steps)
        results.tallies.setdefault((dataset, name), Tally()).add(label, outcome)
        if dataset == "swe-agent-java-5models":
            results.by_exit.setdefault(name, Tally()).add(_exit_label(trajectory), outcome)
        if known_loop:
            results.loop[name] = outcome


# -- report -------------------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def print_table(results: Results) -> None:
    """Per dataset and detector: runs reaching REPLAN / ASK_HUMAN among R and U runs."""
    header = (
        f"{'dataset':<36} {'detector':<11} {'R runs':>6} {'R>=REPLAN':>9} {'R>=ASK':>7} "
        f"{'U runs':>6} {'U>=REPLAN':>9} {'U>=ASK':>7}"
    )
    print(header)
    print("-" * len(header))
    for (dataset, name), t in results.tallies.items():
        r, u = t.runs["R"], t.runs["U"]
        print(
            f"{dataset:<36} {name:<11} {r:>6} {_share(t.replan['R'], r):>9} "
            f"{_share(t.ask['R'], r):>7} {u:>6} {_share(t.replan['U'], u):>9} "
            f"{_share(t.ask['U'], u):>7}"
        )
    print()


def print_by_exit(results: Results) -> None:
    """SWE-agent Java, all 448 runs, by how they ended: budget exhausted or submitted."""
    if not results.by_exit:
        return
    print("swe-agent-java-5models by exit status (budget = ended by exit_cost, a proxy for stuck)")
    for name, t in results.by_exit.items():
        b, s = t.runs["budget"], t.runs["submitted"]
        print(
            f"  {name:<11} budget {b:>3}: REPLAN {_share(t.replan['budget'], b)} "
            f"ASK {_share(t.ask['budget'], b)} | submitted {s:>3}: "
            f"REPLAN {_share(t.replan['submitted'], s)} ASK {_share(t.ask['submitted'], s)}"
        )
    print()


def print_loop(results: Results) -> None:
    """Steps from the start of the known loop to REPLAN, per detector."""
    if results.loop_start is None:
        print("known loop: trajectory not found\n")
        return
    _, model, instance = KNOWN_LOOP
    print(
        f"known loop ({model} / {instance}): the same action {results.loop_length} times, "
        f"starting at step {results.loop_start}"
    )
    for name, outcome in results.loop.items():
        if outcome.replan is None:
            print(f"  {name:<11} never reaches REPLAN")
            continue
        ask = "never" if outcome.ask is None else f"+{outcome.ask - results.loop_start}"
        print(
            f"  {name:<11} REPLAN at step {outcome.replan} "
            f"(+{outcome.replan - results.loop_start} from loop start), ASK_HUMAN at {ask}"
        )
    print()


def _cost(timings: list[float], unit: str) -> str:
    ordered = sorted(timings)
    mean = 1e6 * sum(ordered) / len(ordered)
    median = 1e6 * ordered[len(ordered) // 2]
    p99 = 1e6 * ordered[int(len(ordered) * 0.99)]
    return f"{mean:.0f} µs per {unit} on average (median {median:.0f} µs, p99 {p99:.0f} µs)"


def print_extras(
    results: Results, timings: list[float], turn_timings: list[float], elapsed_s: float
) -> None:
    """Kinds at first REPLAN, and costs."""
    for (dataset, name), tally in results.tallies.items():
        if name == "ours" and tally.kinds:
            kinds = ", ".join(f"{k} {v}" for k, v in tally.kinds.most_common())
            print(f"ours, kind at first REPLAN, {dataset}: {kinds}")
    if timings:
        print(
            f"\n{sum(results.steps.values())} tool steps replayed; ours: "
            f"{_cost(timings, 'observation')}"
        )
    if turn_timings:
        print(f"{sum(results.turns.values())} model turns; ours: {_cost(turn_timings, 'turn')}")
    print(f"whole evaluation: {elapsed_s:.1f} s")


# -- the labelled set ---------------------------------------------------------------------------

LABEL_KINDS = ("exact-repeat", "cycle", "no-gradient", "amnesia")


def labels_dir() -> Path:
    """``$ORGA_STAGNATION_LABELS`` if set, else ``../shared/stagnation-labels``."""
    override = os.environ.get("ORGA_STAGNATION_LABELS")
    if override:
        return Path(override)
    return REPO_ROOT.parent / "shared" / "stagnation-labels"


def load_scorer(folder: Path) -> ModuleType | None:
    """The labelled set's own scorer, ``score_stagnation.py``, imported from ``folder``."""
    path = folder / "score_stagnation.py"
    if not path.exists() or not (folder / "labels.jsonl").exists():
        return None
    spec = importlib.util.spec_from_file_location("score_stagnation", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["score_stagnation"] = module
    spec.loader.exec_module(module)
    return module


@dataclass(slots=True)
class Stall:
    """One episode of ours that reached REPLAN: where, what kind, and the first text sent."""

    nudge_step: int
    nudge_kind: StagnationKind | None
    first_message: str
    replan_step: int | None = None
    replan_kind: StagnationKind | None = None


@dataclass(slots=True)
class OursAlarm:
    """Our detector behind the scorer's protocol: an alarm at every step at REPLAN or above.

    Each step dict is mapped to a :class:`ToolEvent` as the replay does (steps that are not
    tool events change nothing); the escalations are kept as :class:`Stall` records.
    """

    config: StagnationConfig
    detector: StagnationDetector = field(init=False)
    mapper: StepMapper | None = None
    level: StagnationLevel = StagnationLevel.NONE
    stalls: list[Stall] = field(default_factory=list)
    tool_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.detector = StagnationDetector(self.config)

    def fire(self, step: dict[str, Any]) -> bool:
        """True while the level is REPLAN or above after this step."""
        if self.mapper is None:
            self.mapper = MAPPERS[step["dataset"]]()
        mapped = self.mapper(step)
        if mapped is not None and mapped.turn is not None:
            self._apply(step["i"], self.detector.observe_turn(mapped.turn))
        if mapped is not None and mapped.event is not None:
            self.tool_steps.append(step["i"])
            self._apply(step["i"], self.detector.observe(mapped.event))
        return self.level >= StagnationLevel.REPLAN

    def _apply(self, index: int, verdict: StagnationVerdict) -> None:
        # a tool result continuing the turn's iteration repeats the turn's escalation
        if verdict.escalated and verdict.level > self.level:
            self._record(index, verdict)
        self.level = verdict.level

    def _record(self, index: int, verdict: StagnationVerdict) -> None:
        if verdict.level is StagnationLevel.NUDGE or not self.stalls:
            self.stalls.append(Stall(index, verdict.kind, verdict.message))
        elif verdict.level is StagnationLevel.REPLAN:
            self.stalls[-1].replan_step, self.stalls[-1].replan_kind = index, verdict.kind

    def detected(self) -> list[Stall]:
        """The episodes that reached REPLAN."""
        return [stall for stall in self.stalls if stall.replan_step is not None]


@dataclass(slots=True)
class LabelledResults:
    """The scorer's results per detector, and ours' stalls per labelled and unlabelled run."""

    scorer: ModuleType
    results: dict[str, dict[str, Any]]
    labelled: list[tuple[dict[str, Any], OursAlarm]]
    unlabelled: list[tuple[str, OursAlarm, bool]]
    host: dict[str, Any] | None = None
    """Magentic-One's own replans scored on the labelled Who&When runs (None: none labelled)."""

    @property
    def ours(self) -> dict[str, Any]:
        """The scorer's summary of our detector."""
        summary: dict[str, Any] = self.results["ours"]["summary"]
        return summary


def evaluate_labelled(
    scorer: ModuleType, folder: Path, config: StagnationConfig, *, unlabelled: bool = True
) -> LabelledResults:
    """Score ours and the scorer's four baselines on the labelled set, in one pass each."""
    labels = scorer.load_labels(labels_dir() / "labels.jsonl")
    keys = [scorer.label_key(label) for label in labels]
    trajectories = scorer.load_trajectories(keys, folder)
    alarms: list[OursAlarm] = []

    def ours() -> OursAlarm:
        alarms.append(OursAlarm(config))
        return alarms[-1]

    results = {"ours": scorer.evaluate(ours, labels, trajectories)}
    for name, factory in scorer.BASELINES.items():
        results[name] = scorer.evaluate(factory, labels, trajectories)
    rest = _unlabelled_stalls(scorer, folder, config, set(keys)) if unlabelled else []
    ww = [label for label in labels if label["dataset"] == "who-and-when"]
    host = scorer.evaluate(MagenticOneReplans, ww, trajectories) if ww else None
    paired = list(zip(labels, alarms, strict=True))
    return LabelledResults(scorer, results, paired, rest, host)


_WW_STALLED = "Stalled"


class MagenticOneReplans:
    """Who&When's own detector, as recorded: Magentic-One's orchestrator replans ("Stalled....
    Replanning...") when its ledger's stall counter (looping or not progressing, a leaky count)
    passes its limit. A reference for the model side, read from the log; ours never sees it."""

    def fire(self, step: dict[str, Any]) -> bool:
        """True at the orchestrator's replan message."""
        return _is_host_replan(step)


def _is_host_replan(step: dict[str, Any]) -> bool:
    actor, text = step.get("actor") or "", step.get("action") or ""
    return actor.startswith("Orchestrator") and text.startswith(_WW_STALLED)


def _unlabelled_stalls(
    scorer: ModuleType, folder: Path, config: StagnationConfig, labelled: set[Any]
) -> list[tuple[str, OursAlarm, bool]]:
    """Ours on every trajectory of the four datasets that is not labelled, and whether the
    run's own host replanned (Magentic-One's "Stalled", Who&When only)."""
    out = []
    for dataset in DATASETS:
        for trajectory in load(folder, dataset):
            if scorer.label_key(trajectory) in labelled:
                continue
            alarm = OursAlarm(config)
            for raw in trajectory["steps"]:
                alarm.fire(scorer.step_view(trajectory, raw))
            host = any(_is_host_replan(raw) for raw in trajectory["steps"])
            out.append((dataset, alarm, host))
    return out


def _metrics_row(name: str, summary: dict[str, Any], stuck: int, progressing: int) -> str:
    def share(key: str, count: int) -> str:
        value = summary[key]
        return "    -" if not count or math.isnan(value) else f"{100 * value:5.1f}%"

    delay = summary["median_delay"]
    delay_text = "    -" if math.isnan(delay) else f"{delay:5.1f}"
    return (
        f"  {name:<34} {stuck:>5} {share('recall', stuck):>7} {share('recall@8', stuck):>7} "
        f"{delay_text:>6} {share('early_fa', stuck):>7} {share('late', stuck):>6} "
        f"{progressing:>5} {share('false_alarm', progressing):>7}"
    )


def print_labelled(labelled: LabelledResults) -> None:
    """Every detector overall, then ours and each baseline by kind and by dataset."""
    scorer = labelled.scorer
    print(f"labelled set: {labels_dir()}")
    header = (
        f"  {'detector / slice':<34} {'stuck':>5} {'recall':>7} {'rec@8':>7} {'delay':>6} "
        f"{'early':>7} {'late':>6} {'prog':>5} {'FA':>7}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for name, result in labelled.results.items():
        summary = result["summary"]
        print(_metrics_row(name, summary, summary["n_stuck"], summary["n_progressing"]))
    for name, result in labelled.results.items():
        print(f"\n  {name}, by kind and by dataset")
        records = result["records"]
        slices: list[tuple[str, list[dict[str, Any]]]] = [
            (kind, [r for r in records if r.get("kind") == kind]) for kind in LABEL_KINDS
        ]
        slices += [(ds, [r for r in records if r["dataset"] == ds]) for ds in DATASETS]
        for label, subset in slices:
            stuck = sum(r["label"] == "stuck" for r in subset)
            progressing = len(subset) - stuck
            print(_metrics_row(label, scorer.summarize(subset), stuck, progressing))
    print()


def print_stalls(labelled: LabelledResults) -> None:
    """How many detected stalls are amnesia or no-gradient, and the first text at each."""
    print("ours: detected stalls (episodes reaching REPLAN) by kind at REPLAN")
    groups: dict[str, list[Stall]] = {}
    cross: Counter[tuple[str, str]] = Counter()
    for label, alarm in labelled.labelled:
        name = "labelled " + label["label"]
        for stall in alarm.detected():
            groups.setdefault(name, []).append(stall)
            if label["label"] == "stuck":
                cross[(label["kind"], _kind_name(stall.replan_kind))] += 1
    for dataset, alarm, _ in labelled.unlabelled:
        groups.setdefault(f"unlabelled {dataset}", []).extend(alarm.detected())
    for name, stalls in groups.items():
        kinds = Counter(_kind_name(stall.replan_kind) for stall in stalls)
        listed = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
        print(f"  {name:<46} {len(stalls):>4} stalls: {listed}")
    print("  labelled stuck, label kind -> our kind at REPLAN (every detected episode):")
    for (label_kind, ours_kind), count in sorted(cross.items()):
        print(f"    {label_kind:<13} -> {ours_kind:<12} {count:>3}")
    for kind in (StagnationKind.AMNESIA, StagnationKind.NO_GRADIENT):
        _print_first_messages(kind, groups)
    print()


WINDOW_STEPS = 8
"""Recall within 8 steps: a fire in [onset, onset + 8] (the scorer's ``recall@8``)."""


def print_misses(labelled: LabelledResults) -> None:
    """Every labelled stall ours misses within 8 steps of onset: where it fires instead, and how
    many tool results the 8-step window holds (an output-side detector sees nothing else)."""
    records = {tuple(r["key"]): r for r in labelled.results["ours"]["records"]}
    missed = []
    for label, alarm in labelled.labelled:
        record = records[labelled.scorer.label_key(label)]
        if label["label"] != "stuck" or record["detected8"]:
            continue
        onset, end = label["onset_step"], label["end_step"]
        window = [i for i in alarm.tool_steps if onset <= i <= min(end + 2, onset + WINDOW_STEPS)]
        inside = [f for f in record["fires"] if onset <= f <= end + 2]
        first = f"+{inside[0] - onset}" if inside else "never"
        missed.append((label, len(window), first))
    print(f"ours: labelled stalls missed within {WINDOW_STEPS} steps of onset: {len(missed)}")
    for label, results, first in missed:
        who = f"{label['dataset']} {label['run']} {label['instance_id']}"
        print(
            f"  {who:<92} {label['kind']:<12} onset {label['onset_step']:>3}  "
            f"first REPLAN {first:>5}  tool results in window {results}"
        )
    few = sum(results <= 2 for _, results, _ in missed)
    print(f"  {few} of them have at most 2 tool results in the window\n")


def print_host_replans(labelled: LabelledResults) -> None:
    """Who&When: Magentic-One's own replans next to ours, on the labelled and unlabelled runs."""
    if labelled.host is None:
        return
    ours = {tuple(r["key"]): r for r in labelled.results["ours"]["records"]}
    host = labelled.host["records"]
    stuck = [r for r in host if r["label"] == "stuck"]
    progressing = [r for r in host if r["label"] != "stuck"]
    both = sum(r["detected8"] and ours[tuple(r["key"])]["detected8"] for r in stuck)
    print(
        "Who&When: Magentic-One's own replans (its ledger's stall counter, as logged) and ours\n"
        f"  labelled stalls caught within {WINDOW_STEPS} steps of onset: magentic-one "
        f"{sum(r['detected8'] for r in stuck)} of {len(stuck)}, ours "
        f"{sum(ours[tuple(r['key'])]['detected8'] for r in stuck)} of {len(stuck)} "
        f"(both: {both})\n"
        f"  labelled progressing runs with an alarm: magentic-one "
        f"{sum(r['false_alarm'] for r in progressing)} of {len(progressing)}, ours "
        f"{sum(ours[tuple(r['key'])]['false_alarm'] for r in progressing)} of {len(progressing)}"
    )
    runs = [
        (alarm, replanned) for ds, alarm, replanned in labelled.unlabelled if ds == "who-and-when"
    ]
    if runs:
        mine = [bool(alarm.detected()) for alarm, _ in runs]
        theirs = [replanned for _, replanned in runs]
        agree = sum(a and b for a, b in zip(mine, theirs, strict=True))
        print(
            f"  unlabelled runs: {len(runs)}; magentic-one replans in {sum(theirs)}, ours reaches "
            f"REPLAN in {sum(mine)}, both in {agree}"
        )
    print()


def _kind_name(kind: StagnationKind | None) -> str:
    return kind.value if kind is not None else "none"


def _print_first_messages(kind: StagnationKind, groups: dict[str, list[Stall]]) -> None:
    """The first text the model would have got, for each stall of ``kind`` (distinct texts)."""
    texts: Counter[str] = Counter()
    total = 0
    for stalls in groups.values():
        for stall in stalls:
            if stall.replan_kind is kind:
                total += 1
                texts[_message_shape(stall.first_message)] += 1
    print(f"  first message to the model at the {total} {kind.value} stalls ({len(texts)} forms):")
    for text, count in texts.most_common(4):
        print(f"    {count:>3} x {text}")


_COUNTERS = re.compile(r"\d+")


def _message_shape(message: str) -> str:
    """The message with its numbers masked and its call quotes shortened, to group forms."""
    shape = _COUNTERS.sub("N", message)
    return shape if len(shape) <= 400 else shape[:397] + "..."


def print_results(labelled: LabelledResults | None, results: Results) -> None:
    """The three target lines ``make bench`` prints."""
    if labelled is not None:
        print(f"RESULT stagnation_recall8 {labelled.ours['recall@8']:.3f}")
        print(f"RESULT stagnation_false_alarms {labelled.ours['false_alarm']:.3f}")
    gemini = results.tallies.get(("mini-swe-agent-gemini3pro-verified", "ours"))
    if gemini is not None and gemini.runs["R"]:
        share = gemini.ask["R"] / gemini.runs["R"]
        print(f"RESULT stagnation_gemini_resolved_ask_human {share:.3f}")


# -- held out: leave one source out, bootstrap -------------------------------------------------

EXTRA_LABELS = REPO_ROOT / "bench" / "data" / "stagnation-labels-extra.jsonl"
HARD_LABELS = REPO_ROOT / "bench" / "data" / "stagnation-labels-hard.jsonl"
"""Our own labels (labels only, never trajectories), scored apart from the shared set."""

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def threshold_grid(base: StagnationConfig | None = None) -> dict[str, StagnationConfig]:
    """The thresholds a tuner varies around ``base`` (default: the defaults; ``--config``
    replays another), capped at 12 configurations, ``base`` itself first.

    An alarm is REPLAN, so what matters is how soon each ladder reaches it: the ``stale`` run
    (4/7/12/20 by default; one earlier, two later), ``repeat`` and ``error`` together (a
    retried call and a repeated error: 3/4/7/10, or one later), and the model side's ``plan``
    count (2/3/5/8, or one later). The rest (cycle, recovery, min_steps) is held.
    """
    base = base if base is not None else StagnationConfig()
    grid: dict[str, StagnationConfig] = {}
    for stale_name, stale in (
        ("stale as given", base.stale),
        ("stale 3/6", _ladder(3, 6, 10, 16)),
        ("stale 5/9", _ladder(5, 9, 14, 22)),
    ):
        for repeat_name, repeat in (
            ("repeat as given", base.repeat),
            ("repeat 3/5", _ladder(3, 5, 8, 10)),
        ):
            for plan_name, plan in (
                ("plan as given", base.plan),
                ("plan 3/4", _ladder(3, 4, 6, 9)),
            ):
                name = f"{stale_name}, {repeat_name}, {plan_name}"
                update = {"stale": stale, "repeat": repeat, "plan": plan}
                if repeat is not base.repeat:
                    update["error"] = repeat
                grid[name] = base.model_copy(update=update)
    return grid


MappedRun = list[tuple[int, "ReplayStep | None"]]


def map_run(dataset: str, trajectory: dict[str, Any]) -> MappedRun:
    """Every raw step of ``trajectory`` with its :class:`ReplayStep` (None: nothing to see),
    mapped once so that every configuration of the grid replays the same objects."""
    mapper = MAPPERS[dataset]()
    return [(raw["i"], mapper(raw)) for raw in trajectory["steps"]]


def alarm_steps(
    config: StagnationConfig, run: MappedRun, stop_after: int | None = None
) -> list[int]:
    """The steps at which our detector is at REPLAN or above, as :class:`OursAlarm` reports
    them to the scorer; the replay ends after step ``stop_after`` (None: the whole run)."""
    detector = StagnationDetector(config)
    level = StagnationLevel.NONE
    fires = []
    for index, step in run:
        if stop_after is not None and index > stop_after:
            break
        if step is not None and step.turn is not None:
            level = detector.observe_turn(step.turn).level
        if step is not None and step.event is not None:
            level = detector.observe(step.event).level
        if level >= StagnationLevel.REPLAN:
            fires.append(index)
    return fires


def _stop_after(label: dict[str, Any]) -> int | None:
    """The last step the held-out figures read: the end of the 8-step window of a stuck run."""
    if label["label"] != "stuck":
        return None
    return int(min(label["end_step"] + 2, label["onset_step"] + WINDOW_STEPS))


def grid_records(
    scorer: ModuleType,
    labels: list[dict[str, Any]],
    trajectories: dict[Any, dict[str, Any]],
    grid: dict[str, StagnationConfig],
) -> dict[str, list[RunRecord]]:
    """Per configuration, one :class:`RunRecord` per labelled run (in ``labels`` order)."""
    runs = []
    for label in labels:
        key = scorer.label_key(label)
        runs.append((key, label, map_run(key[0], trajectories[key]), _stop_after(label)))
    out: dict[str, list[RunRecord]] = {}
    for name, config in grid.items():
        records = []
        for key, label, run, stop in runs:
            fires = alarm_steps(config, run, stop)
            if label["label"] != "stuck":
                fires = fires[:1]
            records.append(record_for(key, label, fires))
        out[name] = records
    return out


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The pooled figures under the defaults, and leave-one-source-out over the grid."""

    name: str
    pooled: list[RunRecord]
    loso: LosoResult

    def interval(self, records: list[RunRecord], stuck: bool) -> Interval:
        """Bootstrap interval of recall within 8 (``stuck``) or of the false-alarm rate."""
        hits = [r.detected8 if stuck else r.false_alarm for r in records if r.stuck is stuck]
        return bootstrap_interval(hits, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)


def evaluate_held_out(
    scorer: ModuleType,
    folder: Path,
    labels_file: Path,
    name: str,
    base: StagnationConfig | None = None,
) -> HeldOut | None:
    """The grid around ``base`` on the labelled runs of ``labels_file``: ``base`` pooled, and
    LOSO."""
    labels = scorer.load_labels(labels_file)
    if not labels:
        return None
    trajectories = scorer.load_trajectories([scorer.label_key(lab) for lab in labels], folder)
    records = grid_records(scorer, labels, trajectories, threshold_grid(base))
    defaults = next(iter(records.values()))
    return HeldOut(name, defaults, leave_one_source_out(records))


def _pct(value: float) -> str:
    return "    -" if math.isnan(value) else f"{100 * value:5.1f}%"


def print_held_out(held: HeldOut) -> None:
    """Pooled (defaults) and leave-one-source-out figures, each with its bootstrap interval."""
    print(
        f"{held.name}: held-out figures (grid of {len(threshold_grid())} configurations, "
        f"bootstrap {BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}, 95%)"
    )
    for title, records in (
        ("defaults, pooled", held.pooled),
        ("leave-one-source-out", held.loso.pooled),
    ):
        stuck = sum(r.stuck for r in records)
        print(
            f"  {title:<22} recall within 8 {held.interval(records, True)} of {stuck} stuck; "
            f"false alarms {held.interval(records, False)} of {len(records) - stuck} progressing"
        )
    print(
        f"  {'held-out source':<36} {'stuck':>5} {'rec@8':>7} {'prog':>5} {'FA':>7}  "
        "chosen on the other three (train rec@8 / FA)"
    )
    for fold in held.loso.folds:
        stuck = sum(r.stuck for r in fold.held_out)
        print(
            f"  {fold.source:<36} {stuck:>5} {_pct(fold.recall):>7} "
            f"{len(fold.held_out) - stuck:>5} {_pct(fold.false_alarms):>7}  {fold.chosen} "
            f"({_pct(fold.train_recall).strip()} / {_pct(fold.train_fa).strip()})"
        )
    print()


def print_held_out_results(held: HeldOut, prefix: str) -> None:
    """The RESULT lines of one labelled set's held-out figures, with their intervals."""
    for name, records in (("", held.pooled), ("_loso", held.loso.pooled)):
        recall = held.interval(records, True)
        fa = held.interval(records, False)
        print(f"RESULT {prefix}{name}_recall_within_8 {recall.value:.3f}")
        print(f"RESULT {prefix}{name}_recall_within_8_ci95 {recall.low:.3f} {recall.high:.3f}")
        print(f"RESULT {prefix}{name}_false_alarm_rate {fa.value:.3f}")
        print(f"RESULT {prefix}{name}_false_alarm_rate_ci95 {fa.low:.3f} {fa.high:.3f}")


# -- threshold sweep ----------------------------------------------------------------------------


def _ladder(nudge: int, replan: int, ask_human: int, abort: int) -> Ladder:
    return Ladder(nudge=nudge, replan=replan, ask_human=ask_human, abort=abort)


def sweep_configs() -> dict[str, StagnationConfig]:
    """The defaults and one-at-a-time variations of the thresholds that matter most."""
    base = StagnationConfig()
    return {
        "defaults": base,
        "stale 3/5/9/16": base.model_copy(update={"stale": _ladder(3, 5, 9, 16)}),
        "stale 4/6/10/16": base.model_copy(update={"stale": _ladder(4, 6, 10, 16)}),
        "stale 5/8/12/20": base.model_copy(update={"stale": _ladder(5, 8, 12, 20)}),
        "stale 8/12/20/32": base.model_copy(update={"stale": _ladder(8, 12, 20, 32)}),
        "repeat+error 3/5/8/12": base.model_copy(
            update={"repeat": _ladder(3, 5, 8, 12), "error": _ladder(3, 5, 8, 12)}
        ),
        "recovery 0 (reset)": base.model_copy(update={"recovery": 0}),
        "recovery 2, share 0": base.model_copy(update={"recovery": 2, "recovery_share": 0.0}),
        "min_steps 10": base.model_copy(update={"min_steps": 10}),
        "plan 2/4/6/9": base.model_copy(update={"plan": _ladder(2, 4, 6, 9)}),
        "plan 1/3/5/8": base.model_copy(update={"plan": _ladder(1, 3, 5, 8)}),
        "plan_similarity 0.8": base.model_copy(update={"plan_similarity": 0.8}),
        "plan_similarity 0.95": base.model_copy(update={"plan_similarity": 0.95}),
        "plan_paraphrase 0.5": base.model_copy(update={"plan_paraphrase": 0.5}),
        "plan_paraphrase 0.7": base.model_copy(update={"plan_paraphrase": 0.7}),
        "plan_paraphrase 1.0": base.model_copy(update={"plan_paraphrase": 1.0}),
        "plan_target 0.25": base.model_copy(update={"plan_target": 0.25}),
        "plan_target 1.0 (off)": base.model_copy(update={"plan_target": 1.0}),
        "plan_unanswered off": base.model_copy(update={"plan_unanswered": False}),
        "model side off": base.model_copy(update={"plan": _ladder(*[10**6] * 4)}),
    }


def run_sweep(folder: Path, scorer: ModuleType | None) -> None:
    """Our detector alone, per config: the labelled set, then the resolution proxies."""
    datasets = ("mini-swe-agent-gemini3pro-verified", "swe-agent-java-5models")
    print(
        f"{'config':<22} {'rec@8':>6} {'FA':>6} {'gemini R>=ASK':>13} {'gemini U>=REPLAN':>16} "
        f"{'java budget>=REPLAN':>19} {'java submitted>=ASK':>19} {'loop->REPLAN':>12}"
    )
    for name, config in sweep_configs().items():
        recall8 = false_alarms = "-"
        if scorer is not None:
            summary = evaluate_labelled(scorer, folder, config, unlabelled=False).ours
            recall8 = f"{100 * summary['recall@8']:5.1f}%"
            false_alarms = f"{100 * summary['false_alarm']:5.1f}%"
        factories: dict[str, DetectorFactory] = {"ours": partial(Ours, config)}
        results = evaluate(folder, factories, datasets)
        gemini = results.tallies[(datasets[0], "ours")]
        java = results.by_exit["ours"]
        loop = results.loop.get("ours")
        start = results.loop_start or 0
        to_replan = "never" if loop is None or loop.replan is None else f"+{loop.replan - start}"
        print(
            f"{name:<22} {recall8:>6} {false_alarms:>6} "
            f"{_share(gemini.ask['R'], gemini.runs['R']):>13} "
            f"{_share(gemini.replan['U'], gemini.runs['U']):>16} "
            f"{_share(java.replan['budget'], java.runs['budget']):>19} "
            f"{_share(java.ask['submitted'], java.runs['submitted']):>19} {to_replan:>12}"
        )


# -- entry point --------------------------------------------------------------------------------


def _load_config(path: str | None) -> StagnationConfig:
    if path is None:
        return StagnationConfig()
    return StagnationConfig.model_validate_json(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print the report; 0 when the data is absent too."""
    parser = argparse.ArgumentParser(description="Replay agent trajectories through detectors.")
    parser.add_argument("--config", help="a StagnationConfig as JSON (default: the defaults)")
    parser.add_argument("--sweep", action="store_true", help="also vary the main thresholds")
    parser.add_argument(
        "--labelled-only", action="store_true", help="only the labelled set (no unlabelled rest)"
    )
    parser.add_argument(
        "--extra-labels", help=f"our own labels (default: {EXTRA_LABELS.relative_to(REPO_ROOT)})"
    )
    parser.add_argument(
        "--hard-labels",
        help=f"our hand-read labels (default: {HARD_LABELS.relative_to(REPO_ROOT)})",
    )
    args = parser.parse_args(argv)
    folder = trajectories_dir()
    if not folder.is_dir():
        print(f"stagnation_eval: no trajectories at {folder}; set ORGA_TRAJECTORIES. Skipping.")
        return 0
    config = _load_config(args.config)
    print(f"trajectories: {folder}\nconfig: {config.model_dump_json()}\n")
    started = time.perf_counter()
    scorer = load_scorer(labels_dir())
    labelled = held = extra = hard = None
    if scorer is None:
        print(f"no labelled set at {labels_dir()}; set ORGA_STAGNATION_LABELS. Skipping it.\n")
    else:
        labelled = evaluate_labelled(scorer, folder, config, unlabelled=not args.labelled_only)
        print_labelled(labelled)
        print_misses(labelled)
        print_host_replans(labelled)
        print_stalls(labelled)
        held = _held_out(scorer, folder, labelled, config)
        extra = _extra_held_out(scorer, folder, args.extra_labels, config)
        hard = _extra_held_out(scorer, folder, args.hard_labels, config, HARD_LABELS)
    results = Results()
    if not args.labelled_only:
        timings: list[float] = []
        turn_timings: list[float] = []
        results = evaluate(folder, detector_factories(config, timings, turn_timings))
        print_table(results)
        print_by_exit(results)
        print_loop(results)
        print_extras(results, timings, turn_timings, time.perf_counter() - started)
    if args.sweep:
        print()
        run_sweep(folder, scorer)
    print_results(labelled, results)
    if held is not None:
        print_held_out_results(held, "stagnation")
    if extra is not None:
        print_held_out_results(extra, "stagnation_extra")
    if hard is not None:
        print_held_out_results(hard, "stagnation_hard")
    return 0


def _held_out(
    scorer: ModuleType, folder: Path, labelled: LabelledResults, config: StagnationConfig
) -> HeldOut | None:
    """The shared set's held-out figures; under ``config`` they must read what the scorer
    read."""
    labels_file = labels_dir() / "labels.jsonl"
    held = evaluate_held_out(scorer, folder, labels_file, "shared labelled set", config)
    if held is None:
        return None
    if abs(recall_within(held.pooled) - labelled.ours["recall@8"]) > 1e-9:
        raise SystemExit(
            f"the grid replay reads recall within 8 {recall_within(held.pooled):.3f} under the "
            f"defaults but the scorer read {labelled.ours['recall@8']:.3f}; alarm_steps must "
            "replay as OursAlarm does"
        )
    print_held_out(held)
    return held


def _extra_held_out(
    scorer: ModuleType,
    folder: Path,
    path: str | None,
    config: StagnationConfig,
    default: Path = EXTRA_LABELS,
) -> HeldOut | None:
    """Our own labels (``bench/data``), scored apart: the defaults, then LOSO on them."""
    labels_file = Path(path) if path else default
    if not labels_file.exists():
        print(f"no extra labels at {labels_file}; skipping them.\n")
        return None
    name = f"extra labels {labels_file.name}"
    try:
        held = evaluate_held_out(scorer, folder, labels_file, name, config)
    except SystemExit as missing:  # the scorer's "N labelled trajectories not found"
        if path:
            raise
        print(f"extra labels skipped: {missing} (other trajectories: ORGA_TRAJECTORIES).\n")
        return None
    if held is not None:
        print_held_out(held)
    return held


if __name__ == "__main__":
    raise SystemExit(main())
