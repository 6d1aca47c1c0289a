"""The scale benchmark's arithmetic: Redis CPU from ``INFO cpu``, CPU per call, and the
processes a load needs (what docs/deploy.md's sizing is computed with)."""

from __future__ import annotations

import math

import pytest

from bench.scale_bench import Cost, cpu_ms_per_call, processes_needed, redis_cpu_s


def test_redis_cpu_sums_system_and_user_of_the_server_and_its_children() -> None:
    info = {
        "used_cpu_sys": "1.5",
        "used_cpu_user": 2.25,
        "used_cpu_sys_children": 0.25,
        "used_cpu_user_children": 0.0,
        "used_cpu_sys_main_thread": 1.4,  # part of used_cpu_sys: not counted twice
    }
    assert redis_cpu_s(info) == pytest.approx(4.0)


def test_cpu_per_call_is_milliseconds_and_nan_without_calls() -> None:
    assert cpu_ms_per_call(2.0, 1000) == pytest.approx(2.0)
    assert math.isnan(cpu_ms_per_call(1.0, 0))


def test_processes_needed_rounds_up_at_the_utilisation_and_is_at_least_one() -> None:
    # 2,000 calls/s at 1 ms = 2 cores; at half a core each: 4 processes
    assert processes_needed(2000, 1.0) == 4
    assert processes_needed(2000, 1.0, utilisation=1.0) == 2
    assert processes_needed(2001, 1.0, utilisation=1.0) == 3
    assert processes_needed(1, 0.0) == 1


@pytest.mark.parametrize(("calls", "ms", "utilisation"), [(10, math.nan, 0.5), (10, 1.0, 0.0)])
def test_processes_needed_refuses_what_is_not_a_measurement(
    calls: float, ms: float, utilisation: float
) -> None:
    with pytest.raises(ValueError, match="must be"):
        processes_needed(calls, ms, utilisation)


def test_the_hottest_master_is_the_one_that_spent_most_and_replicas_are_not_masters() -> None:
    cost = Cost(
        name="cluster-1",
        calls=500,
        seconds=10.0,
        completed=100,
        tasks=100,
        redis_cpu_s={"master :1": 0.5, "master :2": 1.0, "replica :3": 5.0},
        broker_cpu_s=0.1,
        coordinator_cpu_s=2.0,
        coordinators=1,
        worker_cpu_s=4.0,
        worker_peak_rss_mb=400.0,
        coordinator_peak_rss_mb=80.0,
    )
    assert cost.hottest_master == ("master :2", pytest.approx(2.0))
    assert cost.calls_per_s == pytest.approx(50.0)
    assert cost.ms(cost.coordinator_cpu_s) == pytest.approx(4.0)


def test_net_cost_takes_off_the_idle_rate_over_the_batch_and_never_goes_below_zero() -> None:
    cost = Cost(
        name="cluster-2",
        calls=100,
        seconds=10.0,
        completed=20,
        tasks=20,
        redis_cpu_s={"master :1": 0.2},
        broker_cpu_s=0.0,
        coordinator_cpu_s=1.0,
        coordinators=2,
        worker_cpu_s=0.5,
        worker_peak_rss_mb=0.0,
        coordinator_peak_rss_mb=0.0,
        idle_cpu_per_s={"coordinators": 0.05, "worker": 0.1},
    )
    assert cost.net_ms("coordinators", cost.coordinator_cpu_s) == pytest.approx(5.0)
    assert cost.net_ms("worker", cost.worker_cpu_s) == 0.0
    assert cost.net_ms("master :1", 0.2) == pytest.approx(2.0)  # no idle figure: gross
