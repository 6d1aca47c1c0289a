"""The slow-model chaos run's audit of model calls against the kills."""

from __future__ import annotations

from bench.chaos_slow_model import Call, Kill, audit_calls

KILL = Kill(at=100.0, pid=1, dead_at=100.02)


def test_a_call_answered_just_before_the_kill_and_sent_again_counts_as_lost() -> None:
    """The worker died before publishing the answer: the re-send is one lost call re-sent."""
    fences = {
        (0, 1): [Call(0, 1, 98.0, 99.6), Call(0, 1, 115.0, 116.0)],  # answered 0.4 s before
        (0, 2): [Call(0, 2, 99.0, 100.5), Call(0, 2, 115.0, 116.0)],  # in flight at the kill
        (1, 1): [Call(1, 1, 90.0, 91.0)],  # long before: untouched
    }
    audit = audit_calls(fences, [KILL])
    assert (audit.lost, audit.resent, audit.duplicates) == (2, 2, 0)
    assert audit.violations == []


def test_a_call_answered_just_before_the_kill_and_not_sent_again_is_not_lost() -> None:
    audit = audit_calls({(0, 1): [Call(0, 1, 98.0, 99.6)]}, [KILL])
    assert (audit.lost, audit.resent, audit.violations) == (0, 0, [])


def test_a_call_in_flight_never_sent_again_is_a_violation() -> None:
    audit = audit_calls({(0, 1): [Call(0, 1, 99.0, 100.5)]}, [KILL])
    assert audit.lost == 1
    assert audit.violations and "never re-sent" in audit.violations[0]
