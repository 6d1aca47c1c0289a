"""Whole trajectories: the wandering agent input-side detectors miss, and long honest work."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from shared.stagnation import StagnationKind, StagnationLevel, ToolEvent
from tests.shared.test_stagnation_trajectories import (
    ack,
    command,
    page,
    poll,
    read,
    replay,
    search,
    signature,
    write,
)

PARSER = "def parse(text):\n    tokens = text.split()\n    return build(tokens)\n"
BUILDER = "def build(tokens):\n    return Tree(tokens[0], tokens[1:])\n"
FAILURE = "FAILED test_parse_empty - IndexError: list index out of range\n1 failed in 0.42s"


def wandering() -> list[ToolEvent]:
    """The issue's stuck agent: reads A, greps X, rereads A, a slightly different command...

    An opening of six steps learns something each time; then 36 steps learn nothing while no
    two calls are alike: A and B re-read for other reasons, greps with other patterns returning
    the same hits, the failing test re-run with other flags, the same failure each time.
    """
    opening = [
        read("parser.py", PARSER),
        read("builder.py", BUILDER),
        search("def build", "builder.py:1: def build(tokens):"),
        command("pytest -q", FAILURE, 1),
        search("IndexError", "no matches"),
        read("tests/test_parser.py", "def test_parse_empty():\n    assert parse('') is None\n"),
    ]
    reasons = ("the empty case", "the split call", "the return value", "how tokens flow")
    flags = ("-x", "-vv", "--lf", "-k empty", "-q -x", "--tb=short", "-rA", "-p no:cacheprovider")
    stuck: list[ToolEvent] = []
    for i in range(9):
        stuck += [
            read("parser.py", PARSER, focus=reasons[i % 4], attempt=f"look {chr(97 + i)}"),
            search(f"build\\(tokens{'.' * (i + 1)}", "builder.py:1: def build(tokens):"),
            command(f"pytest {flags[i % 8]} tests/test_parser.py::{'t' * (i + 1)}", FAILURE, 1),
            read("builder.py", BUILDER, why=f"{reasons[(i + 1) % 4]} ({chr(97 + i)})"),
        ]
    return opening + stuck


def _openhands_fires(events: list[ToolEvent]) -> bool:
    """OpenHands: 4 identical (action, observation) pairs, or 3 identical erroring actions."""
    recent: deque[tuple[str, str, bool]] = deque(maxlen=4)
    for event in events:
        recent.append((signature(event), event.output, event.failed))
        pairs = list(recent)
        if len(pairs) == 4 and len({(a, o) for a, o, _ in pairs}) == 1:
            return True
        last3 = pairs[-3:]
        if len(last3) == 3 and all(e for *_, e in last3) and len({a for a, *_ in last3}) == 1:
            return True
    return False


def _gemini_fires(events: list[ToolEvent]) -> bool:
    """Gemini CLI: the last 5k call signatures are one k-cycle (k = 1..5) repeated 5 times."""
    keys = [signature(event) for event in events]
    for end in range(1, len(keys) + 1):
        for period in range(1, 6):
            tail = keys[max(0, end - 5 * period) : end]
            if len(tail) == 5 * period and all(
                tail[i] == tail[i % period] for i in range(len(tail))
            ):
                return True
    return False


def test_wandering_has_no_repeated_signature() -> None:
    """Every call of the wandering trajectory has its own signature."""
    events = wandering()
    assert len({signature(e) for e in events}) == len(events)


def test_wandering_is_missed_by_signature_detectors() -> None:
    """OpenHands- and Gemini-CLI-style detectors never fire on it."""
    events = wandering()
    assert not _openhands_fires(events)
    assert not _gemini_fires(events)


def test_wandering_is_caught_by_the_output_side() -> None:
    """Ours: no new state change after the opening, so the pressure climbs to ASK_HUMAN."""
    verdicts = replay(wandering())
    assert verdicts[5].new_state_changes == 6
    assert verdicts[-1].new_state_changes == 6
    levels = [v.level for v in verdicts]
    assert StagnationLevel.REPLAN in levels
    assert levels[-1] >= StagnationLevel.ASK_HUMAN
    replan = next(v for v in verdicts if v.level is StagnationLevel.REPLAN)
    assert replan.kind in (StagnationKind.NO_GRADIENT, StagnationKind.REPEAT)


def _progressing() -> Iterator[ToolEvent]:
    """600 steps of honest work: batch edits, the test re-run after each, paging, polling."""
    words = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "zeta", "eta")
    lines = [f"def handle_{a}_{b}(event): return route('{b}', event)" for a in words for b in words]
    contents = {f"mod_{w}.py": f"# {w}\n" for w in words}
    for round_no in range(40):
        tag = f"{words[round_no % 10]}{round_no // 10}"
        for name in list(contents)[:3]:  # a batch of edits across files
            before, after = contents[name], contents[name] + f"def fix_{tag}(): pass\n"
            contents[name] = after
            yield write(name, before, after)
        yield command("pytest -q", f"FAILED test_{tag}\n{round_no + 1} failed in 0.5s", 1)
        yield page("routes.py", lines, 1 + (round_no % 10) * 10, 10)
        yield poll("ci-42", f"stage {tag}: {'pending' if round_no % 2 else 'running'}")
        yield read(f"mod_{words[round_no % 10]}.py", contents[f"mod_{words[round_no % 10]}.py"])
        yield ack(f"mkdir -p out/{tag}")
        yield search(f"fix_{tag}", f"mod_alpha.py:{round_no + 2}: def fix_{tag}(): pass")
        yield read("README.md", "# project\nrun pytest\n")  # the same page, re-read each round
        yield command("git status --short", "M mod_alpha.py\nM mod_beta.py\nM mod_delta.py")
        yield ack("true")
        yield command("pytest -q", f"FAILED test_{tag}\n{round_no + 1} failed in 0.6s", 1)
        yield read("routes.py", "\n".join(lines[:10]))


def test_long_progressing_trajectory_never_reaches_a_human() -> None:
    """Hundreds of steps with real changes between re-reads never ask a human.

    Writes no longer reset the stale run (a change counts once its effect shows), and from the
    eleventh round on more than half of each round re-observes known content (the README, git
    status, the test re-run, a page read ten rounds before): the leaky stale run then peaks at
    a REPLAN now and then, and drains with the next new results.
    """
    events = list(_progressing())
    assert len(events) >= 500
    verdicts = replay(events)
    assert max(v.level for v in verdicts) <= StagnationLevel.REPLAN
    assert verdicts[-1].new_state_changes > 200
    assert max(v.level for v in verdicts[:130]) <= StagnationLevel.NUDGE
