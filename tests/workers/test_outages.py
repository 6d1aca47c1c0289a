"""An outage of the provider or the policy engine, as a worker reports it: a dispatch whose
model call failed through the retries (or whose OPA server could not be asked) answers
``worker_failed`` with ``provider_unavailable`` / ``policy_unavailable`` and the service's name,
not a ``reasoned`` termination that would use up an attempt; a model call held in a retry wait
is published for ``orga status`` and stops when its task ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import fakeredis
import pytest
from pydantic import SecretStr

from shared import keys
from shared.conversation import Conversation, ConversationMessage
from shared.inference import ProviderWait
from shared.loop_types import LoopConfig
from shared.policy import PolicySpec
from shared.protocol import ActMode, Fence, ReasonRequest
from shared.settings import OrgaSettings
from shared.task_spec import ProviderSpec
from tests.fakes.llm_server import FakeOpenAIServer
from tests.fakes.opa_server import closed_opa_url
from workers.handlers import DispatchOutcome, run_dispatch
from workers.providers.settings import ProviderSettings
from workers.providers.waiting import CallAbandonedError, RedisWaitWatch, wait_out, watching
from workers.runtime import local_core

FENCE = Fence(task_id="t", step_id="s", iteration=0, attempt=1, nonce="n1")


@pytest.fixture
def failing_model() -> Iterator[FakeOpenAIServer]:
    """A model server that answers 503 to every request."""
    with FakeOpenAIServer(api_key="sk-test") as server:
        yield server  # an empty queue answers 500; the tests queue 503s


def _request(provider: ProviderSpec, policy: PolicySpec | None = None) -> ReasonRequest:
    conversation = Conversation()
    conversation.push(ConversationMessage.user("Goal: g"))
    return ReasonRequest(
        fence=FENCE,
        agent_id="a",
        conversation=conversation,
        config=LoopConfig(),
        provider=provider,
        policy=policy or PolicySpec(),
        workspace="/nonexistent",
        act=ActMode.CHAIN,
    )


def _dispatch(request: ReasonRequest, provider_settings: ProviderSettings) -> DispatchOutcome:
    async def go() -> DispatchOutcome:
        core = local_core(OrgaSettings(), provider_settings)
        try:
            return await run_dispatch(request, core)
        finally:
            await core.aclose()

    return asyncio.run(go())


def test_a_provider_failing_through_the_retries_is_reported_as_its_outage(
    failing_model: FakeOpenAIServer,
) -> None:
    """The model answers 503 through the retries: the dispatch answers worker_failed,
    provider_unavailable, naming the provider and its status, not a termination (which the
    coordinator would count as a failed attempt)."""
    for _ in range(3):
        failing_model.respond_error(503, "overloaded")
    settings = ProviderSettings(
        provider="openai",
        base_url=failing_model.base_url,
        api_key=SecretStr("sk-test"),
        max_retries=0,
        provider_retry_deadline_s=0,
    )
    outcome = _dispatch(_request(ProviderSpec(kind="openai", model="gpt-test")), settings)
    assert outcome.failure is not None, outcome.answers
    assert outcome.failure.error_kind == "provider_unavailable"
    assert outcome.failure.service == "openai"
    assert "HTTP 503" in outcome.failure.error and "overloaded" in outcome.failure.error
    assert outcome.answers == [outcome.failure]


def test_an_unreachable_opa_server_is_reported_as_its_outage() -> None:
    """The model proposes a call and the OPA server cannot be reached: the dispatch answers
    worker_failed, policy_unavailable, naming the server; no denial reaches the model."""
    url = closed_opa_url()
    provider = ProviderSpec(
        kind="scripted",
        replies=[{"tool_calls": [{"name": "file_read", "arguments": {"path": "a"}}]}],
    )
    request = _request(provider, PolicySpec(kind="opa", opa_url=url))
    outcome = _dispatch(request, ProviderSettings())
    assert outcome.failure is not None, outcome.answers
    assert outcome.failure.error_kind == "policy_unavailable"
    assert outcome.failure.service == f"opa at {url}"
    assert "OPA unreachable" in outcome.failure.error


class _Sleeps:
    """A ``sleep`` that records its delays and moves a fake clock on by them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.delays: list[float] = []
        self.between: list[object] = []

    def clock(self) -> float:
        return self.now

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.now += seconds


WAIT = ProviderWait(provider="openai", status=503, wait_s=3.5)


def test_a_retry_wait_is_published_under_the_dispatch_and_sleeps_in_slices() -> None:
    """Held in a 3.5 s retry wait, the call publishes the wait (provider, status, retry_at)
    under its liveness id, expiring with it, and sleeps in 1 s slices, looking at its task
    between them."""
    redis = fakeredis.FakeAsyncRedis()
    sleeps = _Sleeps()
    watch = RedisWaitWatch(redis, FENCE, check_every_s=1.0, clock=sleeps.clock)

    async def go() -> tuple[object, int]:
        await redis.hset(keys.task_key("t", 0), "status", "running")
        with watching(watch):
            await wait_out(WAIT, 3.5, sleeps)
        key = keys.provider_wait_key(FENCE.liveness_id())
        return await redis.get(key), await redis.pttl(key)

    published, ttl_ms = asyncio.run(go())
    assert sleeps.delays == [1.0, 1.0, 1.0, 0.5]
    assert isinstance(published, bytes)
    assert json.loads(published) == {
        "provider": "openai",
        "status": 503,
        "shared": False,
        "retry_at": 1003.5,
    }
    assert 0 < ttl_ms <= 3500


@pytest.mark.parametrize("status", ["aborted", "failed", "completed"])
def test_a_retry_wait_stops_when_its_task_ends(status: str) -> None:
    """`orga cancel` (the task aborted) while the call waits out a 60 s Retry-After: the wait
    stops at the next look (1 s), with CallAbandonedError naming the task."""
    redis = fakeredis.FakeAsyncRedis()
    sleeps = _Sleeps()
    watch = RedisWaitWatch(redis, FENCE, check_every_s=1.0, clock=sleeps.clock)

    async def go() -> None:
        await redis.hset(keys.task_key("t", 0), "status", status)
        with watching(watch):
            await wait_out(WAIT, 60.0, sleeps)

    with pytest.raises(CallAbandonedError, match=rf"task t ended \({status}\)"):
        asyncio.run(go())
    assert sleeps.delays == [1.0]


def test_without_a_watch_a_retry_wait_is_one_sleep() -> None:
    """Outside a worker's dispatch (the in-process driver, the providers' tests) a wait is one
    sleep of its whole length."""
    sleeps = _Sleeps()
    asyncio.run(wait_out(WAIT, 3.5, sleeps))
    assert sleeps.delays == [3.5]
