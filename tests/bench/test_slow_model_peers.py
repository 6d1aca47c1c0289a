"""The slow-model benchmark's peers run their loops to the final answer, warm-up first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.fake_model_server import FakeModelServer, ScriptConfig
from bench.slow_model_peers import PeerSettings, peer_missing, run_peer, split_peer
from tests.ci import require

PEERS = [
    "asyncio-aiohttp",
    "asyncio-httpx20",
    "asyncio-orgapool",
    "langgraph-aiohttp",
    "langgraph-httpx20",
]


@pytest.mark.parametrize("peer", PEERS)
def test_a_peer_runs_every_loop_to_its_answer(peer: str, tmp_path: Path) -> None:
    """3 runs x 3 calls after one warm-up run: 12 calls, no duplicate, all completed."""
    if (missing := peer_missing(peer)) is not None:
        require(f"the {peer} peer", f"{missing} (make test installs the bench extra)")
    (tmp_path / "note.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))

    async def scenario() -> None:
        server = await FakeModelServer(ScriptConfig(latency_s=0.01, iterations=3)).start()
        try:
            settings = PeerSettings(
                base_url=server.url, api_key="bench-key", model="m", tasks=3, iterations=3,
                workspace=tmp_path, run_id="t", timeout_s=30.0,
            )  # fmt: skip
            outcome = await run_peer(peer, settings)
            stats = server.stats()
        finally:
            await server.close()
        assert outcome["completed"] == 3 and outcome["failed"] == 0, outcome
        assert outcome["cpu_s"] > 0
        assert stats["calls"] == 12 and stats["duplicates"] == 0

    asyncio.run(scenario())


def test_an_unknown_peer_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="LOOP-CLIENT"):
        split_peer("asyncio-requests")
