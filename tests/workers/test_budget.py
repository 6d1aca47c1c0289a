"""The money check before a model call (workers/phases.py): a call whose worst case passes
what the task has left is not sent; a call that is sent has its usage priced."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.context_manager import DefaultContextManager
from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import Usage
from shared.loop_types import LoopConfig, LoopState, TerminationKind
from shared.pricing import ModelPricing, Price
from shared.protocol import Fence, ReasonedMessage, ReasonRequest
from shared.task_spec import ProviderSpec
from workers.handlers import run_reasoning
from workers.phases import LoopTermination, Reasoning
from workers.providers.scripted import ScriptedProvider
from workers.runtime import local_core

PRICE = Price("m", input_per_mtok=1_000.0, output_per_mtok=2_000.0, source="task")
"""$0.001 a prompt token, $0.002 an output token: small numbers make visible sums."""


def _state() -> LoopState:
    state = LoopState(agent_id="a")
    state.conversation.push(ConversationMessage.user("x" * 330))  # ~107 tokens estimated
    return state


def _reasoning(left: float | None, max_output_tokens: int = 100) -> Reasoning:
    config = LoopConfig(max_cost_usd=left, max_output_tokens=max_output_tokens)
    return Reasoning(_state(), config, PRICE)


def _provider() -> ScriptedProvider:
    usage = Usage(prompt_tokens=100, completion_tokens=20, total_tokens=120)
    return ScriptedProvider.from_replies([{"text": "done", "usage": usage.model_dump()}])


def test_a_call_within_the_budget_is_sent_and_priced() -> None:
    """Worst case ~$0.307 fits in $1: the call goes out; its usage costs $0.14."""
    provider = _provider()
    reasoning = _reasoning(left=1.0)
    checking = asyncio.run(reasoning.produce_output(provider, DefaultContextManager()))
    assert len(provider.requests) == 1
    assert checking.usage.cost_usd == pytest.approx(100 * 0.001 + 20 * 0.002)
    assert reasoning.state.total_usage.cost_usd == pytest.approx(0.14)
    assert reasoning.call is not None
    assert (reasoning.call.provider, reasoning.call.model) == ("scripted", "scripted")


def test_a_call_whose_worst_case_passes_the_budget_is_not_sent() -> None:
    """$0.30 left, worst case ~$0.307 (the prompt at $0.001, 100 output tokens at $0.002):
    the call is not sent and the loop ends ``budget_exhausted``, saying the figures."""
    provider = _provider()
    reasoning = _reasoning(left=0.30)
    with pytest.raises(LoopTermination) as stop:
        asyncio.run(reasoning.produce_output(provider, DefaultContextManager()))
    assert provider.requests == []
    assert reasoning.call is None
    reason = stop.value.reason
    assert reason.kind is TerminationKind.BUDGET_EXHAUSTED
    assert reason.message is not None
    assert reason.message.startswith("budget exhausted: the next model call could cost up to")
    assert "max_tokens 100" in reason.message and "$0.3000 left" in reason.message


def test_max_tokens_counts_in_the_worst_case() -> None:
    """The same prompt fits with 10 output tokens allowed, not with 100."""
    provider = _provider()
    asyncio.run(_reasoning(0.13, 10).produce_output(provider, DefaultContextManager()))
    assert len(provider.requests) == 1
    with pytest.raises(LoopTermination):
        asyncio.run(_reasoning(0.13, 100).produce_output(_provider(), DefaultContextManager()))


def test_no_limit_and_no_price_leave_the_call_alone() -> None:
    """Without a money limit the call is sent; without a price its cost is 0."""
    provider = _provider()
    reasoning = Reasoning(_state(), LoopConfig(max_output_tokens=100_000), None)
    checking = asyncio.run(reasoning.produce_output(provider, DefaultContextManager()))
    assert checking.usage.cost_usd == 0.0
    assert len(provider.requests) == 1


def _request(provider: ProviderSpec, left: float | None, tmp_path: Path) -> ReasonRequest:
    conversation = Conversation()
    conversation.push(ConversationMessage.user("Goal: g"))
    return ReasonRequest(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        agent_id="a",
        conversation=conversation,
        config=LoopConfig(max_cost_usd=left, max_output_tokens=100),
        provider=provider,
        workspace=str(tmp_path),
    )


def _run(request: ReasonRequest) -> ReasonedMessage:
    async def go() -> ReasonedMessage:
        core = local_core()
        try:
            return await run_reasoning(request, core)
        finally:
            await core.aclose()

    return asyncio.run(go())


def test_a_reasoning_worker_prices_the_call_and_names_it(tmp_path: Path) -> None:
    """Through the worker's handler: the task's pricing prices the reported usage, and the
    message names the call (provider, the model as the task names it, its duration)."""
    usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    spec = ProviderSpec(
        kind="scripted",
        model="house-model",
        pricing=ModelPricing(input_per_mtok=1000.0, output_per_mtok=2000.0),
        replies=[{"text": "done", "usage": usage}],
    )
    message = _run(_request(spec, 1.0, tmp_path))
    assert message.usage.cost_usd == pytest.approx(0.14)
    assert message.model_call is not None
    assert (message.model_call.provider, message.model_call.model) == ("scripted", "house-model")


def test_a_money_limit_on_a_model_with_no_price_is_a_configuration_error(tmp_path: Path) -> None:
    """A request with money left whose model (here the deployment's default, unknown to the
    price table) has no price fails as a configuration error naming the model and the fix."""
    spec = ProviderSpec(kind="scripted", replies=["done"])
    with pytest.raises(ConfigError, match=r"model 'scripted' is not in the price table"):
        _run(_request(spec, 1.0, tmp_path))
    assert _run(_request(spec, None, tmp_path)).usage.cost_usd == 0.0  # no limit: unpriced
