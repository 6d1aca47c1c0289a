"""Prices of model calls: the genai-prices table offline, a task's own pricing, the worst case
of a call, and the intake's refusal of a cost limit it cannot price."""

from __future__ import annotations

import time

import pytest

from shared.inference import Usage
from shared.pricing import ModelPricing, Price, Tier, format_usd, price_of, table_price
from shared.task_spec import TaskSpecError, parse_task


def test_the_table_prices_a_known_model_offline() -> None:
    """gpt-4o is in the table the package ships: $2.50 in, $10 out per million tokens."""
    price = table_price("gpt-4o", "openai")
    assert price is not None
    assert (price.input_per_mtok, price.output_per_mtok, price.source) == (2.5, 10.0, "table")
    usage = Usage(prompt_tokens=1000, completion_tokens=500, total_tokens=1500)
    assert price.cost(usage) == pytest.approx(0.0025 + 0.005)


def test_an_unknown_model_has_no_price_and_pricing_overrides_the_table() -> None:
    """No price for a model the table does not know; ``provider.pricing`` wins over it."""
    assert table_price("no-such-model-anywhere-x", "openai") is None
    assert price_of("no-such-model-anywhere-x", "openai", None) is None
    assert price_of(None, None, None) is None
    own = price_of("gpt-4o", "openai", ModelPricing(input_per_mtok=1, output_per_mtok=2))
    assert own is not None
    assert (own.input_per_mtok, own.output_per_mtok, own.source) == (1, 2, "task")


def test_a_long_prompt_pays_the_higher_tier_on_the_whole_call() -> None:
    """Past 200k prompt tokens Claude Sonnet 4.5 costs $6 in and $22.50 out, for the whole
    call, as genai-prices itself computes it."""
    price = table_price("claude-sonnet-4-5", "anthropic")
    assert price is not None
    assert price.rates(1000) == (3.0, 15.0)
    assert price.rates(300_000) == (6.0, 22.5)
    usage = Usage(prompt_tokens=300_000, completion_tokens=1000)
    assert price.cost(usage) == pytest.approx(1.8 + 0.0225)


def test_anthropic_cache_writes_and_reads_are_priced_at_their_own_rates() -> None:
    """Claude Sonnet 4: $3 in, $3.75 a cache write, $0.30 a cache read, $15 out per million
    tokens (the table's public ``cache_write_mtok``/``cache_read_mtok``), as genai-prices
    itself prices the same usage; a cache write is not priced at the base input rate."""
    from genai_prices import Usage as TableUsage
    from genai_prices import calc_price

    price = table_price("claude-sonnet-4-20250514", "anthropic")
    assert price is not None
    assert (price.cache_write_per_mtok, price.cache_read_per_mtok) == (3.75, 0.3)
    usage = Usage(prompt_tokens=10_000, completion_tokens=100, total_tokens=10_100,
                  cache_write_tokens=6000, cache_read_tokens=3000)  # fmt: skip
    expected = (1000 * 3 + 6000 * 3.75 + 3000 * 0.3 + 100 * 15) / 1e6
    assert price.cost(usage) == pytest.approx(expected)
    table = calc_price(
        TableUsage(input_tokens=10_000, cache_write_tokens=6000, cache_read_tokens=3000,
                   output_tokens=100),
        "claude-sonnet-4-20250514", provider_id="anthropic",
    )  # fmt: skip
    assert price.cost(usage) == pytest.approx(float(table.total_price))
    base_only = (10_000 * 3 + 100 * 15) / 1e6
    assert price.cost(usage.model_copy(update={"cache_read_tokens": 0})) > base_only
    # the worst case prices the prompt at the cache-write rate: a cached prompt may be written
    assert price.worst_case(1000, 100) == pytest.approx((1000 * 3.75 + 100 * 15) / 1e6)


def test_cache_rates_follow_the_long_context_tier() -> None:
    """Past 200k prompt tokens Claude Sonnet 4.5's cache rates double with its input rate."""
    price = table_price("claude-sonnet-4-5", "anthropic")
    assert price is not None
    usage = Usage(prompt_tokens=300_000, cache_write_tokens=100_000, cache_read_tokens=100_000)
    assert price.cost(usage) == pytest.approx((100_000 * 6 + 100_000 * 7.5 + 100_000 * 0.6) / 1e6)


def test_a_task_price_without_cache_rates_prices_cached_tokens_at_the_input_rate() -> None:
    """``provider.pricing`` names no cache rates: every prompt token at its input rate."""
    own = price_of("m", None, ModelPricing(input_per_mtok=1.0, output_per_mtok=2.0))
    assert own is not None
    usage = Usage(prompt_tokens=1000, completion_tokens=10, cache_write_tokens=600)
    assert own.cost(usage) == pytest.approx((1000 * 1 + 10 * 2) / 1e6)


def test_the_worst_case_is_the_prompt_and_max_tokens() -> None:
    """Worst case: the prompt at the input rate plus every allowed output token."""
    price = Price("m", input_per_mtok=2.0, output_per_mtok=8.0, tiers=(Tier(100, 4.0, 16.0),))
    assert price.worst_case(50, 1000) == pytest.approx((50 * 2 + 1000 * 8) / 1e6)
    assert price.worst_case(100, 1000) == pytest.approx((100 * 4 + 1000 * 16) / 1e6)


def test_the_lookup_is_cached_and_pricing_a_call_is_cheap() -> None:
    """The table is read once per model; pricing a call then costs microseconds."""
    table_price.cache_clear()
    for _ in range(100):
        price = table_price("gpt-4o-mini", "openai")
    info = table_price.cache_info()
    assert (info.misses, info.hits) == (1, 99)
    assert price is not None
    usage = Usage(prompt_tokens=12_345, completion_tokens=678)
    started = time.perf_counter()
    for _ in range(10_000):
        price.cost(usage)
    per_call_us = (time.perf_counter() - started) / 10_000 * 1e6
    assert per_call_us < 20, per_call_us


def test_format_usd() -> None:
    """Four decimals, six below a cent."""
    assert format_usd(1.23456) == "$1.2346"
    assert format_usd(0.00012) == "$0.000120"
    assert format_usd(0) == "$0.0000"


def _task(**provider: object) -> dict[str, object]:
    return {"goal": "g", "provider": provider, "limits": {"max_cost_usd": 0.5}}


def test_a_cost_limit_without_a_price_is_refused_naming_the_model_and_the_fix() -> None:
    """A model the table does not know, or no model at all: refused, naming it and the fix."""
    with pytest.raises(TaskSpecError) as unknown:
        parse_task(_task(kind="openai", model="my-local-llama"))
    assert "'my-local-llama'" in str(unknown.value)
    assert "provider.pricing" in str(unknown.value)
    with pytest.raises(TaskSpecError, match=r"provider: no model is named"):
        parse_task(_task(kind="scripted"))


def test_a_cost_limit_with_a_price_is_accepted() -> None:
    """A known model, or a task's own pricing, makes the limit enforceable."""
    assert parse_task(_task(kind="openai", model="gpt-4o")).max_cost_usd == 0.5
    priced = parse_task(
        _task(kind="scripted", pricing={"input_per_mtok": 1.0, "output_per_mtok": 4.0})
    )
    assert priced.provider.pricing == ModelPricing(input_per_mtok=1.0, output_per_mtok=4.0)
    assert parse_task({"goal": "g", "provider": {"model": "my-local-llama"}}).max_cost_usd is None


def test_a_critic_with_an_unpriced_model_is_refused() -> None:
    """A critic's model call is paid from the same budget: its model needs a price too."""
    task = _task(model="gpt-4o")
    task["steps"] = [
        {
            "id": "s",
            "instruction": "do",
            "critic": {"agent": "rev", "rubric": "r", "provider": {"model": "mystery-9"}},
        }
    ]
    with pytest.raises(TaskSpecError, match=r"steps\.0\.critic\.provider: model 'mystery-9'"):
        parse_task(task)


def test_a_sub_agent_is_capped_by_what_its_parent_reserved() -> None:
    """``delegation.max_cost_usd`` caps the child's own limit, or is its limit."""
    link = {"task_id": "p", "step_id": "s", "iteration": 0, "call_id": "c", "max_cost_usd": 0.1}
    child = parse_task({**_task(model="gpt-4o"), "delegation": link})
    assert child.max_cost_usd == 0.1
    assert child.loop_config().max_cost_usd == 0.1
    uncapped = parse_task({"goal": "g", "provider": {"model": "gpt-4o"}, "delegation": link})
    assert uncapped.max_cost_usd == 0.1
    with pytest.raises(TaskSpecError, match="mystery-9"):
        parse_task({"goal": "g", "provider": {"model": "mystery-9"}, "delegation": link})
