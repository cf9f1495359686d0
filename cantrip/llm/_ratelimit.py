"""Rate limiting: a token bucket per provider key, shared by the whole process.

Every LLM wrapped with the same ``key`` (by default the adapter's
``rate_limit_key``: the provider and the variable its key comes from) draws
from one bucket, so a hundred entities on one API key stay under that key's
limit together (D-056). The bucket holds ``burst`` requests (default: one
minute's worth, D-059) and refills at ``requests_per_minute / 60`` per second.

A request that finds the bucket empty reserves the next token and sleeps
until it is due -- callers are served in arrival order, nobody fails -- and
the wait is logged as a warning (D-058). A cancelled wait gives its token
back. The limiter sits innermost, so each real attempt (retries and fallback
members included) is counted (D-060). Two configurations of one key resolve
to the stricter one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from cantrip._errors import ConstructionError
from cantrip._redact import get_logger
from cantrip.llm._contract import LLM, Message, Response, ToolChoice, ToolDefinition
from cantrip.llm._wrapper import Wrapper, call

log = get_logger("cantrip.llm.ratelimit")


class TokenBucket:
    """Capacity ``burst``, refilled continuously at ``rate`` tokens per second."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ConstructionError(f"a rate limit must be positive, not {rate}")
        if burst < 1:
            raise ConstructionError(f"a burst must be at least 1, not {burst}")
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (0 if available now)."""
        with self._lock:
            self._refill(self.clock())
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self) -> None:
        with self._lock:
            self._tokens = min(self.burst, self._tokens + 1.0)

    def tighten(self, rate: float, burst: float) -> None:
        with self._lock:
            self._refill(self.clock())
            self.rate = min(self.rate, rate)
            self.burst = min(self.burst, float(burst))
            self._tokens = min(self._tokens, self.burst)

    @property
    def available(self) -> float:
        with self._lock:
            self._refill(self.clock())
            return self._tokens


_BUCKETS: dict[str, TokenBucket] = {}
_REGISTRY_LOCK = threading.Lock()


def shared_bucket(key: str, requests_per_minute: float, burst: int | None = None) -> TokenBucket:
    """The process-wide bucket of ``key`` (created, or tightened, to these limits)."""
    rate = requests_per_minute / 60.0
    size = float(burst if burst is not None else max(1.0, requests_per_minute))
    with _REGISTRY_LOCK:
        bucket = _BUCKETS.get(key)
        if bucket is None:
            bucket = _BUCKETS[key] = TokenBucket(rate, size)
        elif bucket.rate != rate or bucket.burst != size:
            bucket.tighten(rate, size)
        return bucket


def clear_buckets() -> None:
    """Forget every bucket (tests)."""
    with _REGISTRY_LOCK:
        _BUCKETS.clear()


@attrs.define
class RateLimitedLLM(Wrapper):
    """Waits for a token of its key's bucket before each query."""

    inner: LLM
    requests_per_minute: float
    burst: int | None = None
    key: str | None = None
    bucket: TokenBucket = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.requests_per_minute <= 0:
            raise ConstructionError("requests_per_minute must be positive")
        if self.burst is not None and self.burst < 1:
            raise ConstructionError("burst must be at least 1")
        if self.key is None:
            self.key = str(getattr(self.inner, "rate_limit_key", None) or self.inner.name)
        self.bucket = shared_bucket(self.key, self.requests_per_minute, self.burst)

    async def acquire(self) -> None:
        wait = self.bucket.reserve()
        if wait <= 0:
            return
        log.warning("rate limit %s: waiting %.2fs for a request slot", self.key, wait)
        done = False
        try:
            await trio.sleep(wait)
            done = True
        finally:
            if not done:
                self.bucket.refund()

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        await self.acquire()
        return await call(self.inner, messages, tools, tool_choice, extra, on_event)
