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
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stagnation_baselines import (  # noqa: E402
    GeminiCycleBaseline,
    OpenHandsBaseline,
    StepBudgetBaseline,
)

from shared.stagnation import (  # noqa: E402
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)

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
    """One tool step: the index in the trajectory, our event, and the raw text for baselines."""

    index: int
    event: ToolEvent
    action: str
    observation: str


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- shell commands (SWE-agent and mini-swe-agent) ----------------------------------------------

_HEREDOC = re.compile(r"(<<-?\s*(['\"]?)(\w+)\2[^\n]*)\n.*?\n\s*\3[ \t]*(?=\n|$)", re.S)
_PREFIX = re.compile(r"^\s*(?:(?:cd\s+[^\s;&|]+|[A-Z_][A-Z0-9_]*=\S+)\s*(?:&&|;|\n)?\s*)+")
_SHELL_WRITE = (
    re.compile(r"\bsed\s+(?:-[a-zA-Z]*i\b|--in-place)"),
    re.compile(r"(?<![0-9&<>])>{1,2}\s*(?!&|/dev/null)[^\s|;&<>]+"),
    re.compile(r"\btee\b"),
    re.compile(r"(?:^|&&|;|\|\||\n)\s*(?:rm|mv|cp|mkdir|touch|patch|chmod|ln|ed)\b"),
    re.compile(r"\bgit\s+(?:apply|checkout|reset|stash|mv|rm)\b"),
)
_REDIRECT_TARGET = re.compile(r"(?<![0-9&<>])>{1,2}\s*(?!&|/dev/null)([^\s|;&<>]+)")
_ACI_READS = ("open", "goto", "scroll_down", "scroll_up", "search_file", "search_dir", "find_file")
_READ_COMMANDS = frozenset(
    (
        *_ACI_READS,
        *("ls", "cat", "grep", "rg", "find", "head", "tail", "pwd", "which", "printenv", "env"),
        *("locate", "apt-cache", "wc", "tree", "less", "more", "nl", "diff", "file", "stat"),
        *("sed", "awk"),
    )
)
_READ_GIT = re.compile(r"^git\s+(?:status|diff|log|show|grep|blame|ls-files)\b")
_SWE_WRITE_COMMANDS = frozenset({"edit", "create"})
_SWE_TOOLS = frozenset((*_ACI_READS, "edit", "create", "submit", "exit_cost"))
_OTHER_COMMANDS = frozenset({"exit_cost", "submit", "exit_context", "exit_format", "exit_error"})


def _strip_heredocs(command: str) -> str:
    return _HEREDOC.sub(r"\1", command)


def _first_word(command: str) -> str:
    rest = _PREFIX.sub("", command, count=1).strip()
    return rest.split()[0] if rest.split() else ""


def shell_kind(command: str) -> tuple[ToolKind, str | None]:
    """read / write / command / other for one shell command line, and the written path."""
    outside = _strip_heredocs(command)
    word = _first_word(outside)
    if word in _SWE_WRITE_COMMANDS:
        return ToolKind.WRITE, None
    if any(p.search(outside) for p in _SHELL_WRITE):
        target = _REDIRECT_TARGET.search(outside)
        return ToolKind.WRITE, target.group(1) if target else None
    if word in _OTHER_COMMANDS or not word:
        return ToolKind.OTHER, None
    if word in _READ_COMMANDS or _READ_GIT.match(_PREFIX.sub("", outside, count=1).strip()):
        return ToolKind.READ, None
    return ToolKind.COMMAND, None


# -- SWE-agent 0.x -----------------------------------------------------------------------------

_SWE_ERROR = re.compile(
    r"^/bin/bash: line \d+:|^Usage: |^Error: |^No file open|^File .* not found"
    r"|Your proposed edit has introduced|Traceback \(most recent call last\)"
    r"|EXECUTION TIMED OUT|: command not found|BUILD FAILURE",
    re.M,
)
_SWE_FILE = re.compile(r"^\[File: (\S+) \(")


def swe_agent_steps(trajectory: dict[str, Any]) -> list[ReplayStep]:
    """SWE-agent: shell and ACI commands; a successful edit/create shows the file afterwards."""
    steps = []
    for raw in trajectory["steps"]:
        if raw["observation"] is None:
            continue
        action, observation = raw["action"].strip(), raw["observation"]
        kind, path = shell_kind(action)
        failed = bool(_SWE_ERROR.search(observation))
        after = None
        if kind is ToolKind.WRITE and _first_word(action) in _SWE_WRITE_COMMANDS:
            shown = _SWE_FILE.match(observation)
            path = shown.group(1) if shown else path
            failed = failed or shown is None
            after = None if failed else _sha(observation)
        word = _first_word(action)
        event = ToolEvent(
            tool_name=word if word in _SWE_TOOLS else "bash",
            arguments={"command": action},
            output=observation,
            kind=kind,
            path=path,
            after_hash=after,
            is_error=failed,
        )
        steps.append(ReplayStep(raw["i"], event, action, observation))
    return steps


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


def mini_swe_steps(trajectory: dict[str, Any]) -> list[ReplayStep]:
    """mini-swe-agent: one bash command per step, ``<returncode>N</returncode>`` parsed."""
    steps = []
    for raw in trajectory["steps"]:
        if raw["observation"] is None:
            continue
        action, observation = raw["action"], raw["observation"]
        exit_code, output = _mini_output(observation)
        kind, path = shell_kind(action) if action.strip() else (ToolKind.OTHER, None)
        event = ToolEvent(
            tool_name="bash",
            arguments={"command": action},
            output=output,
            exit_code=exit_code,
            kind=kind,
            path=path,
            is_error=observation.startswith(_RUNTIME_ERROR),
        )
        steps.append(ReplayStep(raw["i"], event, action, observation))
    return steps


# -- tau-bench (function calls) -----------------------------------------------------------------

_TAU_WRITE = ("book_", "update_", "cancel_", "send_", "transfer_")


def _tau_kind(tool: str) -> ToolKind:
    return ToolKind.WRITE if tool.startswith(_TAU_WRITE) else ToolKind.READ


def tau_steps(trajectory: dict[str, Any]) -> list[ReplayStep]:
    """tau-bench: tool calls with their outputs; a reply to the user gets the user's answer."""
    steps = []
    for raw in trajectory["steps"]:
        action, observation = raw["action"], raw["observation"] or ""
        tool = raw["tool"]
        if tool is None:
            event = ToolEvent(tool_name="say", arguments={"text": action[4:]}, output=observation)
        else:
            args = json.loads(action[len(tool) + 1 :] or "{}")
            failed = observation.startswith("Error")
            kind = _tau_kind(tool)
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
        steps.append(ReplayStep(raw["i"], event, action, observation))
    return steps


# -- Who&When (multi-agent chat logs) -----------------------------------------------------------

_WW_TERMINALS = ("Computer_terminal", "ComputerTerminal")
_WW_READERS = ("WebSurfer", "FileSurfer")
_WW_EXIT = re.compile(r"exitcode: (-?\d+)")


def who_when_steps(trajectory: dict[str, Any]) -> list[ReplayStep]:
    """Who&When: tool agents' messages are the observations of the message that asked for them.

    Messages written by a model (orchestrator, experts) or the human are not tool events and
    are skipped; a terminal message becomes a command (exit code parsed), a web or file surfer
    message a read. Its arguments are the last message that asked for it (the orchestrator's
    private "(thought)" messages such as "Next speaker WebSurfer" are not requests).
    """
    steps, request = [], ""
    for raw in trajectory["steps"]:
        actor, text = raw["actor"] or "", raw["action"] or ""
        if not actor.startswith(_WW_TERMINALS + _WW_READERS):
            if "(thought)" not in actor:  # "Next speaker WebSurfer" is not the request
                request = text
            continue
        code = _WW_EXIT.search(text[:200])
        terminal = actor.startswith(_WW_TERMINALS)
        event = ToolEvent(
            tool_name=actor.split(" ")[0],
            arguments={"request": request},
            output=text,
            exit_code=int(code.group(1)) if terminal and code else None,
            kind=ToolKind.COMMAND if terminal else ToolKind.READ,
        )
        steps.append(ReplayStep(raw["i"], event, request, text))
    return steps


MAPPERS: dict[str, Callable[[dict[str, Any]], list[ReplayStep]]] = {
    "mini-swe-agent-gemini3pro-verified": mini_swe_steps,
    "swe-agent-java-5models": swe_agent_steps,
    "tau-bench-gpt4o-airline": tau_steps,
    "who-and-when": who_when_steps,
}


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
    name: str = "ours"
    detector: StagnationDetector = field(init=False)
    replan_kind: StagnationKind | None = None

    def __post_init__(self) -> None:
        self.detector = StagnationDetector(self.config)

    def observe_event(self, event: ToolEvent) -> StagnationLevel:
        """Observe one event, recording its cost; the level after it."""
        started = time.perf_counter()
        verdict = self.detector.observe(event)
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
            level = detector.observe_event(step.event)
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
    config: StagnationConfig, timings: list[float]
) -> dict[str, DetectorFactory]:
    """Fresh detectors per run: ours (sharing one list of timings) and the three baselines."""
    return {
        "ours": lambda: Ours(config, timings),
        "openhands": OpenHandsBaseline,
        "gemini-cli": GeminiCycleBaseline,
        "step-75%": StepBudgetBaseline,
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


def evaluate(
    folder: Path, factories: dict[str, DetectorFactory], datasets: tuple[str, ...] = DATASETS
) -> Results:
    """Replay every trajectory of ``datasets`` through every detector."""
    results = Results()
    for dataset in datasets:
        for trajectory in load(folder, dataset):
            steps = MAPPERS[dataset](trajectory)
            results.steps[dataset] += len(steps)
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


def print_extras(results: Results, timings: list[float], elapsed_s: float) -> None:
    """Kinds at first REPLAN, and costs."""
    for (dataset, name), tally in results.tallies.items():
        if name == "ours" and tally.kinds:
            kinds = ", ".join(f"{k} {v}" for k, v in tally.kinds.most_common())
            print(f"ours, kind at first REPLAN, {dataset}: {kinds}")
    ordered = sorted(timings)
    if ordered:
        mean = 1e6 * sum(ordered) / len(ordered)
        median = 1e6 * ordered[len(ordered) // 2]
        p99 = 1e6 * ordered[int(len(ordered) * 0.99)]
        print(
            f"\n{sum(results.steps.values())} tool steps replayed; ours: {mean:.0f} µs per "
            f"observation on average (median {median:.0f} µs, p99 {p99:.0f} µs)"
        )
    print(f"whole evaluation: {elapsed_s:.1f} s")


# -- threshold sweep ----------------------------------------------------------------------------


def sweep_configs() -> dict[str, StagnationConfig]:
    """The defaults and one-at-a-time variations of the thresholds that matter most."""
    base = StagnationConfig()
    ladder = base.stale.model_copy
    return {
        "defaults": base,
        "stale 5/8/12/20": base.model_copy(
            update={"stale": ladder(update={"nudge": 5, "replan": 8, "ask_human": 12, "abort": 20})}
        ),
        "stale 4/6/10/16": base.model_copy(
            update={"stale": ladder(update={"nudge": 4, "replan": 6, "ask_human": 10, "abort": 16})}
        ),
        "repeat+error 3/4/6/10": base.model_copy(
            update={
                "repeat": base.repeat.model_copy(update={"replan": 4, "ask_human": 6, "abort": 10}),
                "error": base.error.model_copy(update={"replan": 4, "ask_human": 6, "abort": 10}),
            }
        ),
        "min_steps 5": base.model_copy(update={"min_steps": 5}),
        "min_steps 20": base.model_copy(update={"min_steps": 20}),
    }


def run_sweep(folder: Path) -> None:
    """Our detector alone, per config, on the two SWE datasets and the known loop."""
    datasets = ("mini-swe-agent-gemini3pro-verified", "swe-agent-java-5models")
    print(
        f"{'config':<22} {'gemini R>=ASK':>13} {'gemini U>=REPLAN':>16} "
        f"{'java budget>=REPLAN':>19} {'java submitted>=ASK':>19} {'loop->REPLAN':>12}"
    )
    for name, config in sweep_configs().items():
        factories: dict[str, DetectorFactory] = {"ours": partial(Ours, config)}
        results = evaluate(folder, factories, datasets)
        gemini = results.tallies[(datasets[0], "ours")]
        java = results.by_exit["ours"]
        loop = results.loop.get("ours")
        start = results.loop_start or 0
        to_replan = "never" if loop is None or loop.replan is None else f"+{loop.replan - start}"
        print(
            f"{name:<22} {_share(gemini.ask['R'], gemini.runs['R']):>13} "
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
    args = parser.parse_args(argv)
    folder = trajectories_dir()
    if not folder.is_dir():
        print(f"stagnation_eval: no trajectories at {folder}; set ORGA_TRAJECTORIES. Skipping.")
        return 0
    config = _load_config(args.config)
    timings: list[float] = []
    started = time.perf_counter()
    results = evaluate(folder, detector_factories(config, timings))
    print(f"trajectories: {folder}\nconfig: {config.model_dump_json()}\n")
    print_table(results)
    print_by_exit(results)
    print_loop(results)
    print_extras(results, timings, time.perf_counter() - started)
    if args.sweep:
        print()
        run_sweep(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
