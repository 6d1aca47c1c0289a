"""Chaos, short version of ``make chaos`` (``bench/chaos.py``): while 20 tasks run on real
workers, a pool process is SIGKILLed every two seconds, the coordinator is SIGKILLed and
restarted, and Redis is SIGKILLed and restarted from its AOF; every task still completes once,
with a gapless journal and no iteration applied twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import SIDE_EFFECT, ChaosPlan, ChaosReport, run_chaos
from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import PARTITIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SHORT = ChaosPlan(
    tasks=20,
    iterations=6,
    command=f"sleep 0.3; {SIDE_EFFECT}",
    kill_every_s=2.0,
    kill_from=0.05,
    coordinator_at=0.25,
    redis_at=0.55,
    redis_down_s=0.5,
    quiet_after_s=2.0,
    duration_s=100.0,
    observation_deadline_s=8.0,
    partitions=PARTITIONS,
)
"""Light load (20 tasks, about a second of queueing), so an 8 s observation deadline never fires
for work that is only waiting; each command takes 0.3 s so the faults land mid-iteration."""


@pytest.fixture(scope="module")
def report(private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> ChaosReport:
    """One short chaos run, shared by the assertions of this module."""
    lines: list[str] = []
    root = tmp_path_factory.mktemp("chaos")
    result = run_chaos(SHORT, private_redis, Path(root), say=lines.append)
    # The processes' logs stay under ``root`` (pytest keeps its last three base folders); the
    # path is printed with the report so a failed run can be read afterwards.
    print("\n".join([*lines, result.table(), result.summary(), f"logs kept in {root}"]))
    return result


def test_every_task_completes_once_with_a_clean_journal_under_faults(report: ChaosReport) -> None:
    """No task lost, all completed with their answer, gapless journals, nothing applied twice."""
    assert report.statuses == {"completed": SHORT.tasks}, report.summary()
    assert report.passed, report.summary()


def test_no_task_is_started_twice(report: ChaosReport) -> None:
    """One ``accepted`` event per task and one ``Started`` journal entry per step."""
    assert report.duplicate_starts == 0, report.summary()


def test_side_effects_are_counted(report: ChaosReport) -> None:
    """Every command appended its line at least once; the lines appended twice are reported
    (commands are not idempotent: a call run again after a fault appends again)."""
    assert report.missing_side_effects == 0, report.summary()
    assert f"duplicate side effects: {report.duplicate_side_effects} " in report.summary()


def test_each_kind_of_fault_was_injected_mid_run(report: ChaosReport) -> None:
    """Pool processes, the coordinator (holding observations it had read) and Redis were each
    killed while tasks were running."""
    assert len(report.of_kind("worker")) >= 2, report.summary()
    assert len(report.of_kind("coordinator")) == 1, report.summary()
    assert len(report.of_kind("redis")) == 1, report.summary()
    for fault in report.faults:
        assert fault.first_apply_s is not None, f"nothing applied after {fault.detail}"
    (coordinator,) = report.of_kind("coordinator")
    assert any(d.via == "reclaim" for d in coordinator.hit), report.summary()


def test_recovery_is_bounded_by_the_observation_deadline(report: ChaosReport) -> None:
    """After each fault, work resumes within the deadline, and the work hit is applied in time,
    or is running again in time when a later fault hits it once more (that fault's own
    recovery is then bounded in turn)."""
    deadline = SHORT.observation_deadline_s
    for fault in report.faults:
        assert fault.first_apply_s is not None
        assert fault.first_apply_s < deadline, report.summary()
        for dispatch in fault.hit:
            assert dispatch.applied_after_s is not None, report.summary()
            assert dispatch.recovered_after_s is not None
            assert dispatch.recovered_after_s < 2 * deadline + 5, report.summary()


def test_no_process_exits_on_its_own(report: ChaosReport) -> None:
    """Every process the run did not kill survives the faults (a worker that lost Redis
    reconnects; it does not exit and lose the calls it holds)."""
    assert report.exits == [], report.summary()
