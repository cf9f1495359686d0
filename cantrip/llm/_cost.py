"""What an LLM call costs, in USD, and what the next one will cost at least.

One answer for every consumer (the loom's turn metadata, the cost ward, the
progress display): the provider's own figure when it reports one
(OpenRouter's ``usage.cost``), else the model's prices from the provider
catalogue (cached-token prices included), else the prices an LLM object
declares itself (``pricing``; a scripted LLM in tests, a custom adapter).
Otherwise the cost is *unknown* -- ``None``, never 0 -- and so it is when the
provider's answer carried no usage at all (``Usage.missing``; issue 28, item 11):
zero tokens would price every such call at $0 and walk past the cost ward.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cantrip.llm._contract import Response, Usage
from cantrip.llm._telemetry import Pricing, config_pricing


def llm_pricing(llm: Any) -> Pricing | None:
    """The prices of the model ``llm`` queries first, looking through wrappers.

    Wrappers (retry, telemetry, rate limit) expose ``inner``; a fallback chain
    its members (``chain``, priced by its first). An adapter is priced by its
    provider catalogue; any LLM may declare ``pricing`` itself.
    """
    for layer in _layers(llm):
        declared = getattr(layer, "pricing", None)
        if isinstance(declared, Pricing):
            return declared
        provider, model = getattr(layer, "provider", None), getattr(layer, "model", None)
        if isinstance(provider, str) and isinstance(model, str):
            found = config_pricing(provider, model)
            if found is not None:
                return found
    return None


def unpriced_model(llm: Any) -> str | None:
    """How to name ``llm``'s model in a message saying it has no price, or ``None``
    when its provider reports what each call cost (``reports_cost``, OpenRouter).

    Asked only of an LLM :func:`llm_pricing` found no price for: a budget on it
    cannot be kept, and is refused before its first call (issue 39, item 16)."""
    name: str | None = None
    for layer in _layers(llm):
        if getattr(layer, "reports_cost", False) is True:
            return None
        provider, model = getattr(layer, "provider", None), getattr(layer, "model", None)
        if isinstance(model, str):
            name = (
                f"{model!r} of provider {provider!r}" if isinstance(provider, str) else repr(model)
            )
        elif name is None and isinstance(getattr(layer, "name", None), str):
            name = repr(layer.name)
    return name or repr(type(llm).__name__)


def _layers(llm: Any) -> Iterator[Any]:
    """``llm`` and the LLMs it wraps, outermost first: ``inner`` of a wrapper, the
    first member of a fallback ``chain`` (at most 16, against a wrapper cycle)."""
    seen = 0
    while llm is not None and seen < 16:
        seen += 1
        yield llm
        chain = getattr(llm, "chain", None)
        llm = getattr(llm, "inner", None) or (chain[0] if chain else None)


PriceMemo = dict[tuple[Any, Any, Any], Pricing | None]
"""Prices already found, by (provider, requested model, model); see :func:`response_cost`."""


def response_cost(
    response: Response, llm: Any = None, memo: PriceMemo | None = None
) -> float | None:
    """USD of one answered call; ``None`` when no price is known for its model or the
    provider reported no usage (unless it reported the cost itself).

    ``memo`` keeps the prices found for ``llm``'s answers, so a cast looks its
    model's prices up once, not on every turn (a cast is priced at the prices in
    force when it priced its first turn; issue 34)."""
    usage = response.usage
    metadata = response.metadata
    reported = metadata.get("cost")
    if isinstance(reported, int | float) and not isinstance(reported, bool):
        return round(float(reported), 10)
    if usage.missing:
        return None  # the provider said nothing about tokens: unknown, never $0
    if not usage.prompt_tokens and not usage.completion_tokens:
        return 0.0  # the provider reported that nothing was consumed
    if memo is None:
        pricing = _pricing_of(response, llm)
    else:
        key = (response.provider, metadata.get("requested_model"), response.model)
        if key in memo:
            pricing = memo[key]
        else:
            pricing = memo[key] = _pricing_of(response, llm)
    return round(pricing.cost(usage), 10) if pricing is not None else None


def _pricing_of(response: Response, llm: Any) -> Pricing | None:
    """The prices of the model that answered: the catalogue's for the model asked for,
    then for the model named in the answer, else what ``llm`` declares."""
    for model in (response.metadata.get("requested_model"), response.model):
        if isinstance(model, str):
            pricing = config_pricing(response.provider, model)
            if pricing is not None:
                return pricing
    return llm_pricing(llm) if llm is not None else None


def prompt_cost(tokens: int, pricing: Pricing) -> float:
    """The least the next call costs: its prompt at the input price, uncached."""
    return pricing.cost(Usage(prompt_tokens=tokens))
