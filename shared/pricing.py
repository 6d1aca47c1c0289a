"""What a model call costs in US dollars: the price table of ``genai-prices``, or the task's
own ``provider.pricing``.

``genai-prices`` (pydantic's maintained table of LLM prices, the one pydantic-ai's
``UsageLimits.cost_limit`` uses) is read through its public API, from the snapshot the package
ships: it never fetches prices at run time (its ``UpdatePrices`` is not used). A model's price
is looked up once per process (:func:`table_price` is cached) and kept as plain floats, so
pricing a call is a few multiplications, not the table's Decimal arithmetic. The table itself
is imported on the first lookup (it takes about a second to load): a process that prices calls
loads it when it starts (:func:`preload`; the Celery workers do, ``orga/celery.py``), the
others only when a task with a money limit needs it.

A price in force from a number of prompt tokens up (Anthropic's and Gemini's long-context
rates) applies to the whole call, input and output, as the providers bill it::

    price = price_of(ProviderSpec(model="gpt-4o"))
    price.cost(Usage(prompt_tokens=1200, completion_tokens=300))   # USD
    price.worst_case(prompt_tokens=1200, max_tokens=4096)          # the most the call can cost
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.inference import Usage

__all__ = [
    "ModelPricing",
    "Price",
    "Tier",
    "format_usd",
    "preload",
    "price_of",
    "table_price",
    "unpriced_message",
]

_PROVIDER_IDS = {"openai": "openai", "anthropic": "anthropic", "openrouter": "openrouter"}
"""``provider.kind`` → the table's provider id (a scripted or unset kind searches every
provider by the model's name)."""


class ModelPricing(BaseModel):
    """A task's own price of its model, in USD per million tokens (``provider.pricing``): for a
    model the table does not know, or to override the table's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_mtok: float = Field(ge=0, le=1_000_000)
    output_per_mtok: float = Field(ge=0, le=1_000_000)


@dataclass(frozen=True, slots=True)
class Tier:
    """Rates in force from ``start`` prompt tokens up (USD per million tokens; a cache rate of
    None: the input rate)."""

    start: int
    input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float | None = None
    cache_read_per_mtok: float | None = None


@dataclass(frozen=True, slots=True)
class Price:
    """One model's price: base rates, higher tiers by prompt size, and where it came from
    (``table``: genai-prices; ``task``: ``provider.pricing``).

    ``cache_write_per_mtok`` and ``cache_read_per_mtok`` price the prompt tokens the provider
    wrote to or read from its prompt cache (:attr:`Usage.cache_write_tokens`,
    :attr:`Usage.cache_read_tokens`; Anthropic's cache writes cost 1.25 times the input rate,
    its reads a tenth); None: the input rate."""

    model: str
    input_per_mtok: float
    output_per_mtok: float
    tiers: tuple[Tier, ...] = ()
    source: str = "table"
    cache_write_per_mtok: float | None = None
    cache_read_per_mtok: float | None = None

    def rates(self, prompt_tokens: int) -> tuple[float, float]:
        """The input and output rates of a call with ``prompt_tokens`` prompt tokens."""
        return self._tier(prompt_tokens)[:2]

    def _tier(self, prompt_tokens: int) -> tuple[float, float, float, float]:
        """The input, output, cache-write and cache-read rates at ``prompt_tokens``."""
        found: Price | Tier = self
        for tier in self.tiers:
            if prompt_tokens >= tier.start:
                found = tier
        write, read = found.cache_write_per_mtok, found.cache_read_per_mtok
        return (
            found.input_per_mtok,
            found.output_per_mtok,
            found.input_per_mtok if write is None else write,
            found.input_per_mtok if read is None else read,
        )

    def cost(self, usage: Usage) -> float:
        """What the provider's reported usage of one call costs: its cache writes and reads
        at their rates, the rest of the prompt at the input rate, its output at the output
        rate."""
        input_rate, output_rate, write_rate, read_rate = self._tier(usage.prompt_tokens)
        written, read = usage.cache_write_tokens, usage.cache_read_tokens
        uncached = max(usage.prompt_tokens - written - read, 0)
        return (
            uncached * input_rate
            + written * write_rate
            + read * read_rate
            + usage.completion_tokens * output_rate
        ) / 1_000_000

    def worst_rates(self, prompt_tokens: int) -> tuple[float, float]:
        """The prompt and output rates of a call's worst case: the prompt at the input rate,
        or the cache-write rate when higher (a cached prompt may be written whole)."""
        input_rate, output_rate, write_rate, _ = self._tier(prompt_tokens)
        return max(input_rate, write_rate), output_rate

    def worst_case(self, prompt_tokens: int, max_tokens: int) -> float:
        """The most a call can cost: its prompt and ``max_tokens`` at :meth:`worst_rates`."""
        prompt_rate, output_rate = self.worst_rates(prompt_tokens)
        return (prompt_tokens * prompt_rate + max_tokens * output_rate) / 1_000_000


def _rate(value: Any) -> tuple[float, tuple[tuple[int, float], ...]]:
    """A table rate (a Decimal, a tiered price or None) as a base and its tiers."""
    from genai_prices.types import TieredPrices  # loaded on first use

    if isinstance(value, TieredPrices):
        return float(value.base), tuple((t.start, float(t.price)) for t in value.tiers)
    return (float(value) if isinstance(value, Decimal | int | float) else 0.0), ()


@lru_cache(maxsize=512)
def table_price(model: str, kind: str | None = None) -> Price | None:
    """The table's price of ``model`` (at the provider ``kind`` names, else at any), None when
    the table does not know it. Looked up once per process and model."""
    from genai_prices import Usage as TableUsage  # loaded on first use
    from genai_prices import calc_price

    provider_id = _PROVIDER_IDS.get(kind or "")
    for provider in (provider_id, None) if provider_id else (None,):
        try:
            found = calc_price(TableUsage(input_tokens=1), model, provider_id=provider)
        except LookupError:
            continue
        prices = found.model_price
        input_base, input_tiers = _rate(prices.input_mtok)
        output_base, output_tiers = _rate(prices.output_mtok)
        write_base, write_tiers = _cache_rate(prices.cache_write_mtok)
        read_base, read_tiers = _cache_rate(prices.cache_read_mtok)
        starts = sorted(
            {s for tiers in (input_tiers, output_tiers, write_tiers, read_tiers) for s, _ in tiers}
        )
        tiers = tuple(
            Tier(
                start,
                _at(input_tiers, start, input_base),
                _at(output_tiers, start, output_base),
                None if write_base is None else _at(write_tiers, start, write_base),
                None if read_base is None else _at(read_tiers, start, read_base),
            )
            for start in starts
        )
        return Price(model, input_base, output_base, tiers, "table", write_base, read_base)
    return None


def _cache_rate(value: Any) -> tuple[float | None, tuple[tuple[int, float], ...]]:
    """A table's cache rate as a base and its tiers; None when the table has none."""
    return (None, ()) if value is None else _rate(value)


def _at(tiers: tuple[tuple[int, float], ...], start: int, base: float) -> float:
    rate = base
    for tier_start, price in tiers:
        if start >= tier_start:
            rate = price
    return rate


def preload() -> None:
    """Load the price table now (about a second), not in a process's first model call."""
    table_price("gpt-4o", "openai")


def price_of(model: str | None, kind: str | None, pricing: ModelPricing | None) -> Price | None:
    """The price of a call: the task's ``provider.pricing`` when it sets one, else the
    table's for ``model`` (None: no price is known)."""
    if pricing is not None:
        return _task_price(model or "", pricing.input_per_mtok, pricing.output_per_mtok)
    if not model:
        return None
    return table_price(model, kind)


@lru_cache(maxsize=256)
def _task_price(model: str, input_per_mtok: float, output_per_mtok: float) -> Price:
    return Price(model, input_per_mtok, output_per_mtok, source="task")


def unpriced_message(model: str | None, where: str = "provider") -> str:
    """Why a cost limit cannot be enforced for the model at ``where``, and the fix."""
    what = (
        f"model {model!r} is not in the price table (genai-prices)"
        if model
        else "no model is named (provider.model), so no price can be looked up"
    )
    return (
        f"{where}: {what}, and limits.max_cost_usd needs the price of every model call; set "
        f"`{where}.pricing: {{input_per_mtok: USD, output_per_mtok: USD}}` (US dollars per "
        "million tokens), name a model the table knows, or remove limits.max_cost_usd"
    )


def format_usd(amount: float) -> str:
    """``$0.0123``: dollars with four decimals (six below a cent)."""
    return f"${amount:.6f}" if 0 < amount < 0.01 else f"${amount:.4f}"
