"""What every HTTP embeddings endpoint needs around its wire format: batching, retries,
the rate limit, and failures as cantrip's errors.

A wire format (:mod:`.embed_openai`, :mod:`.embed_gemini`) gives three things: the
most inputs one request may carry, the (URL, body) of one batch, and the vectors in a
response. Everything else is here, once:

* failures are classified by the adapters' own policy (:mod:`._faults`: ``status``,
  ``code``, ``retryable``, ``retry_after``) and retried by the adapters' own
  :class:`~cantrip.llm.RetryPolicy` -- the same judgement of what is transient, the
  same backoff; the wait is ``time.sleep`` because an embedder runs in a worker
  thread (:mod:`cantrip.llm._embed_contract`);
* a provider's rate limit is the same process-wide bucket its chat adapter draws on
  (:func:`cantrip.llm._ratelimit.shared_bucket`, the same key);
* every error names the endpoint (``POST`` and the URL, which never holds the key:
  both formats send it in a header) and never the key;
* a response that is not one vector per input, each of the same length, each a list
  of finite numbers, is refused by name rather than stored as a wrong vector.

Requests go out on one ``httpx.Client`` per embedder (thread-safe, keep-alive).
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import httpx

from cantrip._errors import ConstructionError, ProviderError
from cantrip._redact import get_logger
from cantrip._version import __version__
from cantrip.llm._embed_contract import EmbeddingTask
from cantrip.llm._ratelimit import TokenBucket, shared_bucket
from cantrip.llm._retry import RetryPolicy
from cantrip.llm.providers._base import _is_loopback, dumps
from cantrip.llm.providers._faults import HTTP_FAULTS, read_payload, status_error, transport_error

log = get_logger("cantrip.llm.embeddings")
_JITTER = random.Random()


class HTTPEmbedder:
    """An embeddings endpoint over HTTP; subclasses give the wire format."""

    max_batch: ClassVar[int] = 1
    """The most inputs the endpoint takes in one request (its documented limit)."""
    DEFAULT_BATCH: ClassVar[int] = 256
    """Inputs per request unless ``batch_size`` says otherwise (at most ``max_batch``):
    2,048 vectors of 3,072 dimensions are ~75 MB of JSON in one answer; 256 keep an
    answer to a few MB and still make a re-index a handful of requests."""

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        base_url: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        batch_size: int | None = None,
        timeout_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        requests_per_minute: float | None = None,
        rate_limit_key: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        if not model:
            raise ConstructionError(f"embeddings ({provider}): name the embedding model")
        if dimensions is not None and (isinstance(dimensions, bool) or dimensions < 1):
            raise ConstructionError(f"embeddings ({provider}): dimensions is a positive integer")
        size = min(self.DEFAULT_BATCH, self.max_batch) if batch_size is None else batch_size
        if not 1 <= size <= self.max_batch:
            raise ConstructionError(
                f"embeddings ({provider}): batch_size is 1 to {self.max_batch} "
                f"(the endpoint's limit of inputs per request); got {size}"
            )
        self.provider = provider
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.dimensions = dimensions
        self.batch_size = size
        self.retry = retry or RetryPolicy()
        self._bucket: TokenBucket | None = None
        if requests_per_minute is not None:
            self._bucket = shared_bucket(rate_limit_key or provider, requests_per_minute)
        self._headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "user-agent": f"cantrip/{__version__}",
            **(headers or {}),
            **self.auth_headers(api_key),
        }
        self._owns_client = client is None
        self._client = client or httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            # as the chat adapters: a loopback server is never reached through a proxy
            trust_env=not _is_loopback(self.base_url),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r})"

    @property
    def model_id(self) -> str:
        sized = f"@{self.dimensions}" if self.dimensions is not None else ""
        return f"{self.provider}:{self.model}{sized}"

    # -- the wire format ------------------------------------------------------------

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def build(self, texts: Sequence[str], task: EmbeddingTask) -> tuple[str, dict[str, Any]]:
        """(URL, JSON body) of one request embedding ``texts`` (at most ``max_batch``)."""
        raise NotImplementedError

    def vectors(self, payload: Mapping[str, Any], count: int) -> list[Any]:
        """The ``count`` vectors of a response, in input order, as the payload has them
        (checked by :meth:`embed`)."""
        raise NotImplementedError

    # -- the one path every request takes ----------------------------------------------

    def embed(self, texts: Sequence[str], task: EmbeddingTask = "document") -> list[list[float]]:
        given: object = texts
        if isinstance(given, str) or not isinstance(given, Sequence):
            raise ValueError("embed takes a list of texts, not one text")
        for text in texts:
            if not isinstance(text, str) or not text.strip():
                raise ValueError("every text to embed is a non-empty string")
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            url, body = self.build(chunk, task)
            payload = self._post(url, body)
            raw = self.vectors(payload, len(chunk))
            out.extend(self._checked(raw, url, out[0] if out else None))
        return out

    def _label(self, url: str) -> str:
        return f"embeddings ({self.provider}, POST {url})"

    def _checked(self, raw: list[Any], url: str, first: list[float] | None) -> list[list[float]]:
        found: list[list[float]] = []
        for n, vector in enumerate(raw):
            if isinstance(vector, str):  # OpenAI's encoding_format="base64": float32, LE
                vector = _from_base64(vector)
            if (
                not isinstance(vector, list)
                or not vector
                or not all(
                    isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                    for x in vector
                )
            ):
                raise ProviderError(
                    f"{self._label(url)}: vector {n} is not a list of finite numbers",
                    code="malformed_response",
                    retryable=False,
                )
            expected = len(first) if first is not None else len(found[0]) if found else None
            if expected is None and self.dimensions is not None:
                expected = self.dimensions
            if expected is not None and len(vector) != expected:
                raise ProviderError(
                    f"{self._label(url)}: vector {n} has {len(vector)} dimensions, "
                    f"expected {expected}",
                    code="malformed_response",
                    retryable=False,
                )
            found.append([float(x) for x in vector])
        return found

    def _post(self, url: str, body: dict[str, Any]) -> Mapping[str, Any]:
        attempt = 1
        while True:
            try:
                return self._attempt(url, body)
            except ProviderError as error:
                if attempt > self.retry.max_retries or not self.retry.is_retryable(error):
                    if attempt > 1:
                        error.add_note(f"after {attempt} attempts")
                    raise
                wait = self.retry.delay(attempt, error, _JITTER)
                log.info("retrying %s in %.2fs: %s", self._label(url), wait, error)
                time.sleep(wait)
                attempt += 1

    def _attempt(self, url: str, body: dict[str, Any]) -> Mapping[str, Any]:
        label = self._label(url)
        if self._bucket is not None:
            wait = self._bucket.reserve()
            if wait > 0:
                log.warning("rate limit %s: waiting %.2fs for a request slot", label, wait)
                time.sleep(wait)
        try:
            reply = self._client.post(url, content=dumps(body), headers=self._headers)
        except HTTP_FAULTS as exc:
            raise transport_error(label, self.base_url, exc) from None
        if reply.status_code >= 400:
            raise status_error(label, reply.status_code, reply.headers, reply.content)
        return read_payload(label, reply.content, reply.status_code)

    def close(self) -> None:
        """Close the connections (a client given to the constructor is the caller's)."""
        if self._owns_client:
            self._client.close()


def _from_base64(text: str) -> Any:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    if len(raw) % 4:
        return None
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def malformed(label: str, what: str) -> ProviderError:
    """A 200 whose body is JSON but not the endpoint's shape."""
    return ProviderError(f"{label}: {what}", code="malformed_response", retryable=False)
