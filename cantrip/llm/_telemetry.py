"""Telemetry: one structured log record per LLM call -- audit metadata, never content.

Each call through :class:`TelemetryLLM` logs, on the ``cantrip.llm.telemetry``
logger, who answered (provider, model), how long it took, the tokens (prompt,
completion, cached, cache writes, reasoning), the cost in USD, the stop
reason, and the shape of the exchange (message count, tools offered, tool
calls made, answer length, attempts, fallback position); a failed call logs
the error's type, status and code instead. The record is also attached to
the log record as ``record.telemetry`` (a dict) for handlers that ship it.

Cost comes from the provider's own figure when it reports one (OpenRouter),
else from the prices in the provider's TOML for the model that answered.
Message and answer text are logged only when ``include_content`` is set
*and* the logger is enabled for DEBUG (D-074). Secrets never appear: no
headers or keys reach this layer, and cantrip's loggers redact known key
shapes and the values of key variables anyway (PROD-8).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from cantrip._errors import ConstructionError, LLMError, ProviderError
from cantrip._redact import get_logger
from cantrip.llm._contract import (
    LLM,
    Message,
    Response,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from cantrip.llm._wrapper import Wrapper, call

log = get_logger("cantrip.llm.telemetry")


@attrs.frozen
class Pricing:
    """USD per million tokens; cache prices default to the input price when unknown."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = usage.cached_tokens
        written = usage.cache_write_tokens
        fresh = max(usage.prompt_tokens - cached - written, 0)
        total = (
            fresh * self.input
            + cached * (self.cache_read if self.cache_read is not None else self.input)
            + written * (self.cache_write if self.cache_write is not None else self.input)
            + usage.completion_tokens * self.output
        )
        return total / 1_000_000


PricingLookup = Callable[[str | None, str | None], Pricing | None]


_PRICES: dict[tuple[str, str], tuple[object, Pricing | None]] = {}
"""Prices already looked up, by provider and model, with the config they came from."""
_load_config: Callable[[str], Any] | None = None
"""``load_provider_config``, imported on the first lookup (an import statement per
turn costs more than the cached lookup itself)."""


def config_pricing(provider: str | None, model: str | None) -> Pricing | None:
    """Prices of ``model`` at ``provider`` from the provider TOML files, if listed.

    Every recorded turn asks (its ``cost_usd``), so the answer is kept with the
    config object it was read from and reused while the provider's config is
    that same object: a changed providers folder (the environment) or
    ``clear_cache()`` yields another config, and so a fresh lookup (issue 34)."""
    if not provider or not model:
        return None
    global _load_config
    if _load_config is None:  # provider code stays unimported until a price is asked
        from cantrip.llm._config import load_provider_config

        _load_config = load_provider_config
    try:
        config = _load_config(provider)
    except ConstructionError:
        return None
    key = (provider, model)
    known = _PRICES.get(key)
    if known is not None and known[0] is config:
        return known[1]
    info = config.models.get(model)
    pricing = (
        None
        if info is None or info.cost_input_per_1m is None or info.cost_output_per_1m is None
        else Pricing(
            info.cost_input_per_1m,
            info.cost_output_per_1m,
            info.cost_cache_read_per_1m,
            info.cost_cache_write_per_1m,
        )
    )
    _PRICES[key] = (config, pricing)
    return pricing


@attrs.define
class TelemetryLLM(Wrapper):
    """Wraps an LLM; logs one record per call (see the module docstring)."""

    inner: LLM
    pricing: PricingLookup = config_pricing
    log_level: int = logging.INFO
    include_content: bool = False
    logger: logging.Logger = attrs.field(default=log, repr=False)

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        started = time.perf_counter()
        base: dict[str, Any] = {
            "llm": self.inner.name,
            "streamed": on_event is not None,
            "message_count": len(messages),
            "tools_provided": len(tools),
        }
        try:
            response = await call(self.inner, messages, tools, tool_choice, extra, on_event)
        except LLMError as error:
            record = {
                **base,
                "status": "error",
                "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
                "error_type": type(error).__name__,
            }
            if isinstance(error, ProviderError):
                record.update(
                    {
                        k: v
                        for k, v in (("error_status", error.status), ("error_code", error.code))
                        if v is not None
                    }
                )
            self._emit(record)
            raise
        record = {
            **base,
            "status": "ok",
            "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
            **self.describe(response),
        }
        self._emit(record)
        if self.include_content and self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(
                "llm call content: messages=%r answer=%r thinking=%r tool_calls=%r",
                [m.text() for m in messages],
                response.content,
                response.thinking,
                [(c.name, c.arguments_json) for c in response.tool_calls],
            )
        return response

    def describe(self, response: Response) -> dict[str, Any]:
        usage = response.usage
        out: dict[str, Any] = {
            "provider": response.provider,
            "model": response.model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
        for key in ("cached_tokens", "cache_write_tokens", "reasoning_tokens"):
            value = getattr(usage, key)
            if value:
                out[key] = value
        out["cost_usd"] = self.cost(response)
        out["stop_reason"] = response.stop_reason
        out["tool_calls"] = len(response.tool_calls)
        out["content_length"] = len(response.content or "")
        for key in ("attempts", "fallback_index", "answered_by", "tool_choice_reprompted"):
            if key in response.metadata:
                out[key] = response.metadata[key]
        return out

    def cost(self, response: Response) -> float | None:
        reported = response.metadata.get("cost")
        if isinstance(reported, int | float):
            return round(float(reported), 8)
        requested = response.metadata.get("requested_model")
        pricing = None
        for model in (requested, response.model):
            if isinstance(model, str):
                pricing = self.pricing(response.provider, model)
                if pricing is not None:
                    break
        return round(pricing.cost(response.usage), 8) if pricing is not None else None

    def _emit(self, record: dict[str, Any]) -> None:
        if not self.logger.isEnabledFor(self.log_level):
            return
        text = " ".join(f"{k}={v}" for k, v in record.items() if v is not None)
        self.logger.log(self.log_level, "llm call %s", text, extra={"telemetry": record})
