"""What a model call cost, from the agent's ``params.pricing`` (CONTRACT §7).

``params.pricing`` is ``{"<model>": {"input_per_million": usd, "output_per_million": usd}}``.
A call is priced only when the pricing names its model; otherwise its cost is unknown (``None``,
stored as ``cost_usd: null``), which every sum reports as unknown rather than as free.
"""

from __future__ import annotations

from typing import Any

PRICE_KEYS = ("input_per_million", "output_per_million")
# So that a priced call stays within what a ``usage`` event may carry (``MAX_COST_USD_PER_CALL``
# for ``MAX_TOKENS_PER_CALL`` tokens); no model is priced anywhere near it.
MAX_PRICE_PER_MILLION = 1_000_000


def validate_pricing(pricing: Any) -> None:
    """Raise ``ValueError`` with a sentence when ``params.pricing`` cannot price anything."""
    if pricing is None:
        return
    if not isinstance(pricing, dict):
        raise ValueError("params.pricing must be an object of model name → prices")
    for model, prices in pricing.items():
        where = f"params.pricing[{model!r}]"
        if not isinstance(prices, dict) or set(prices) - set(PRICE_KEYS):
            raise ValueError(f"{where} must be an object with {' and '.join(PRICE_KEYS)}")
        for key in PRICE_KEYS:
            value = prices.get(key, 0)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not 0 <= value <= MAX_PRICE_PER_MILLION):
                raise ValueError(f"{where}.{key} must be a number of USD from 0 to "
                                 f"{MAX_PRICE_PER_MILLION:,}")


def cost_usd(params: dict[str, Any] | None, model: str | None, input_tokens: int,
             output_tokens: int) -> float | None:
    """The cost of one call in USD, or ``None`` when the pricing does not name ``model``."""
    pricing = (params or {}).get("pricing")
    if not isinstance(pricing, dict) or model is None:
        return None
    prices = pricing.get(model)
    if not isinstance(prices, dict):
        return None
    cost = (input_tokens * float(prices.get("input_per_million", 0))
            + output_tokens * float(prices.get("output_per_million", 0))) / 1_000_000
    return round(cost, 9)
