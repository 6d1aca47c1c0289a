"""The slow-model benchmark's arq set-ups: which run a fixed number of workers, and their names."""

from __future__ import annotations

from pathlib import Path

from bench.slow_model_bench import ARQ_POLLS, ARQ_WORKERS, PEERS, ZERO_LATENCY_SYSTEMS, result_key


def test_the_two_worker_arq_peer_is_a_peer_with_its_own_result_name() -> None:
    """``arq-fast-2`` keeps two arq workers whatever the runtime's default process count, so a
    change of that default cannot take a process away from the peer it is compared with."""
    assert "arq-fast-2" in PEERS and "arq-fast-2" in ZERO_LATENCY_SYSTEMS
    assert ARQ_WORKERS == {"arq-fast-2": 2}
    assert ARQ_POLLS["arq-fast-2"] == ARQ_POLLS["arq-fast"]
    assert result_key("arq-fast-2") == "arq_fast_poll_2_workers"
    assert result_key("arq-fast") == "arq_fast_poll"
    assert result_key("arq-default") == "arq_default_poll"


def test_arq_runs_the_runtimes_default_process_count_but_arq_fast_2_runs_two() -> None:
    from bench.slow_model_bench import arq_workers
    from shared.settings import OrgaSettings

    default = int(OrgaSettings.model_fields["reasoning_processes"].default)
    assert arq_workers("arq-fast") == default == arq_workers("arq-default")
    assert arq_workers("arq-fast-2") == 2


def test_the_runtime_process_count_reaches_orga_worker_only_when_asked(tmp_path: Path) -> None:
    """``--reasoning-processes N`` puts ORGA_REASONING_PROCESSES in the runtime's environment;
    without it the variable is unset (the default), whatever the caller's environment says."""
    from bench.slow_model_bench import OrgaStack, build_parser, parse_plan

    plan = parse_plan(build_parser().parse_args(["--reasoning-processes", "2"]))
    assert plan.reasoning_processes == 2
    assert parse_plan(build_parser().parse_args([])).reasoning_processes is None
    stack = OrgaStack(tmp_path, concurrency=0, model_url="http://127.0.0.1:1/v1")
    assert "ORGA_REASONING_PROCESSES" not in stack.env()
    stack.reasoning_processes = 2
    assert stack.env()["ORGA_REASONING_PROCESSES"] == "2"
