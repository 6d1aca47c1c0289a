"""Quoted targets (``shared.stagnation.targets``): a request that names the same quoted object
as one made with nothing new since is a re-issue at a lower bar of shared content words."""

from __future__ import annotations

import json
import time

from shared.stagnation import ModelTurn, StagnationConfig, StagnationDetector, StagnationLevel
from shared.stagnation.plans import PlanMemory, Reissue, plan_of
from shared.stagnation.targets import quoted_targets
from shared.stagnation.verdict import ReasonCode
from tests.shared.stagnation_samples import OTHER_TARGET_REQUEST, SAME_TARGET_REQUESTS
from tests.shared.test_stagnation_trajectories import read

NO_GATE = StagnationConfig(min_steps=0)
OFF = NO_GATE.model_copy(update={"plan_target": 1.0})
RESULTS_PAGE = (
    "I clicked '10 Best Yellowstone Kid Friendly Hikes - Tales of a ...'. Here is a screenshot "
    "of [family-friendly hikes in Yellowstone recommendations - Search]. Results: Tales of a "
    "Mountain Mama, Yellowstone kid friendly hikes, Fairy Falls, Grand Prismatic overlook, "
    "Mystic Falls, Lone Star Geyser, Trout Lake, Storm Point, Bunsen Peak, Beaver Ponds."
)


def _plan(text: str) -> tuple[str, str]:
    plan = plan_of(ModelTurn(text=text))
    assert plan is not None
    return plan


def test_quoted_targets_are_quoted_spans_of_a_request_to_its_reader() -> None:
    """Two words or more in quotes, in a message that addresses its reader outside them; an
    apostrophe opens nothing, a quoted word alone or a note to oneself names no target."""
    assert quoted_targets(SAME_TARGET_REQUESTS[0]) == frozenset(
        {"10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain Mama"}
    )
    assert quoted_targets(
        "Please open Fidelity's screener and pick 'asset class' then 'emerging markets'."
    ) == frozenset({"asset class", "emerging markets"})
    assert quoted_targets(
        "Please download the \u2018Can Hiccup Supply Enough Fish to Maintain a Dragon's Diet?\u2019"
    ) == frozenset({"Can Hiccup Supply Enough Fish to Maintain a Dragon's Diet?"})
    assert quoted_targets("Please check whether 'Munich' streams on Netflix.") == frozenset()
    assert quoted_targets("I will re-run the 'test parse dates' case once more.") == frozenset()
    assert quoted_targets('I lost "your subsequent commands run in a subshell" again.') == (
        frozenset()
    ), "a 'your' inside the quote addresses nobody"


def test_the_same_quoted_target_lowers_the_bar_and_another_does_not() -> None:
    """With nothing new since, the same page asked for in other words (0.56 alike) is stale;
    the same instruction about another quoted page (0.44 alike: a batch) is a new plan, and so
    is the reworded request when the lower bar is off (``plan_target`` 1.0)."""
    first, second, _ = (_plan(text) for text in SAME_TARGET_REQUESTS)
    memory = PlanMemory(8)
    assert memory.reissue(first, 0.9, 0.6, 0.9, 0.4) is Reissue.NEW
    assert memory.reissue(second, 0.9, 0.6, 0.9, 0.4) is Reissue.STALE
    batch = PlanMemory(8)
    batch.reissue(first, 0.9, 0.6, 0.9, 0.4)
    assert batch.reissue(_plan(OTHER_TARGET_REQUEST), 0.9, 0.6, 0.9, 0.4) is Reissue.NEW
    off = PlanMemory(8)
    off.reissue(first, 0.9, 0.6, 0.9, 1.0)
    assert off.reissue(second, 0.9, 0.6, 0.9, 1.0) is Reissue.NEW


def test_the_same_target_with_few_words_in_common_is_another_request() -> None:
    """A request about the same quoted object that shares fewer than ``plan_target`` of its
    content words asks something else of it (Who&When 11: an answer naming the flavour, then
    a click on its listing, 0.09 alike): not a re-issue."""
    memory = PlanMemory(8)
    memory.reissue(
        _plan(
            "The flavors you mentioned, 'Wavy Gravy' and 'Galactica', do not show up among "
            "the current lists identified so far; the graveyard page lists older ones."
        ),
        0.9,
        0.6,
        0.9,
        0.4,
    )
    click = _plan("Please click on the 'Wavy Gravy' flavor listing to retrieve its details.")
    assert memory.reissue(click, 0.9, 0.6, 0.9, 0.4) is Reissue.NEW


def _stall(config: StagnationConfig) -> list[StagnationLevel]:
    """Who&When 38's shape: the same page asked for, WebSurfer clicks the same result and the
    results page comes back re-rendered (a new hash, no new word), the request again in other
    words; the levels after each request."""
    detector = StagnationDetector(config)
    detector.observe(read("search.html", RESULTS_PAGE))
    levels = []
    for round_, text in enumerate((*SAME_TARGET_REQUESTS, SAME_TARGET_REQUESTS[1])):
        levels.append(detector.observe_turn(ModelTurn(text=text)).level)
        detector.observe(read("search.html", f"{RESULTS_PAGE} Scrolled {'down ' * round_}"))
    assert detector.verdict().reason_codes == (ReasonCode.REISSUED_PLAN,)
    return levels


def test_a_page_asked_for_again_in_other_words_climbs_one_round_earlier() -> None:
    """The reworded second request counts: NUDGE at the third request and REPLAN at the
    fourth, one round before the paraphrase rule alone (which misses the second request)."""
    none, nudge, replan = StagnationLevel.NONE, StagnationLevel.NUDGE, StagnationLevel.REPLAN
    assert _stall(NO_GATE) == [none, none, nudge, replan]
    assert _stall(OFF) == [none, none, none, nudge]


def test_a_batch_of_other_quoted_pages_with_no_news_between_does_not_count() -> None:
    """The near miss: the same instruction about another quoted page each round, the results
    page again between (no news). Each request shares 0.44 of its words with the one before,
    enough at the lower bar, but names another object: no stale turn, no level."""
    pages = (
        "10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain Mama",
        "Best Hikes Near Bozeman - Montana Trail Guide",
        "Old Faithful Area Walks - Park Ranger Notes",
        "Lamar Valley Day Trips - Wildlife Watchers",
    )
    detector = StagnationDetector(NO_GATE)
    detector.observe(read("search.html", RESULTS_PAGE))
    for round_, name in enumerate(pages):
        text = OTHER_TARGET_REQUEST.replace("Best Hikes Near Bozeman - Montana Trail Guide", name)
        detector.observe_turn(ModelTurn(text=text))
        detector.observe(read("search.html", f"{RESULTS_PAGE} Scrolled {'down ' * round_}"))
    assert detector.counters()["stale_turns"] == 0
    assert detector.verdict().level is StagnationLevel.NONE


def test_targets_survive_a_restore_from_the_saved_state() -> None:
    """The targets are read again from the saved plans' texts: a restored detector reads the
    reworded request as the re-issue the running one reads."""
    running = StagnationDetector(NO_GATE)
    running.observe(read("search.html", RESULTS_PAGE))
    running.observe_turn(ModelTurn(text=SAME_TARGET_REQUESTS[0]))
    running.observe(read("search.html", f"{RESULTS_PAGE} Scrolled"))
    restored = StagnationDetector.from_state(None, json.loads(json.dumps(running.to_state())))
    for detector in (running, restored):
        detector.observe_turn(ModelTurn(text=SAME_TARGET_REQUESTS[1]))
    assert restored.counters()["stale_turns"] == running.counters()["stale_turns"] == 1


def test_the_target_test_stays_well_under_a_millisecond() -> None:
    """The worst case: a 600-character request against 16 remembered ones made at the same
    mark, all naming the same quoted target, none alike enough (each is compared by its
    content words and its characters): well under 1 ms of CPU per plan."""
    remembered = [
        _plan(
            f"Please open 'the field guide index' and {' '.join(f'w{n}x{k} a' for k in range(60))}"
        )
        for n in range(16)
    ]
    plan = _plan(
        f"Please open 'the field guide index' and {' '.join(f'new{k} a' for k in range(60))}"
    )
    rounds = 100
    memories = []
    for _ in range(rounds):
        memory = PlanMemory(16)
        for earlier in remembered:
            memory.reissue(earlier, 0.9, 0.6, 0.9, 0.4)
        memories.append(memory)
    started = time.process_time()
    found = [memory.reissue(plan, 0.9, 0.6, 0.9, 0.4) for memory in memories]
    per_plan = (time.process_time() - started) / rounds
    assert set(found) == {Reissue.NEW}, "the worst case: compared with all 16, no match"
    print(f"target test: {per_plan * 1e6:.0f} µs of CPU per plan against 16")
    assert per_plan < 1e-3
