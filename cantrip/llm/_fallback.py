"""Fallback: an ordered chain of LLMs, each tried when the one before fails for good.

A member fails for good when it raises a :class:`~cantrip.ProviderError`
that its retries (``retry``, if given) cannot cure, or returns an answer
that breaks the contract (LLM-3/LLM-4, checked here so the next member can
answer instead). The response says who answered: ``provider`` and ``model``
are the answering adapter's, and ``metadata`` gains ``answered_by``,
``fallback_index`` and, when earlier members failed, ``fallback_errors``.

When every member fails the chain raises one :class:`~cantrip.ProviderError`
naming each failure; it is retryable if any member's last error was, so an
outer retry policy (and the entity's transient-failure rule) treat an
exhausted chain like the outage it is. All of this happens inside one turn:
failed members never reach the loom (D-006).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from cantrip._errors import ConstructionError, InvalidResponseError, LLMError, ProviderError
from cantrip._redact import get_logger
from cantrip.llm._contract import (
    LLM,
    Message,
    Response,
    ToolChoice,
    ToolDefinition,
    can_stream,
)
from cantrip.llm._retry import RetryPolicy
from cantrip.llm._stream import MessageStart
from cantrip.llm._wrapper import Delegating

log = get_logger("cantrip.llm.fallback")
MAX_CHAIN = 10


def _chain(value: Iterable[LLM]) -> tuple[LLM, ...]:
    chain = tuple(value)
    if not chain:
        raise ConstructionError("a fallback chain needs at least one LLM")
    if len(chain) > MAX_CHAIN:
        raise ConstructionError(f"a fallback chain has at most {MAX_CHAIN} LLMs, not {len(chain)}")
    return chain


@attrs.define
class FallbackLLM(Delegating):
    """Tries ``chain`` in order; see the module docstring."""

    chain: tuple[LLM, ...] = attrs.field(converter=_chain)
    retry: RetryPolicy | None = None
    """Retries of each member before moving on; ``None``: one attempt each."""
    rng: random.Random = attrs.field(factory=random.Random, repr=False)

    @property
    def name(self) -> str:
        return self.chain[0].name

    @property
    def context_window(self) -> int | None:
        """The smallest known window of the chain: any member may have to answer."""
        windows = [getattr(llm, "context_window", None) for llm in self.chain]
        known = [w for w in windows if isinstance(w, int)]
        return min(known) if known else None

    async def aclose(self) -> None:
        for llm in self.chain:
            closer = getattr(llm, "aclose", None)
            if closer is not None:
                await closer()

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        failures: list[tuple[str, LLMError]] = []
        attempts = 0
        for index, llm in enumerate(self.chain):
            retries = 0
            while True:
                if on_event is not None and attempts:
                    on_event(MessageStart(attempt=attempts + 1))  # what streamed so far is void
                attempts += 1
                try:
                    if on_event is not None and can_stream(llm):
                        response = await llm.stream(
                            messages, tools, tool_choice, extra, on_event=on_event
                        )
                    else:
                        response = await llm.query(messages, tools, tool_choice, extra)
                    response.validate()
                except ProviderError as error:
                    retries += 1
                    policy = self.retry
                    if (
                        policy is not None
                        and retries <= policy.max_retries
                        and policy.is_retryable(error)
                    ):
                        wait = policy.delay(retries, error, self.rng)
                        log.info(
                            "fallback member %s: retry %d in %.2fs: %s",
                            llm.name,
                            retries,
                            wait,
                            error,
                        )
                        await trio.sleep(wait)
                        continue
                    failures.append((llm.name, error))
                except InvalidResponseError as error:
                    failures.append((llm.name, error))
                else:
                    return self._answered(response, index, attempts, failures)
                if index + 1 < len(self.chain):
                    log.warning(
                        "fallback: %s failed (%s); trying %s",
                        llm.name,
                        failures[-1][1],
                        self.chain[index + 1].name,
                    )
                break
        raise self._exhausted(failures)

    def _answered(
        self, response: Response, index: int, attempts: int, failures: list[tuple[str, LLMError]]
    ) -> Response:
        metadata: dict[str, Any] = {
            **response.metadata,
            "answered_by": f"{response.provider}:{response.model}",
            "fallback_index": index,
        }
        if failures:
            metadata["fallback_errors"] = tuple(f"{name}: {error}" for name, error in failures)
        if attempts > 1:
            metadata["attempts"] = attempts
        return attrs.evolve(response, metadata=metadata)

    def _exhausted(self, failures: list[tuple[str, LLMError]]) -> ProviderError:
        provider_errors = [e for _, e in failures if isinstance(e, ProviderError)]
        primary = failures[0][1]
        retryable = any((self.retry or RetryPolicy()).is_retryable(e) for e in provider_errors)
        waits = [e.retry_after for e in provider_errors if e.retry_after is not None]
        summary = "; ".join(f"{name}: {error}" for name, error in failures)
        error = ProviderError(
            f"all {len(failures)} LLMs of the fallback chain failed: {summary}",
            status=primary.status if isinstance(primary, ProviderError) else None,
            retryable=retryable,
            retry_after=min(waits) if waits else None,
            code=primary.code if isinstance(primary, ProviderError) else "invalid_response",
        )
        error.__cause__ = primary
        return error
