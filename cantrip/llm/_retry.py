"""Provider retries inside one turn (PROD-2, D-006).

A retried query is still one query from the loop's point of view: failed
attempts never reach the loom or the entity's context. ``max_retries`` counts
attempts *after* the first. Only transient failures are retried (429, 5xx
overload codes, connection problems); any other 4xx is final.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from cantrip._errors import ProviderError
from cantrip._redact import get_logger
from cantrip.llm._contract import (
    LLM,
    Message,
    Response,
    ToolChoice,
    ToolDefinition,
)
from cantrip.llm._stream import MessageStart
from cantrip.llm._wrapper import Wrapper, call

log = get_logger("cantrip.llm.retry")

DEFAULT_RETRYABLE = frozenset({429, 500, 502, 503, 504, 529})
UNREACHABLE = "connect_error"
"""The code of a provider error that says nothing answers at the address."""
UNREACHABLE_MAX_DELAY = 0.5
"""Seconds between the retries of an unreachable provider (their backoff's cap)."""
_JITTER = random.Random()


def _codes(value: Iterable[int]) -> frozenset[int]:
    return frozenset(value)


@attrs.frozen
class RetryPolicy:
    """Exponential backoff from ``base_delay`` seconds, doubled per attempt, capped.

    Jitter adds up to ``jitter`` x the backoff; a provider's ``Retry-After`` is
    honoured up to ``max_retry_after``.
    """

    max_retries: int = 3
    retryable_status_codes: frozenset[int] = attrs.field(
        default=DEFAULT_RETRYABLE, converter=_codes
    )
    base_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.25
    max_retry_after: float = 60.0

    def is_retryable(self, error: ProviderError) -> bool:
        """An HTTP error status is judged by this policy's list; an error without
        one (a dropped connection, a timeout, a 200 with a cut-off body) by what
        the adapter says about it."""
        if error.status is not None and error.status >= 400:
            return error.status in self.retryable_status_codes
        return bool(error.retryable)

    def delay(self, attempt: int, error: ProviderError, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        if error.retry_after is not None:
            return float(min(max(error.retry_after, 0.0), self.max_retry_after))
        backoff = min(self.base_delay * 2.0 ** (attempt - 1), self.max_delay)
        if error.code == UNREACHABLE:
            # Nothing listens there (refused, no such host): a server that is
            # starting answers within a second or two, one that is absent never.
            backoff = min(backoff, UNREACHABLE_MAX_DELAY)
        return backoff + rng.uniform(0.0, self.jitter * backoff)


@attrs.define
class RetryingLLM(Wrapper):
    """Wraps an LLM; retries transient provider errors within one query."""

    inner: LLM
    policy: RetryPolicy = attrs.field(factory=RetryPolicy)
    rng: random.Random = attrs.field(default=_JITTER, repr=False)
    """Jitter source; shared by default (seeding one per entity costs more than it buys)."""

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        """The first attempt is a plain await of the inner LLM; only a failure
        enters the retry loop. Every turn queries through here, and each
        coroutine that waits on the provider lives as long as the provider
        takes, so the common path keeps the await chain one link long."""
        try:
            return await self.inner.query(messages, tools, tool_choice, extra)
        except ProviderError as error:
            failed = error
        return await self._retry(failed, messages, tools, tool_choice, extra, None)

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        _announce(on_event, 1)
        try:
            return await call(self.inner, messages, tools, tool_choice, extra, on_event)
        except ProviderError as error:
            failed = error
        return await self._retry(failed, messages, tools, tool_choice, extra, on_event)

    async def _retry(
        self,
        error: ProviderError,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        """Attempts after the first failed with ``error``, until one succeeds,
        the policy gives up, or the error is not transient."""
        attempt = 1
        while True:
            if attempt > self.policy.max_retries or not self.policy.is_retryable(error):
                if attempt > 1:
                    error.add_note(f"after {attempt} attempts")
                raise error
            wait = self.policy.delay(attempt, error, self.rng)
            log.info(
                "retrying %s in %.2fs (attempt %d of %d): %s",
                self.name,
                wait,
                attempt + 1,
                self.policy.max_retries + 1,
                error,
            )
            await trio.sleep(wait)
            _announce(on_event, attempt + 1)
            try:
                response = await call(self.inner, messages, tools, tool_choice, extra, on_event)
            except ProviderError as next_error:
                attempt += 1
                error = next_error
                continue
            return attrs.evolve(response, metadata={**response.metadata, "attempts": attempt + 1})


def _announce(on_event: Callable[[Any], None] | None, attempt: int) -> None:
    """Tell a streaming caller that attempt number ``attempt`` starts."""
    if on_event is not None:
        on_event(MessageStart(attempt=attempt))
