"""The tables of a spec file, as pydantic models: what each key may be.

A spec file is TOML; :class:`SpecDocument` is the whole of it and each table has its
model here (``[llm]``, ``[identity]``, ``[circle]``, ``[retry]``, ``[loom]``,
``[folding]``, ``[output]``, ``[memory]``, ``[llms.NAME]``). Every model forbids keys it does not
know (``extra="forbid"``), so a misspelt key is an error, not a silent default. The
``[[circle.mcp]]`` and ``[[circle.a2a]]`` tables are read by their own models
(:mod:`cantrip.spec._providers`), so their problems come with every table's index.
The reference page of the docs is generated from these models and their docstrings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from cantrip.llm._retry import DEFAULT_RETRYABLE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimitSpec(_Strict):
    """``rate_limit = {requests_per_minute = 60, burst = 10}``: a bucket per provider key."""

    requests_per_minute: float = Field(gt=0)
    burst: int | None = Field(default=None, ge=1)


class TelemetrySpec(_Strict):
    """``telemetry = {log_level = "INFO", include_content = false}`` (or ``true``)."""

    log_level: Literal["DEBUG", "INFO", "WARNING"] = "INFO"
    include_content: bool = False


class ProviderRefSpec(_Strict):
    """A fallback member: a provider and the model to ask there."""

    provider: str
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    compat: dict[str, Any] = Field(default_factory=dict)


class LLMSpec(_Strict):
    """``[llm]``: which model answers. ``provider = "scripted"`` needs no key.

    A real provider (``openai``, ``openai_responses``, ``anthropic``, ``gemini``, ``openrouter``,
    ``ollama``, ``lmstudio``, ``vllm``, ``llamacpp``, ``local`` or one a user
    config adds) is configured from its TOML; the key comes from the
    environment variable the config names (or ``api_key_env``).
    """

    provider: str | None = None
    model: str | None = None
    name: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    """The environment variable holding the key (never the key itself)."""
    timeout_s: float | None = Field(default=None, gt=0)
    compat: dict[str, Any] = Field(default_factory=dict)
    """Compatibility flags overriding the provider config's (OpenAI-compatible servers)."""
    fallback: list[str | ProviderRefSpec] = Field(default_factory=list)
    """Tried in order when the primary fails for good: ``"provider"``,
    ``"provider:model"`` or a table."""
    fallback_retries: int | None = Field(default=None, ge=0)
    """Retries of each chain member before moving on (default: one attempt each)."""
    rate_limit: RateLimitSpec | None = None
    telemetry: bool | TelemetrySpec = False
    type: Literal["code_circle", "tool_calling", "conversation"] | None = None
    """What the script's responses are shaped for (informational)."""
    responses: list[dict[str, Any]] | None = None
    raw_response: dict[str, Any] | None = None
    usage: dict[str, int] | None = None
    latency_ms: float = 0.0
    record_inputs: bool = True
    """A scripted LLM records every query it receives; ``false`` is rejected."""
    stateless: bool = False
    """Declares the LLM keeps no state between queries; the runner checks it."""
    retry_behavior: bool = False
    """Declares the script contains provider errors for the retry policy."""
    script: Literal["per_entity", "shared"] | None = None
    """How a scripted LLM picks its entry: ``per_entity`` (the default: each cast
    plays the script from its first entry, positioned by its own conversation, so
    a spec can be served, invoked line by line, run by workers and resumed) or
    ``shared`` (one cursor in query order, as the Python ``ScriptedLLM`` -- what
    the conformance runner uses when a vector does not say)."""


class IdentitySpec(_Strict):
    system_prompt: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    tool_choice: Literal["auto", "required", "none"] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    """How hard a reasoning model thinks; each adapter says it in its API's terms
    (sent as ``extra.reasoning_effort``)."""
    extra: dict[str, Any] = Field(default_factory=dict)


TEST_DOUBLE: dict[str, Any] = {"test_double": True}
"""Marks a gate entry key that only makes a test double (docs list it apart)."""


class GateSpec(_Strict):
    """A gate entry: a built-in by ``name``, your own gate by ``import`` (a function made a
    gate with ``@cantrip.gate``, named ``"package.module:function"``; found beside the
    spec file or in the environment), or a test double (``behavior``/``result``)."""

    name: str | None = None
    import_: str | None = Field(default=None, alias="import", min_length=1, max_length=300)
    description: str | None = None
    dependencies: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[str, Any] | None = None
    ephemeral: bool = False
    # Test doubles (the conformance vectors' fixture gates): documented on a page of
    # their own (docs/reference/test-doubles.md), not among the keys for users.
    behavior: Literal["constant", "delay", "throw", "counter"] | None = Field(
        default=None, json_schema_extra=TEST_DOUBLE
    )
    result: Any = Field(default=None, json_schema_extra=TEST_DOUBLE)
    error: str | None = Field(default=None, json_schema_extra=TEST_DOUBLE)
    delay_ms: float = Field(default=0.0, json_schema_extra=TEST_DOUBLE)
    stateful: bool = Field(default=False, json_schema_extra=TEST_DOUBLE)


class CircleSpec(_Strict):
    medium: str | None = None
    type: str | None = None
    circle_type: str | None = None
    gates: list[str | GateSpec] = Field(default_factory=list)
    wards: list[dict[str, Any]] = Field(default_factory=list)
    expose_loom: bool | None = None
    """Code mediums: a read-only ``loom`` object in the sandbox (LOOM-11; on by default)."""
    approve: list[str] = Field(default_factory=list)
    """Gate-name globs whose calls wait for a human's yes (``["bash", "mcp_*"]``)."""
    approval_timeout_s: float | None = Field(default=None, gt=0)
    """Deny a pending approval with "timed out" after this many seconds."""
    mcp: list[dict[str, Any]] = Field(default_factory=list)
    """``[[circle.mcp]]``: MCP servers whose tools become gates (cantrip.mcp)."""
    a2a: list[dict[str, Any]] = Field(default_factory=list)
    """``[[circle.a2a]]``: remote A2A agents, each one gate (cantrip.a2a)."""
    guardrails: list[dict[str, Any]] = Field(default_factory=list)
    """``[[circle.guardrails]]``: checks on input, output, calls and results
    (cantrip.guardrails; each table read by cantrip.spec._guardrails)."""
    isolation: Literal["none", "bwrap"] | None = None
    """The bash medium: ``"bwrap"`` runs the shell under bubblewrap (mediums._bwrap)."""
    network: bool | None = None
    """The bash medium under ``isolation = "bwrap"``: allow the network (off by default)."""


class RetrySpec(_Strict):
    max_retries: int = 3
    retryable_status_codes: list[int] = Field(default_factory=lambda: sorted(DEFAULT_RETRYABLE))
    base_delay: float = 1.0
    max_delay: float = 30.0


class FoldingSpec(_Strict):
    trigger_after_turns: int | None = Field(default=None, ge=1)
    context_window: int | None = Field(default=None, ge=1)
    trigger_ratio: float = Field(default=0.8, gt=0, le=1)
    keep_recent: int = Field(default=1, ge=0)
    folder: Literal["template", "llm"] = "template"
    """Who writes the fold summary: the deterministic template, or an LLM."""
    folder_llm: str | None = None
    """With ``folder = "llm"``: a name from ``[llms]`` (default: the cantrip's own LLM)."""


class LoomSpec(_Strict):
    path: str | None = None
    url: str | None = None
    """``postgresql://...``: the loom on PostgreSQL (shared by workers; see
    cantrip.distributed._worker)."""
    journal: bool = False
    """SQLite: keep the gate journal, so a gate's effect is not repeated after a crash
    (always on for PostgreSQL)."""


class OutputSpec(_Strict):
    """``[output]``: the answer's shape -- an inline JSON Schema or a pydantic model."""

    output_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    model: str | None = None
    """``"package.module:Class"``: a pydantic model importable where the cast runs."""


class MemoryBlockSpec(_Strict):
    """``[[memory.blocks]]``: a pinned block -- labelled text shown at the start of
    every cast, edited through the ``edit_block`` gate, at most ``limit`` characters."""

    label: str
    text: str = ""
    limit: int = 2000


class MemoryEmbedderSpec(_Strict):
    """``[memory] embedder = {provider = "openai", model = "..."}``: search by meaning
    (``cantrip.llm.embedder_from_config``; the provider's TOML gives the rest)."""

    provider: str = Field(min_length=1)
    model: str | None = None
    dimensions: int | None = Field(default=None, ge=1)
    base_url: str | None = None
    api_key_env: str | None = None
    batch_size: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)


class MemoryConsolidateSpec(_Strict):
    """``[memory.consolidate]``: after each cast ends, a cantrip of its own -- ``llm``
    told ``prompt``, with ``remember``, ``recall``, ``forget`` and ``done``, under
    ``wards`` -- extracts and merges facts into ``namespace`` in the background
    (cantrip.memory._consolidate). Leave the table out (the default) for none."""

    enabled: bool = True
    after: Literal["cast"] = "cast"
    """When: after each cast that ends (done, a ward, a recorded error; not a pause)."""
    llm: str | None = None
    """A name from ``[llms]`` (default: the spec's own LLM)."""
    prompt: str | None = None
    """Its system prompt (default: extract durable facts and merge them into memory)."""
    namespace: list[str] | None = None
    """Where it writes: a template as ``[memory] namespace`` (default: that one)."""
    wards: list[dict[str, Any]] = Field(default_factory=lambda: [{"max_turns": 8}])
    """Its own wards and budget, as ``[circle] wards``: ``max_turns``,
    ``max_tokens_total``, ``max_cost_usd``, ``timeout_s``..."""


class MemorySpec(_Strict):
    """``[memory]``: memory across sessions, in the loom's database (cantrip.memory)."""

    enabled: bool = True
    namespace: list[str] = Field(default_factory=lambda: ["{cantrip}"])
    """The namespace template: parts may name ``{user}`` (the cast's ``user`` tag),
    ``{entity}`` and ``{cantrip}`` (``name``)."""
    name: str | None = None
    """What ``{cantrip}`` is (default: the spec file's name without ``.toml``)."""
    blocks: list[MemoryBlockSpec] = Field(default_factory=list)
    recall: bool = False
    """Place the items that best match each cast's intent in its context."""
    recall_k: int = 5
    embedder: MemoryEmbedderSpec | None = None
    """Embed every item and search by meaning too (hybrid by default)."""
    consolidate: MemoryConsolidateSpec | None = None
    """Consolidation after each cast, by a cantrip of its own (off by default)."""


class SpecDocument(_Strict):
    """A whole declarative cantrip."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="What people call it (an A2A Agent Card's name); the file's stem when unset.",
    )
    llm: LLMSpec | None = None
    identity: IdentitySpec | None = None
    circle: CircleSpec | None = None
    retry: RetrySpec | None = None
    loom: LoomSpec | None = None
    folding: FoldingSpec | None = None
    output: OutputSpec | None = None
    memory: MemorySpec | None = None
    llms: dict[str, LLMSpec] = Field(default_factory=dict)
    """Further LLMs by name, for children and forks."""
    _source: Path | None = PrivateAttr(default=None)
    """The file the document was read from (hidden from file gates by default)."""
