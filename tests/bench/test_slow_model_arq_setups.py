"""The slow-model benchmark's arq set-ups: which run a fixed number of workers, and their names."""

from __future__ import annotations

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
