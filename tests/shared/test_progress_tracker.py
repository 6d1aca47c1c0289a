"""Progress tracker: Symbiont's test catalogue (§13.2), §10's messages and values, the volatile
normalisation, the persisted state, and the bounded cost on long errors."""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.events import StepLimitReached
from shared.progress_tracker import (
    EXACT_SIMILARITY_MAX_CHARS,
    LimitAction,
    ProgressTracker,
    ProgressTrackerState,
    StepDecision,
    StepIterationConfig,
    StepProgress,
    normalized_similarity,
    similarity_at_least,
)
from shared.volatile import normalize_volatile

BASH_334 = "/bin/bash: line 334: cd: fastxml/: No such file or directory"
BASH_352 = "/bin/bash: line 352: cd: fastxml/: No such file or directory"


def _tracker(**config: object) -> ProgressTracker:
    tracker = ProgressTracker(StepIterationConfig.model_validate(config))
    tracker.begin_step("step1")
    return tracker


def _stuck_reason(similarity: str, threshold: str = "85%") -> str:
    return (
        f"Step 'step1' appears stuck: consecutive errors are {similarity} similar"
        f" (threshold: {threshold})"
    )


# --- §13.2 ------------------------------------------------------------------------------


def test_levenshtein_identical() -> None:
    """Identical strings are 1.0 similar."""
    assert normalized_similarity("hello", "hello") == 1.0


def test_levenshtein_empty_both() -> None:
    """Two empty strings are 1.0 similar."""
    assert normalized_similarity("", "") == 1.0


def test_levenshtein_one_empty() -> None:
    """One empty string against a non-empty one is 0.0, either way round."""
    assert normalized_similarity("", "hello") == 0.0
    assert normalized_similarity("hello", "") == 0.0


def test_levenshtein_similar() -> None:
    """kitten/sitting is 4/7, strictly between 0.5 and 0.6."""
    assert 0.5 < normalized_similarity("kitten", "sitting") < 0.6
    assert normalized_similarity("kitten", "sitting") == pytest.approx(4 / 7)


def test_levenshtein_completely_different() -> None:
    """abc/xyz is 0.0."""
    assert normalized_similarity("abc", "xyz") < 0.1


def test_continue_on_first_attempt() -> None:
    """A freshly begun step continues."""
    assert _tracker().should_continue("step1") == StepDecision.continue_()


def test_stop_at_max_attempts() -> None:
    """With max 2 the first attempt continues and the second stops."""
    tracker = _tracker(max_reattempts_per_step=2)
    tracker.record_attempt("step1", "error A")
    assert not tracker.should_continue("step1").stop
    tracker.record_attempt("step1", "error B")
    decision = tracker.should_continue("step1")
    assert decision.stop
    assert decision.reason == "Step 'step1' reached max reattempts (2)"


def test_stop_on_similar_errors() -> None:
    """The same error twice in a row stops the step as stuck."""
    tracker = _tracker(max_reattempts_per_step=10, similarity_threshold=0.85)
    tracker.record_attempt("step1", "connection timeout to api.example.com:443")
    decision = tracker.record_and_check("step1", "connection timeout to api.example.com:443")
    assert decision == StepDecision.stop_because(_stuck_reason("100%"))


def test_continue_on_different_errors() -> None:
    """Two unrelated errors in a row do not stop the step."""
    tracker = _tracker(max_reattempts_per_step=10, similarity_threshold=0.85)
    tracker.record_attempt("step1", "connection timeout to api.example.com")
    decision = tracker.record_and_check("step1", "permission denied for /etc/secret")
    assert decision == StepDecision.continue_()


def test_begin_step_resets() -> None:
    """Beginning a step again sets its count back to 0."""
    tracker = _tracker()
    tracker.record_attempt("step1", "error")
    assert tracker.attempt_count("step1") == 1
    tracker.begin_step("step1")
    assert tracker.attempt_count("step1") == 0


def test_reset_step_removes() -> None:
    """Resetting a step forgets it."""
    tracker = _tracker()
    tracker.record_attempt("step1", "error")
    tracker.reset_step("step1")
    assert tracker.attempt_count("step1") == 0
    assert tracker.to_state() == {"steps": {}}


def test_default_config_values() -> None:
    """Defaults: 2 reattempts, threshold 0.85, skip the step, normalise volatile tokens."""
    config = StepIterationConfig()
    assert config.max_reattempts_per_step == 2
    assert config.similarity_threshold == 0.85
    assert config.on_limit_reached is LimitAction.SKIP_STEP
    assert config.normalize_volatile is True
    assert ProgressTracker().limit_action is LimitAction.SKIP_STEP


# --- §10 values and messages -------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("kitten", "sitting", 0.571429),
        ("abc", "xyz", 0.0),
        ("abc", "ABC", 0.0),
        ("héllo", "hello", 0.8),
        ("error A", "error B", 0.857143),
        ("Error: timeout after 30s", "Error: timeout after 31s", 0.958333),
        ("connection timeout to api.example.com", "permission denied for /etc/secret", 0.216216),
        ("😀a", "a", 0.5),  # code points, not UTF-8 bytes or UTF-16 units
    ],
)
def test_similarity_table(a: str, b: str, expected: float) -> None:
    """The values of §10's table, to six decimals, in both orders."""
    assert normalized_similarity(a, b) == pytest.approx(expected, abs=5e-7)
    assert normalized_similarity(b, a) == normalized_similarity(a, b)


def test_similarity_is_not_normalised() -> None:
    """``normalized_similarity`` is the raw metric: line numbers still count."""
    assert normalized_similarity("line 334", "line 352") == 0.75


@pytest.mark.parametrize("normalize", [True, False])
def test_error_a_error_b_is_86_percent(normalize: bool) -> None:
    """``error A``/``error B`` is 6/7 ≥ 0.85: stuck at 86%, with or without the masking."""
    assert normalize_volatile("error A") == "error A"
    tracker = _tracker(max_reattempts_per_step=10, normalize_volatile=normalize)
    tracker.record_attempt("step1", "error A")
    decision = tracker.record_and_check("step1", "error B")
    assert decision.reason == _stuck_reason("86%")


def test_threshold_is_inclusive() -> None:
    """A similarity exactly equal to the threshold counts as stuck."""
    tracker = _tracker(max_reattempts_per_step=10, similarity_threshold=6 / 7)
    tracker.record_attempt("step1", "error A")
    assert tracker.record_and_check("step1", "error B").stop


def test_just_below_threshold_continues() -> None:
    """A similarity a hair below the threshold does not."""
    threshold = 6 / 7 + 1e-12
    tracker = _tracker(max_reattempts_per_step=10, similarity_threshold=threshold)
    tracker.record_attempt("step1", "error A")
    assert tracker.record_and_check("step1", "error B") == StepDecision.continue_()


def test_stuck_check_runs_before_count_check() -> None:
    """When both apply, the stuck message wins, and the stuck attempt is counted."""
    tracker = _tracker(max_reattempts_per_step=2)
    tracker.record_attempt("step1", "boom")
    decision = tracker.record_and_check("step1", "boom")
    assert decision.reason == _stuck_reason("100%")
    assert tracker.attempt_count("step1") == 2


def test_count_limit_through_record_and_check() -> None:
    """Different errors stop at the count limit, inclusive."""
    tracker = _tracker(max_reattempts_per_step=2)
    assert tracker.record_and_check("step1", "first failure") == StepDecision.continue_()
    decision = tracker.record_and_check("step1", "a completely unrelated problem")
    assert decision.reason == "Step 'step1' reached max reattempts (2)"
    assert tracker.attempt_count("step1") == 2


def test_max_zero_stops_a_fresh_step() -> None:
    """With ``max_reattempts_per_step=0`` a freshly begun step is already stopped."""
    tracker = _tracker(max_reattempts_per_step=0)
    assert tracker.should_continue("step1").reason == "Step 'step1' reached max reattempts (0)"


def test_unknown_step_always_continues() -> None:
    """An unknown step continues, and recording on it creates nothing."""
    tracker = ProgressTracker(StepIterationConfig(max_reattempts_per_step=0))
    assert tracker.should_continue("ghost") == StepDecision.continue_()
    tracker.record_attempt("ghost", "error")
    assert tracker.record_and_check("ghost", "error") == StepDecision.continue_()
    assert tracker.attempt_count("ghost") == 0
    assert tracker.to_state() == {"steps": {}}
    tracker.reset_step("ghost")


def test_only_consecutive_errors_are_compared() -> None:
    """A, B, A: each error is compared with the one just before, not with older ones."""
    tracker = _tracker(max_reattempts_per_step=10)
    tracker.record_attempt("step1", "connection refused by database host")
    assert not tracker.record_and_check("step1", "permission denied on /etc/app.yaml").stop
    assert not tracker.record_and_check("step1", "connection refused by database host").stop
    assert tracker.attempt_count("step1") == 3


def test_a_stuck_error_becomes_the_last_error() -> None:
    """After a stuck Stop, the next comparison is against the new error."""
    tracker = _tracker(max_reattempts_per_step=10)
    tracker.record_attempt("step1", "error A")
    assert tracker.record_and_check("step1", "error B").stop
    assert tracker.to_state()["steps"]["step1"] == {"attempts": 2, "last_error": "error B"}


def test_recording_no_error_clears_the_last_one() -> None:
    """``record_attempt(id, None)`` forgets the last error, so nothing is compared next."""
    tracker = _tracker(max_reattempts_per_step=10)
    tracker.record_attempt("step1", "boom")
    tracker.record_attempt("step1", None)
    assert tracker.record_and_check("step1", "boom") == StepDecision.continue_()


def test_steps_are_independent() -> None:
    """Errors of one step are never compared with those of another."""
    tracker = _tracker(max_reattempts_per_step=10)
    tracker.begin_step("step2")
    tracker.record_attempt("step1", "boom")
    assert tracker.record_and_check("step2", "boom") == StepDecision.continue_()
    assert tracker.attempt_count("step2") == 1


def test_percentages_round_like_rust() -> None:
    """Thresholds and similarities print with no decimals (85.000…01 → 85, 85.71 → 86)."""
    tracker = _tracker(max_reattempts_per_step=10, similarity_threshold=0.8)
    tracker.record_attempt("step1", "héllo")
    assert tracker.record_and_check("step1", "hello").reason == _stuck_reason("80%", "80%")


# --- limit action ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "action"),
    [
        ("SkipStep", LimitAction.SKIP_STEP),
        ("AbortTask", LimitAction.ABORT_TASK),
        ("Escalate", LimitAction.ESCALATE),
        ("skip_step", LimitAction.SKIP_STEP),
        ("abort_task", LimitAction.ABORT_TASK),
        ("escalate", LimitAction.ESCALATE),
        (LimitAction.ABORT_TASK, LimitAction.ABORT_TASK),
    ],
)
def test_limit_action_spellings(spelling: str, action: LimitAction) -> None:
    """Symbiont's variant names and our values are both accepted; ours are written out."""
    config = StepIterationConfig.model_validate({"on_limit_reached": spelling})
    assert config.on_limit_reached is action
    assert ProgressTracker(config).limit_action is action
    assert json.loads(config.model_dump_json())["on_limit_reached"] == action.value


def test_unknown_limit_action_is_rejected() -> None:
    """An unknown action is a validation error."""
    with pytest.raises(ValidationError):
        StepIterationConfig.model_validate({"on_limit_reached": "Retry"})


@pytest.mark.parametrize(
    "config",
    [
        {"max_reattempts_per_step": -1},
        {"similarity_threshold": 1.5},
        {"similarity_threshold": -0.1},
    ],
)
def test_invalid_limits_are_rejected(config: dict[str, object]) -> None:
    """Negative attempts and thresholds outside [0, 1] are validation errors."""
    with pytest.raises(ValidationError):
        StepIterationConfig.model_validate(config)


# --- volatile normalisation --------------------------------------------------------------


def test_bash_line_numbers_are_the_same_error() -> None:
    """The 53-step loop: errors that differ only by a bash line number are 100% similar."""
    tracker = _tracker(max_reattempts_per_step=100, similarity_threshold=1.0)
    tracker.record_attempt("step1", BASH_334)
    decision = tracker.record_and_check("step1", BASH_352)
    assert decision.reason == _stuck_reason("100%", "100%")


def test_without_normalisation_line_numbers_count() -> None:
    """With ``normalize_volatile`` off, the same pair is not identical."""
    tracker = _tracker(
        max_reattempts_per_step=100, similarity_threshold=1.0, normalize_volatile=False
    )
    tracker.record_attempt("step1", BASH_334)
    assert tracker.record_and_check("step1", BASH_352) == StepDecision.continue_()


@pytest.mark.parametrize(("normalize", "stuck"), [(True, True), (False, False)])
def test_short_errors_differing_by_a_number(normalize: bool, stuck: bool) -> None:
    """``line 334``/``line 352`` is 75% raw: stuck only after masking the numbers."""
    tracker = _tracker(max_reattempts_per_step=100, normalize_volatile=normalize)
    tracker.record_attempt("step1", "line 334")
    assert tracker.record_and_check("step1", "line 352").stop is stuck


def test_a_loop_of_bash_errors_is_caught_on_the_second_attempt() -> None:
    """A retry loop whose outputs differ only by line numbers stops at once."""
    tracker = _tracker(max_reattempts_per_step=53)
    tracker.record_attempt("step1", BASH_334.replace("334", "300"))
    decision = tracker.record_and_check("step1", BASH_334)
    assert decision.stop
    assert tracker.attempt_count("step1") == 2


# --- state -------------------------------------------------------------------------------


def test_state_round_trips_through_json() -> None:
    """A tracker restored from its JSON state has the same steps, in order, and decides alike."""
    config = StepIterationConfig(max_reattempts_per_step=3)
    tracker = ProgressTracker(config)
    for step_id in ("b", "a", "c"):
        tracker.begin_step(step_id)
    tracker.record_attempt("b", "error A")
    tracker.record_attempt("a", None)
    tracker.record_attempt("a", "x")
    raw = json.dumps(tracker.to_state())
    restored = ProgressTracker.from_state(config, json.loads(raw))
    assert restored.to_state() == tracker.to_state()
    assert list(restored.to_state()["steps"]) == ["b", "a", "c"]
    assert restored.record_and_check("b", "error B") == tracker.record_and_check("b", "error B")
    assert restored.attempt_count("a") == 2
    assert restored.record_and_check("a", "y") == tracker.record_and_check("a", "y")


def test_state_json_shape_and_model_input() -> None:
    """The state is plain JSON; ``from_state`` also takes the model, and ``{}`` is empty."""
    tracker = _tracker()
    tracker.record_attempt("step1", "boom")
    assert tracker.to_state() == {"steps": {"step1": {"attempts": 1, "last_error": "boom"}}}
    model = ProgressTrackerState(steps={"step1": StepProgress(attempts=1, last_error="boom")})
    restored = ProgressTracker.from_state(None, model)
    assert restored.config == StepIterationConfig()
    assert restored.record_and_check("step1", "boom").stop
    assert ProgressTracker.from_state(None, {}).to_state() == {"steps": {}}


def test_invalid_state_is_rejected() -> None:
    """A state with a negative count does not validate."""
    with pytest.raises(ValidationError):
        ProgressTracker.from_state(None, {"steps": {"s": {"attempts": -1}}})


# --- StepLimitReached --------------------------------------------------------------------


def test_step_limit_reached_from_a_stop() -> None:
    """A Stop builds the event with the step, the attempts and the reason."""
    tracker = _tracker(max_reattempts_per_step=1)
    decision = tracker.record_and_check("step1", "boom")
    event = StepLimitReached.from_decision("step1", tracker.attempt_count("step1"), decision)
    assert event == StepLimitReached(
        step_id="step1", attempts=1, reason="Step 'step1' reached max reattempts (1)"
    )


def test_step_limit_reached_refuses_a_continue() -> None:
    """A Continue cannot become the event."""
    with pytest.raises(ValueError, match="needs a Stop decision for step 'step1'"):
        StepLimitReached.from_decision("step1", 0, StepDecision.continue_())


# --- properties --------------------------------------------------------------------------

_text = st.text(alphabet=st.sampled_from("ab01 :\n/é"), max_size=40)


@given(_text, _text)
def test_similarity_bounds_and_symmetry(a: str, b: str) -> None:
    """Similarity is in [0, 1], symmetric, 1.0 on identical strings, and within the length bound
    (the distance is at least the length difference)."""
    similarity = normalized_similarity(a, b)
    assert 0.0 <= similarity <= 1.0
    assert similarity == normalized_similarity(b, a)
    assert normalized_similarity(a, a) == 1.0
    if a or b:
        assert similarity <= 1.0 - abs(len(a) - len(b)) / max(len(a), len(b))


@st.composite
def _error_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """A random error of up to 4 KB and a copy with random edits (none to a quarter of its
    length), so that both sides of the threshold are hit."""
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32)))
    size = draw(st.sampled_from([0, 1, 7, 64, 500, 4096]))
    base = "".join(rng.choice("abcdefxyz 0123456789:/._\n") for _ in range(size))
    chars = list(base)
    for _ in range(draw(st.integers(min_value=0, max_value=max(1, size // 4)))):
        position = rng.randrange(len(chars) + 1)
        kind = rng.randrange(3)
        if kind == 0 or position == len(chars):
            chars.insert(position, rng.choice("xyz9"))
        elif kind == 1:
            del chars[position]
        else:
            chars[position] = rng.choice("xyz9")
    return base, "".join(chars)


def _full_similarity(a: str, b: str, normalize: bool) -> float:
    if normalize:
        a, b = normalize_volatile(a), normalize_volatile(b)
    return normalized_similarity(a, b)


def _check_decision(pair: tuple[str, str], threshold: float, normalize: bool) -> None:
    a, b = pair
    full = _full_similarity(a, b, normalize)
    tracker = _tracker(
        max_reattempts_per_step=10**6, similarity_threshold=threshold, normalize_volatile=normalize
    )
    tracker.record_attempt("step1", a)
    decision = tracker.record_and_check("step1", b)
    assert decision.stop is (full >= threshold)
    if decision.stop:
        assert decision.reason == _stuck_reason(f"{full * 100:.0f}%", f"{threshold * 100:.0f}%")


@settings(max_examples=150, deadline=None)
@given(_error_pairs(), st.floats(min_value=0.0, max_value=1.0), st.booleans())
@example(("error A", "error B"), 0.85, True)
@example(("error A", "error B"), 6 / 7, False)
@example(("", ""), 1.0, True)
@example(("", "x"), 0.0, True)
def test_decision_equals_the_full_computation(
    pair: tuple[str, str], threshold: float, normalize: bool
) -> None:
    """Up to a few KB the tracker stops exactly when the full similarity reaches the threshold,
    and reports that similarity."""
    _check_decision(pair, threshold, normalize)


@settings(max_examples=150, deadline=None)
@given(_error_pairs(), st.floats(min_value=-0.03, max_value=0.03), st.booleans())
def test_decision_equals_the_full_computation_near_the_threshold(
    pair: tuple[str, str], offset: float, normalize: bool
) -> None:
    """The same, with the threshold within 3 points of the pair's similarity, either side."""
    threshold = min(1.0, max(0.0, _full_similarity(*pair, normalize) + offset))
    _check_decision(pair, threshold, normalize)


@settings(max_examples=100, deadline=None)
@given(_error_pairs(), st.booleans())
def test_decision_at_the_exact_similarity_threshold(pair: tuple[str, str], normalize: bool) -> None:
    """With the threshold set to the pair's own similarity, or the next float up, the edge
    falls exactly where the full computation puts it."""
    a, b = pair
    full = _full_similarity(a, b, normalize)
    assert similarity_at_least(a, b, full, normalize=normalize) == full
    above = full + 2**-40
    if above <= 1.0:
        assert similarity_at_least(a, b, above, normalize=normalize) is None


# --- long errors -------------------------------------------------------------------------

_WORDS = [
    "request",
    "handler",
    "session",
    "client",
    "worker",
    "queue",
    "retry",
    "parse",
    "decode",
    "fetch",
    "commit",
]


def _trace(structure_seed: int, noise_seed: int, size: int) -> str:
    """A stack-trace-like text: frames fixed by one seed, line numbers and addresses by the
    other."""
    structure, noise = random.Random(structure_seed), random.Random(noise_seed)
    lines = ["Traceback (most recent call last):\n"]
    length = len(lines[0])
    while length < size:
        module, function = structure.choice(_WORDS), structure.choice(_WORDS)
        line = (
            f'  File "/srv/app/{module}/{structure.choice(_WORDS)}.py",'
            f" line {noise.randint(1, 3000)}, in {function}_{structure.choice(_WORDS)}\n"
            f"    {function}({module})  # 0x{noise.getrandbits(40):010x}\n"
        )
        lines.append(line)
        length += len(line)
    return "".join(lines) + "RuntimeError: worker failed\n"


MB = 1024 * 1024


def _timed_check(previous: str, current: str) -> tuple[StepDecision, float]:
    tracker = _tracker(max_reattempts_per_step=100)
    tracker.record_attempt("step1", previous)
    started = time.perf_counter()
    decision = tracker.record_and_check("step1", current)
    return decision, time.perf_counter() - started


def test_megabyte_errors_differing_in_volatile_tokens_are_stuck() -> None:
    """Two 1 MB traces with different line numbers and addresses are stuck, in milliseconds."""
    decision, seconds = _timed_check(_trace(1, 1, MB), _trace(1, 2, MB))
    assert decision.stop
    assert decision.reason is not None
    assert "appears stuck" in decision.reason
    assert seconds < 0.25  # the full computation takes tens of seconds


def test_megabyte_errors_that_differ_are_not_stuck() -> None:
    """Two unrelated 1 MB traces are not stuck, in milliseconds."""
    decision, seconds = _timed_check(_trace(1, 1, MB), _trace(2, 2, MB))
    assert decision == StepDecision.continue_()
    assert seconds < 0.25


def test_megabyte_error_with_a_block_inserted_upstream_is_stuck() -> None:
    """Inserting 50 KB early shifts everything after it; the probes keep the windows aligned."""
    previous = _trace(1, 1, MB)
    current = previous[:100_000] + _trace(3, 3, 50_000) + previous[100_000:]
    similarity = similarity_at_least(previous, current, 0.85)
    assert similarity is not None
    assert similarity == pytest.approx(len(previous) / len(current), abs=0.01)


def test_megabyte_identical_errors_are_100_percent() -> None:
    """Identical long errors are exactly 1.0."""
    error = _trace(1, 1, MB)
    assert similarity_at_least(error, error + "", 1.0) == 1.0


@pytest.mark.parametrize("normalize", [True, False])
def test_long_error_against_a_short_one_is_not_similar(normalize: bool) -> None:
    """Beyond the exact range the length ratio still caps the estimate."""
    long_error = _trace(1, 1, 200_000)
    assert similarity_at_least(long_error, long_error[:1000], 0.85, normalize=normalize) is None
    assert similarity_at_least(long_error, "", 0.0, normalize=normalize) == 0.0


def test_estimate_on_truncated_long_error_is_its_length_ratio() -> None:
    """An error cut to 90% of its length is estimated at about 90%."""
    error = _trace(1, 1, 300_000)
    similarity = similarity_at_least(error, error[: len(error) * 9 // 10], 0.0)
    assert similarity == pytest.approx(0.9, abs=0.02)


@pytest.mark.parametrize("threshold", [-0.01, 1.01, float("nan")])
def test_threshold_outside_the_unit_interval_is_an_error(threshold: float) -> None:
    """``similarity_at_least`` names a threshold outside [0, 1]."""
    with pytest.raises(ValueError, match="within \\[0, 1\\], got"):
        similarity_at_least("a", "a", threshold)


def test_exact_range_ends_at_the_named_boundary() -> None:
    """At ``EXACT_SIMILARITY_MAX_CHARS`` code points the similarity is still the exact one."""
    size = EXACT_SIMILARITY_MAX_CHARS
    rng = random.Random(7)
    previous = "".join(rng.choice("abcdefgh\n") for _ in range(size))
    current = list(previous)
    for position in rng.sample(range(size), size // 10):
        current[position] = "z"
    exact = normalized_similarity(previous, "".join(current))
    assert similarity_at_least(previous, "".join(current), 0.85, normalize=False) == exact
