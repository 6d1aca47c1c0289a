"""Paraphrased re-issues (``shared.stagnation.paraphrase``) and turns that follow no news."""

from __future__ import annotations

import time

from shared.stagnation import ModelTurn, StagnationConfig, StagnationDetector, StagnationLevel
from shared.stagnation.paraphrase import content_words, paraphrase_similarity
from shared.stagnation.verdict import ReasonCode
from tests.shared.stagnation_samples import REWORDED_REQUESTS
from tests.shared.test_stagnation_trajectories import read

NO_GATE = StagnationConfig(min_steps=0)


def test_content_words_drop_function_words_and_endings() -> None:
    """Function and instruction words go, a plural or -ing/-ed ending is cut, case is folded."""
    assert content_words("Please search for the Shipping rates of DVDs") == frozenset(
        {"shipp", "rate", "dvd"}
    )
    assert content_words("a to of") == frozenset()


def test_a_plural_in_ies_is_the_word_itself() -> None:
    """A plural in -ies is its -y word, "families" is "family" (cutting the -s left "familie");
    a short word ("ties") keeps the plain plural rule."""
    assert content_words("families cities") == content_words("family city")
    assert content_words("family city") == frozenset({"family", "city"})
    assert content_words("ties") == frozenset({"tie"})


# Who&When 38, shortened: the orchestrator asks again for the same page while WebSurfer clicks
# the same search result and stays on the results page.
HIKES_REQUESTS = (
    "Please visit the '10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain Mama' page "
    "and gather the list of top recommended family-friendly hikes.",
    "Please click on and explore the '10 Best Yellowstone Kid Friendly Hikes - Tales of a "
    "Mountain Mama' link to gather the names of the specific hikes recommended for families.",
)


def test_a_request_reworded_with_a_plural_is_a_reissue() -> None:
    """The same page asked for again, "family" become "families" and "visit" become "click
    on and explore": the same request, so with nothing new since it is a stale turn."""
    first, second = (content_words(text) for text in HIKES_REQUESTS)
    assert paraphrase_similarity(first, second) >= 0.6
    detector = StagnationDetector(NO_GATE)
    for text in HIKES_REQUESTS:
        detector.observe_turn(ModelTurn(text=text))
    assert detector.counters()["stale_turns"] == 1


def test_a_batch_over_plural_names_stays_apart() -> None:
    """A batch asks the same question of other entities whose names share a plural
    ("companies"): the entities differ, so no request re-issues another, with no news between."""
    batch = (
        "Please list the bus companies serving Albany.",
        "Please list the ferry companies serving Galveston Island.",
        "Please list the rail companies serving Burlington, Vermont.",
        "Please list the taxi companies serving Savannah airport.",
    )
    words = [content_words(text) for text in batch]
    assert all(paraphrase_similarity(words[0], other) < 0.6 for other in words[1:])
    detector = StagnationDetector(NO_GATE)
    levels = [detector.observe_turn(ModelTurn(text=text)).level for text in batch]
    assert levels == [StagnationLevel.NONE] * 4
    assert detector.counters()["stale_turns"] == 0


def test_paraphrases_read_alike_and_batches_do_not() -> None:
    """Reworded requests share most content words; the same sentence about another film (a
    batch) shares only the instruction's words, and an empty text is like nothing."""
    first, second, third, _ = (content_words(text) for text in REWORDED_REQUESTS)
    assert paraphrase_similarity(first, second) == 1.0
    assert paraphrase_similarity(first, third) >= 0.6
    munich = content_words("Please check the availability of 'Munich' on Netflix (US).")
    royale = content_words("Please check the availability of 'Casino Royale' on Netflix (US).")
    assert paraphrase_similarity(munich, royale) < 0.6
    assert paraphrase_similarity(frozenset(), munich) == 0.0


def test_a_reworded_request_with_nothing_new_since_climbs_the_plan_ladder() -> None:
    """Character similarity sees four plans; content words see one request asked four times
    with nothing new come back: the third re-issue reaches REPLAN, from ``reissued_plan``."""
    detector = StagnationDetector(NO_GATE)
    levels = [detector.observe_turn(ModelTurn(text=text)).level for text in REWORDED_REQUESTS]
    assert levels == [
        StagnationLevel.NONE,
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
    ]
    assert detector.verdict().reason_codes == (ReasonCode.REISSUED_PLAN,)
    strict = StagnationDetector(NO_GATE.model_copy(update={"plan_paraphrase": 1.0}))
    for text in REWORDED_REQUESTS:
        strict.observe_turn(ModelTurn(text=text))
    assert strict.counters()["stale_turns"] == 1, "only the same content words count then"


def test_a_reworded_request_after_news_is_a_new_plan() -> None:
    """The same request asked again after a page that says something new is fair: no count."""
    detector = StagnationDetector(NO_GATE)
    pages = ("Priority Mail International", "First-Class Package", "Global Express", "Flat Rate")
    for text, page in zip(REWORDED_REQUESTS, pages, strict=True):
        detector.observe_turn(ModelTurn(text=text))
        detector.observe(read(f"rates/{page}.html", f"USPS service offered: {page}"))
    assert detector.counters()["stale_turns"] == 0
    assert detector.verdict().level is StagnationLevel.NONE


def test_replies_with_no_news_between_do_not_drain_the_count() -> None:
    """A conversation stall: self-reports between other replies, no tool result at all. The
    other replies follow no news, so they take nothing off and the ladder climbs (each report
    also stands unanswered, ``plan_unanswered``: it counts once more at the reply after it)."""
    replies = (
        "I can help once I have the reservation number of the booking.",
        "Basic economy bookings cannot be changed, only cancelled within the rules.",
        "Certificates can be combined with a gift card on one booking.",
    )
    for config, stale_turns, level in (
        (NO_GATE.model_copy(update={"plan_unanswered": False}), 3, StagnationLevel.REPLAN),
        (NO_GATE, 6, StagnationLevel.ASK_HUMAN),
    ):
        detector = StagnationDetector(config)
        for reply in replies:
            detector.observe_turn(ModelTurn(text="We are going round in circles.", stuck=True))
            detector.observe_turn(ModelTurn(text=reply))
        assert detector.counters()["stale_turns"] == stale_turns
        assert detector.verdict().level is level


def test_the_turn_mark_survives_a_restore() -> None:
    """The mark of the last turn is saved: a restored detector drains exactly as the original
    (the unanswered report, which would count once more at this reply, is off here; its own
    restore is tested in ``test_stagnation_unanswered.py``)."""
    config = NO_GATE.model_copy(update={"plan_unanswered": False})
    original = StagnationDetector(config)
    original.observe_turn(ModelTurn(text="We are stuck.", stuck=True))
    restored = StagnationDetector.from_state(config, original.to_state())
    for detector in (original, restored):
        detector.observe_turn(ModelTurn(text="Write to the agency and ask for the ridership."))
    assert original.counters() == restored.counters()
    assert restored.counters()["stale_turns"] == 1


def test_content_words_cost_well_under_a_millisecond() -> None:
    """A 600-character plan against 16 remembered ones: well under 1 ms per turn."""
    text = " ".join(REWORDED_REQUESTS) * 3
    started = time.perf_counter()
    for _ in range(200):
        words = content_words(text[:600])
        for _ in range(16):
            paraphrase_similarity(words, words)
    per_turn = (time.perf_counter() - started) / 200
    assert per_turn < 1e-3, f"{per_turn * 1e6:.0f} µs per turn"
