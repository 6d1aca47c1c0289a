"""Chaos with a slow model, short version of ``bench/chaos_slow_model.py``: five tasks on a fake
OpenAI-compatible server answering after about a second, the reasoning worker SIGKILLed once
with model calls in flight and restarted; every lost call is re-sent once after its heartbeat
stopped, no model call is made twice otherwise, and every task completes once."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_slow_model import SlowChaosPlan, SlowChaosReport, run_slow_chaos
from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import PARTITIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SHORT = SlowChaosPlan(
    tasks=5,
    iterations=4,
    latency_s=1.0,
    jitter=0.3,
    kills=1,
    first_kill_s=2.5,
    heartbeat_interval_s=1.0,
    heartbeat_timeout_s=15.0,
    observation_deadline_s=3.0,
    duration_s=120.0,
    partitions=PARTITIONS,
)
"""Five tasks of four model calls (0.7 to 1.3 s each), one kill once calls are in flight. The
heartbeat timeout stays above the few seconds a just-started worker goes without a beat around
its first calls (docs/reliability.md §6.3)."""


@pytest.fixture(scope="module")
def report(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> SlowChaosReport:
    """One short run, shared by the assertions of this module."""
    lines: list[str] = []
    root = tmp_path_factory.mktemp("chaos-slow")
    result = run_slow_chaos(SHORT, private_redis, Path(root), say=lines.append)
    print("\n".join([*lines, result.summary(), *result.result_lines()]))
    return result


def test_every_task_completes_once_with_a_clean_journal(report: SlowChaosReport) -> None:
    """No task lost, all completed with the model's answer, no iteration applied twice."""
    assert report.statuses == {"completed": SHORT.tasks}, report.summary()
    assert report.applied_twice == 0, report.summary()
    assert report.passed, report.summary()


def test_the_kill_hit_calls_in_flight_and_each_was_resent_once(report: SlowChaosReport) -> None:
    """The reasoning worker died holding model calls; each was re-sent exactly once, after the
    kill and once its last heartbeat was a timeout old, and no other call was made twice."""
    assert len(report.kills) == 1, report.summary()
    assert report.audit.lost >= 1, report.summary()
    assert report.audit.resent == report.audit.lost, report.summary()
    assert report.audit.duplicates == 0, report.summary()
    for resend in report.audit.resends:
        assert resend.declared_at is not None, report.summary()
        assert resend.last_beat is not None, report.summary()
        assert resend.declared_at > resend.killed_at, report.summary()
        assert resend.declared_at - resend.last_beat >= SHORT.stale_after_s, report.summary()
