"""New content words as news for the model's side (``shared.stagnation.novelty``, issue 30)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from shared.stagnation import (
    ModelTurn,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.novelty import MAX_SEEN_WORDS, NOVELTY_CHARS, WordNovelty
from shared.stagnation.verdict import ReasonCode
from tests.shared.stagnation_samples import REWORDED_REQUESTS

NO_GATE = StagnationConfig(min_steps=0)
OLD_RULE = NO_GATE.model_copy(update={"plan_novelty": 0})

# A FedEx rate form as a web surfer shows it: a long page, the same form each time
FORM = (
    "Calculate Shipping Rates | FedEx. The viewport shows 57% of the webpage. Automatic OCR of "
    "the page screenshot has detected the following text: Calculate FedEx shipping rates. "
    "Enter your origin, destination and package details to get a rate quote and estimated "
    "delivery time. From address, country or territory, street address, city, postal code. "
    "To address, residential address, package type, your packaging, number of packages, "
    "weight per package, dimensions length width height, declared value, ship date, "
    "show rates, customs clearance, duties and taxes, pickup or drop off, signature options, "
    "saturday delivery, hold at location, dangerous goods, dry ice, alcohol shipment, "
    "special handling, one rate pricing, envelope, pak, tube, small box, medium box, large "
    "box, extra large box, FedEx International Priority, FedEx International Economy, "
    "FedEx International Connect Plus, terms of use, privacy policy, cookie preferences, "
    "customer support, track shipments, manage returns, schedule pickup, find locations."
)

# what the surfer did, each time in the form's own words: the page begins differently (more
# than a tenth of its first 600 characters) and shows nothing the form had not shown
ACTIONS = (
    "I clicked 'saturday delivery'. Selected options: hold at location, dry ice, alcohol "
    "shipment, special handling, signature options, declared value, customs clearance.",
    "I typed 'postal code' into 'From address'. Suggestions shown: street address, city, "
    "country or territory, residential address, schedule pickup, find locations.",
    "I clicked 'package type'. The list shows: envelope, pak, tube, small box, medium box, "
    "large box, extra large box, your packaging, one rate pricing, dimensions.",
)

# Who&When 36, shortened: a batch, one film per round, its news past the page's beginning
FILMS = ("Munich", "Layer Cake", "The Jacket", "Casino Royale")
ANSWERS = (
    "streaming now with a subscription: a drama thriller about the Olympic massacre aftermath "
    "directed by Spielberg, starring Eric Bana as a Mossad agent hunting Black September "
    "members across Europe; reviews praise its tension, critics call it sober and haunting",
    "not available: leaving soon list shows a gangster crime caper distributed by Sony, where "
    "an unnamed cocaine dealer plans retirement before one last deal in London goes wrong; "
    "viewers mention Tom Hardy, Sienna Miller, Michael Gambon and a twisting final act",
    "available to rent only: a psychological mystery set in a Vermont asylum hospital, where "
    "a wounded Gulf veteran is strapped into a morgue drawer and travels forward in time; "
    "Keira Knightley plays a waitress, Adrien Brody the soldier, Kris Kristofferson a doctor",
    "included in the plan: a spy action adventure featuring an Aston Martin and a high stakes "
    "poker tournament in Montenegro against Le Chiffre, a banker to terrorists; Eva Green "
    "plays Vesper Lynd, Judi Dench returns as M, Mads Mikkelsen weeps blood",
)


def read_window(text: str) -> ToolEvent:
    """A window of a file, as a shell read shows it."""
    return ToolEvent(tool_name="bash", arguments={"command": "sed -n p"}, output=text)


def page(head: str, body: str = "") -> ToolEvent:
    """A web surfer's page: what it did, the form, and what the page says past the form."""
    return ToolEvent(
        tool_name="WebSurfer",
        arguments={"request": "surf"},
        output=f"{head} Here is a screenshot of [FedEx](https://www.fedex.com/). {FORM} {body}",
        kind=ToolKind.READ,
    )


def test_a_page_is_news_by_its_new_content_words() -> None:
    """The first page is all news; the same page with another field typed in shows three new
    words, under the threshold; a page about something else is news again. The words of every
    page are remembered, whether it was news or not."""
    novelty = WordNovelty()
    assert novelty.is_news(FORM, 20)
    assert not novelty.is_news(f"I typed 'Colombia' into 'To address'. {FORM}", 20)
    assert novelty.is_news(f"{FORM} {' '.join(ANSWERS)}", 20)
    assert any(word.startswith("colombia") for word in novelty.dump())
    novelty.clear()
    assert novelty.dump() == []


def test_the_memory_of_words_is_bounded() -> None:
    """At most MAX_SEEN_WORDS words are kept, the least recently shown forgotten first."""
    novelty = WordNovelty()
    batches = [[f"word{n}x" for n in range(start, start + 250)] for start in range(0, 5000, 250)]
    for batch in batches:
        novelty.is_news(" ".join(batch), 20)
    words = novelty.dump()
    assert len(words) == MAX_SEEN_WORDS
    assert set(batches[-1]) <= set(words)
    assert not set(batches[0]) & set(words)
    assert WordNovelty(words).dump() == words


def test_reworded_requests_while_the_same_form_comes_back_climb_the_plan_ladder() -> None:
    """Who&When 23: every page is a new hash and begins differently (another field filled in,
    more than a tenth of its first 600 characters), so the near-duplicate rule moved the mark
    and no reworded request counted. By new content words nothing came back: the third
    re-issue reaches REPLAN, from ``reissued_plan``."""
    detector = StagnationDetector(NO_GATE)
    old = StagnationDetector(OLD_RULE)
    for each in (detector, old):
        each.observe(page("I clicked 'Calculate Shipping Rates - FedEx'."))
    for request, action in zip(REWORDED_REQUESTS, (*ACTIONS, "I scrolled up."), strict=True):
        for each in (detector, old):
            each.observe_turn(ModelTurn(text=request))
            each.observe(page(action))
    assert detector.verdict().level is StagnationLevel.REPLAN
    assert detector.verdict().reason_codes == (ReasonCode.REISSUED_PLAN,)
    assert old.verdict().level is StagnationLevel.NONE, "the first rule saw news on each page"


def test_a_new_window_in_words_already_seen_is_news() -> None:
    """Paging through a file: each window is new lines in identifiers mostly seen before, fewer
    than 20 new words but more than a quarter of its own: news, so the same short plan with
    other line numbers is no re-issue (Gemini ``matplotlib-25775``)."""
    detector = StagnationDetector(NO_GATE)
    names = [f"name{chr(97 + k // 26)}{chr(97 + k % 26)}" for k in range(200)]
    for start in range(0, 200, 10):
        lines = [
            f"def {n}(self, value): return self.{m}(value) + {n}"
            for n, m in zip(names[start : start + 10], names[:10], strict=True)
        ]
        detector.observe_turn(ModelTurn(text="Let me read the next part of the module now."))
        detector.observe(read_window("\n".join(lines * 3)))
    assert detector.counters()["stale_turns"] == 0


def test_a_batch_whose_news_is_past_the_page_beginning_is_no_reissue() -> None:
    """Who&When 36: the same request about one film after another, each page the same search
    template for its first 600 characters and the film's answer further down. Each answer
    shows new words, so the same-words requests are fair; the first rule saw near-duplicate
    pages and counted them as re-issues."""
    detector = StagnationDetector(NO_GATE)
    old = StagnationDetector(OLD_RULE)
    for film, answer in zip(FILMS, ANSWERS, strict=True):
        request = f"Please check the availability of '{film}' on Netflix (US) and report it back."
        for each in (detector, old):
            each.observe_turn(ModelTurn(text=request))
            each.observe(page("I typed the film into the search box.", f"{film}: {answer}"))
    assert detector.counters()["stale_turns"] == 0
    assert detector.verdict().level is StagnationLevel.NONE
    assert old.verdict().level >= StagnationLevel.NUDGE


def test_a_short_result_keeps_the_near_duplicate_rule() -> None:
    """A result that fits in the compared beginning (a record, a verdict) is news when it is
    not a near-duplicate, however few words it adds: a terminal that now prints the error."""
    detector = StagnationDetector(NO_GATE)
    request = "Please run the script again and report the exact error message it prints."
    outputs = ("Script started. Script executed successfully.", "Script started. ValueError.")
    for output in outputs:
        detector.observe_turn(ModelTurn(text=request))
        detector.observe(
            ToolEvent(tool_name="terminal", arguments={}, output=output, kind=ToolKind.COMMAND)
        )
    detector.observe_turn(ModelTurn(text=request))
    assert detector.counters()["stale_turns"] == 0


def test_the_words_seen_survive_a_restore() -> None:
    """The words are saved with the state: a restored detector judges the next page as the
    original does; a state saved before them loads with none."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(page(ACTIONS[0]))
    state = detector.to_state()
    assert "fedex" in state["result_words"]
    restored = StagnationDetector.from_state(None, state)
    for each in (detector, restored):
        each.observe_turn(ModelTurn(text=REWORDED_REQUESTS[0]))
        each.observe(page(ACTIONS[1]))
        each.observe_turn(ModelTurn(text=REWORDED_REQUESTS[1]))
    assert restored.counters() == detector.counters()
    assert restored.to_state() == detector.to_state()
    older = {key: value for key, value in state.items() if key != "result_words"}
    assert StagnationDetector.from_state(None, older).to_state()["result_words"] == []


def test_reading_a_long_page_for_new_words_is_cheap() -> None:
    """The words of a page's first NOVELTY_CHARS characters: well under 1 ms of CPU (best of
    five batches of 200; CPU time, since the box is shared and wall time counts the waits)."""
    text = (FORM + " " + " ".join(ANSWERS)) * (NOVELTY_CHARS // len(FORM) + 1)
    best = wall = float("inf")
    for _ in range(5):
        novelty = WordNovelty()
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(200):
            novelty.is_news(text, 20)
        best = min(best, (time.process_time() - cpu) / 200)
        wall = min(wall, (time.perf_counter() - started) / 200)
    print(f"new content words of a {NOVELTY_CHARS}-character page: {best * 1e6:.0f} us of CPU")
    print(f"({wall * 1e6:.0f} us of wall time)")
    assert best < 1e-3


_PROBE = """
from shared.stagnation import novelty
from shared.stagnation.novelty import WordNovelty
novelty.MAX_SEEN_WORDS = 200
def w(i): return "word" + "".join(chr(97 + (i // 26**k) % 26) for k in range(3))
A = [w(i) for i in range(30)]; B = [w(i) for i in range(30, 210)]
n = WordNovelty()
n.is_news(" ".join(A), 20); n.is_news(" ".join(B), 20)  # 210 seen: 10 of A forgotten
print(n.is_news(" ".join(A[:12] + B), 5), " ".join(n.dump()[:5]))
"""


def test_the_same_results_give_the_same_memory_and_verdict_in_every_process() -> None:
    """Past its bound the memory forgets the same words under every hash seed (a set's order
    follows the seed): a replay in another process gives the same verdicts."""
    root = Path(__file__).resolve().parents[2]
    outputs = set()
    for seed in range(1, 7):
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(root)}
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            check=False,
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1, sorted(outputs)
