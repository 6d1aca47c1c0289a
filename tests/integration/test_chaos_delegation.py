"""Chaos with sub-agents, short version of ``bench/chaos_delegation.py`` (in ``make chaos``):
the coordinator is SIGKILLed and restarted three times while parents delegate to two
sub-agents each and wait on them; nothing is lost and nothing is applied twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_delegation import DelegationChaosPlan, DelegationChaosReport, run_delegation_chaos
from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import PARTITIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SHORT = DelegationChaosPlan(parents=4, child_command_s=2.0, duration_s=180.0, partitions=PARTITIONS)


@pytest.fixture(scope="module")
def report(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> DelegationChaosReport:
    """One short run, shared by the assertions of this module."""
    lines: list[str] = []
    result = run_delegation_chaos(
        SHORT, private_redis, Path(tmp_path_factory.mktemp("dchaos")), say=lines.append
    )
    print("\n".join([*lines, *result.results(), *result.violations]))
    return result


def test_every_parent_completes_with_its_two_children(report: DelegationChaosReport) -> None:
    """Each parent completed with its answer and exactly two completed children."""
    assert report.parents_completed == SHORT.parents, report.violations
    assert report.children_created == 2 * SHORT.parents
    assert report.passed, report.violations


def test_no_child_is_created_twice_and_no_result_applied_twice(
    report: DelegationChaosReport,
) -> None:
    """One intake entry and one start per child; one applied end per child."""
    assert report.children_submitted_twice == 0
    assert report.children_started_twice == 0
    assert report.results_applied_twice == 0


def test_the_coordinator_was_killed_while_parents_waited(report: DelegationChaosReport) -> None:
    """Three kills: children just submitted, parents waiting on both, first children ended."""
    assert len(report.kills) == 3, report.kills
    assert report.side_effect_lines >= 4 * SHORT.parents  # every child command ran
