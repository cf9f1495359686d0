"""Declarative cantrips: a TOML spec file (or a mapping) to a :class:`Cantrip`.

Everything that crosses this boundary is validated by pydantic models with
``extra="forbid"``, so a misspelt key is an error, not a silent default. All
problems of a document are reported together in one
:class:`~cantrip.ConstructionError`.

Declarative construction is strict about the medium (MEDIUM-1): a spec file
must say ``medium = "..."``. The aliases ``type`` and ``circle_type`` are
accepted; declarations that disagree are refused. (The Python API defaults to
conversation.)
"""

from __future__ import annotations

import copy
import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

import attrs
import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

import gates as builtin_gates
from cantrip._approval import ApprovalPolicy
from cantrip._cantrip import Cantrip, cantrip_problems
from cantrip._circle import Circle, circle_problems
from cantrip._errors import ConstructionError
from cantrip._folding import FoldingPolicy, LLMFolder
from cantrip._gate import Gate
from cantrip._identity import Identity
from cantrip._medium_names import _MEDIUMS, MEDIUM_ALIASES
from cantrip._medium_names import MediumFactory as MediumFactory
from cantrip._medium_names import register_medium as register_medium
from cantrip._medium_names import resolve_medium_name as resolve_medium_name
from cantrip._output import OutputSchema
from cantrip._suggest import did_you_mean
from cantrip._wards import Ward, WardSet
from cantrip.a2a._spec import agents_from_tables
from cantrip.llm._contract import LLM, Usage
from cantrip.llm._retry import DEFAULT_RETRYABLE, RetryingLLM, RetryPolicy
from cantrip.llm._scripted import ScriptedLLM
from cantrip.loom._loom import Loom
from cantrip.mcp._spec import MCPServer, servers_from_tables
from gates.fixtures import fixture_gate
from mediums.base import Medium
from mediums.bash import BashMedium
from mediums.conversation import conversation


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


_PROVIDER_ONLY = ("base_url", "api_key_env", "timeout_s", "compat")
"""LLMSpec keys that only mean something for a real provider."""
_SCRIPT_ONLY = (
    "responses",
    "raw_response",
    "usage",
    "retry_behavior",
    "record_inputs",
    "script",
)
"""LLMSpec keys that only mean something for a scripted LLM."""


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


class GateSpec(_Strict):
    name: str
    description: str | None = None
    dependencies: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[str, Any] | None = None
    ephemeral: bool = False
    behavior: Literal["constant", "delay", "throw", "counter"] | None = None
    result: Any = None
    error: str | None = None
    delay_ms: float = 0.0
    stateful: bool = False


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


class SpecDocument(_Strict):
    """A whole declarative cantrip."""

    llm: LLMSpec | None = None
    identity: IdentitySpec | None = None
    circle: CircleSpec | None = None
    retry: RetrySpec | None = None
    loom: LoomSpec | None = None
    folding: FoldingSpec | None = None
    output: OutputSpec | None = None
    llms: dict[str, LLMSpec] = Field(default_factory=dict)
    """Further LLMs by name, for children and forks."""
    _source: Path | None = PrivateAttr(default=None)
    """The file the document was read from (hidden from file gates by default)."""


_LLM_TYPE_MEDIUM = {
    "code_circle": "code",
    "tool_calling": "conversation",
    "conversation": "conversation",
}
"""What an LLM spec's ``type`` says about the medium its responses are written for."""


def load_spec_file(path: str | Path) -> SpecDocument:
    """Parse and validate a TOML spec file; errors name the file and the key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConstructionError(f"spec file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConstructionError(f"{path}: not valid TOML: {exc}") from None
    try:
        doc = SpecDocument.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = [f"{path}: {p}" for p in _pydantic_problems(exc)]
        raise ConstructionError(_dedupe(problems + _problems_past(exc, data, path))) from None
    doc._source = path.resolve()
    return doc


def _problems_past(exc: pydantic.ValidationError, data: Mapping[str, Any], path: Path) -> list[str]:
    """What building would find wrong once the keys pydantic refused are left out
    (unknown gates and wards, a missing done gate...), so a file's mistakes come
    in one run, not one kind per run. Nothing is opened: the build stops at its
    problems, and there is at least one."""
    pruned = copy.deepcopy(dict(data))
    for error in exc.errors():
        _drop(pruned, error["loc"])
    try:
        doc = SpecDocument.model_validate(pruned)
    except pydantic.ValidationError:
        return []  # still not a document: what was said already is what can be said
    doc._source = path.resolve()
    try:
        build_cantrip(doc, base_dir=path.resolve().parent, known_problems=["(pending)"])
    except ConstructionError as more:
        return [f"{path}: {p}" for p in more.problems if p != "(pending)"]
    return []


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    """Remove the value at a pydantic error's ``loc`` (a union member's tag in the
    path, which names no key, is stepped over)."""
    node = data
    for part in loc[:-1]:
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            node = node[part]
    if isinstance(node, dict):
        node.pop(loc[-1], None)


def parse_spec(data: Mapping[str, Any], *, source: str = "spec") -> SpecDocument:
    try:
        return SpecDocument.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConstructionError([f"{source}: {p}" for p in _pydantic_problems(exc)]) from None


def build_cantrip(
    doc: SpecDocument,
    *,
    strict_medium: bool = True,
    base_dir: Path | None = None,
    fs_root: Path | None = None,
    llms: Mapping[str, LLM] | None = None,
    loom: Loom | None = None,
    llm: LLM | None = None,
    known_problems: list[str] | None = None,
) -> Cantrip:
    """Construct the cantrip a document describes, reporting every problem at once.

    ``base_dir`` anchors relative paths (the spec file's folder) and is the
    default for path dependencies left unset (``read``'s root). ``fs_root``,
    when given, is a sandbox folder in which absolute paths are re-rooted (the
    conformance runner's virtual filesystem). ``llms`` adds named LLMs built
    elsewhere (tests); named LLMs of the document are built here. ``llm``
    swaps in an already-built LLM for the document's own (spec 2.2).
    ``known_problems`` were found before (the file's keys): reported first, with
    whatever the build finds.
    """
    problems: list[str] = list(known_problems or ())
    if llm is None and doc.llm is not None:
        llm = build_llm(doc.llm, problems, "llm")
    named: dict[str, LLM] = dict(llms or {})
    for key, spec in doc.llms.items():
        built = build_llm(spec, problems, f"llms.{key}")
        if built is not None:
            named[spec.name or key] = built
    identity = _build_identity(doc.identity)
    circle_spec = doc.circle or CircleSpec()
    medium = _resolve_medium(circle_spec, strict_medium, problems)
    if medium is not None and circle_spec.expose_loom is not None:
        medium = _with_loom(medium, circle_spec.expose_loom, problems)
    if medium is not None and (circle_spec.isolation or circle_spec.network is not None):
        medium = _with_isolation(medium, circle_spec, problems)
    loom_file = getattr(loom.store, "path", None) if loom is not None else None
    if loom is None and doc.loom and doc.loom.path:
        loom_file = _path(doc.loom.path, base_dir)
    hidden = protected_files(doc._source, loom_file)
    gate_list = [
        g
        for g in (
            _build_gate(spec, problems, base_dir=base_dir, fs_root=fs_root, hidden=hidden)
            for spec in circle_spec.gates
        )
        if g is not None
    ]
    wards: list[Ward] = []
    for raw in circle_spec.wards:
        try:
            wards.extend(Ward.parse(raw))
        except ConstructionError as exc:
            problems.extend(exc.problems)
    resolved = WardSet.resolve(wards)
    if resolved.max_depth == 0:
        gate_list = [g for g in gate_list if not g.delegates]
    problems.extend(circle_problems(gate_list, resolved))
    servers = _mcp_servers(circle_spec.mcp, base_dir, problems)
    try:
        agents = agents_from_tables(circle_spec.a2a)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        agents = ()
    llm_reported = doc.llm is not None and llm is None  # its own problems say why
    problems.extend(
        p
        for p in cantrip_problems(llm, identity, True)
        if "circle" not in p and not (llm_reported and "requires an llm" in p)
    )
    output = _build_output(doc.output, problems) if doc.output is not None else None
    if problems:
        raise ConstructionError(_dedupe(problems))
    assert llm is not None and medium is not None
    approval = (
        ApprovalPolicy(circle_spec.approve, timeout_s=circle_spec.approval_timeout_s)
        if circle_spec.approve
        else None
    )
    circle = Circle(gate_list, wards, medium, approval=approval, providers=(*servers, *agents))
    retry = _build_retry(doc.retry)
    if loom is None:
        if doc.loom and doc.loom.url:
            loom = Loom.open(doc.loom.url)
        else:
            loom = (
                Loom.open(_path(doc.loom.path, base_dir), journal=doc.loom.journal)
                if doc.loom and doc.loom.path
                else Loom()
            )
    folding = _build_folding(doc.folding, llm, named) if doc.folding is not None else None
    return Cantrip(
        llm=llm,
        identity=identity,
        circle=circle,
        loom=loom,
        retry=retry,
        llms=named,
        folding=folding,
        output=output,
    )


def _build_output(spec: OutputSpec, problems: list[str]) -> OutputSchema | None:
    if (spec.output_schema is None) == (spec.model is None):
        problems.append("output: give exactly one of schema = {...} or model = 'module:Class'")
        return None
    try:
        if spec.model is not None:
            return OutputSchema.from_reference(spec.model)
        assert spec.output_schema is not None
        return OutputSchema.from_json_schema(spec.output_schema)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        return None


def _mcp_servers(
    tables: list[dict[str, Any]], base_dir: Path | None, problems: list[str]
) -> tuple[MCPServer, ...]:
    """``[[circle.mcp]]`` tables as servers; a relative ``cwd`` (and an unset one)
    is the spec file's folder, so ``args = ["server.py"]`` finds its script."""
    if not tables:
        return ()
    if base_dir is not None:
        tables = [
            {**t, "cwd": str(_path(t.get("cwd") or ".", base_dir))}
            if isinstance(t, dict) and t.get("command") is not None
            else t
            for t in tables
        ]
    try:
        return servers_from_tables(tables)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        return ()


def _build_folding(spec: FoldingSpec, llm: LLM, named: Mapping[str, LLM]) -> FoldingPolicy:
    fields = spec.model_dump(exclude={"folder", "folder_llm"})
    if spec.folder == "template":
        if spec.folder_llm is not None:
            raise ConstructionError('folding: folder_llm needs folder = "llm"')
        return FoldingPolicy(**fields)
    summarizer = llm
    if spec.folder_llm is not None:
        if spec.folder_llm not in named:
            known = ", ".join(sorted(named)) or "none"
            raise ConstructionError(
                f"folding: folder_llm {spec.folder_llm!r} is not a named llm (known: {known})"
            )
        summarizer = named[spec.folder_llm]
    return FoldingPolicy(**fields, folder=LLMFolder(RetryingLLM(summarizer)))


def build_llm(spec: LLMSpec, problems: list[str], where: str) -> LLM | None:
    """An LLM from its spec: scripted, or a real provider with its optional wrappers.

    Real providers are checked completely here (name, config, model, key
    variable), so a bad spec fails before any request. The stack built is
    ``telemetry -> fallback -> rate limit -> adapter``; the cantrip adds its
    retry policy around it.
    """
    provider = spec.provider or "scripted"
    scripted = provider == "scripted" or provider.startswith("mock_")
    count = len(problems)
    if scripted:
        for key in _PROVIDER_ONLY:
            if key in spec.model_fields_set:
                problems.append(f"{where}: {key!r} applies only to a real provider, not {provider}")
        primary = _scripted_llm(spec, problems, where)
    else:
        for key in _SCRIPT_ONLY:
            if key in spec.model_fields_set:
                problems.append(f"{where}: {key!r} applies only to a scripted LLM")
        primary = _provider_llm(
            ProviderRefSpec(
                provider=provider,
                model=spec.model,
                base_url=spec.base_url,
                api_key_env=spec.api_key_env,
                timeout_s=spec.timeout_s,
                compat=spec.compat,
            ),
            spec.name,
            problems,
            where,
        )
    chain = [primary]
    for index, entry in enumerate(spec.fallback):
        ref = entry if isinstance(entry, ProviderRefSpec) else _provider_ref(entry)
        chain.append(_provider_llm(ref, None, problems, f"{where}.fallback[{index}]"))
    if len(problems) > count or any(llm is None for llm in chain):
        return None
    members: list[LLM] = [llm for llm in chain if llm is not None]
    if not spec.fallback and spec.rate_limit is None and not spec.telemetry:
        return members[0]
    from cantrip.llm._fallback import FallbackLLM
    from cantrip.llm._ratelimit import RateLimitedLLM
    from cantrip.llm._telemetry import TelemetryLLM

    if spec.rate_limit is not None:
        members = [
            RateLimitedLLM(m, spec.rate_limit.requests_per_minute, spec.rate_limit.burst)
            for m in members
        ]
    llm: LLM = members[0]
    if spec.fallback:
        retry = RetryPolicy(max_retries=spec.fallback_retries) if spec.fallback_retries else None
        llm = FallbackLLM(members, retry=retry)
    if spec.telemetry:
        options = spec.telemetry if isinstance(spec.telemetry, TelemetrySpec) else TelemetrySpec()
        llm = TelemetryLLM(
            llm,
            log_level=logging.getLevelName(options.log_level),
            include_content=options.include_content,
        )
    return llm


def _provider_ref(text: str) -> ProviderRefSpec:
    """``"provider"`` or ``"provider:model"`` (models may contain ``:`` and ``/``)."""
    provider, _, model = text.partition(":")
    return ProviderRefSpec(provider=provider.strip(), model=model.strip() or None)


def _provider_llm(
    ref: ProviderRefSpec, name: str | None, problems: list[str], where: str
) -> LLM | None:
    if ref.provider == "scripted" or ref.provider.startswith("mock_"):
        problems.append(f"{where}: a fallback member must be a real provider, not {ref.provider}")
        return None
    from cantrip.llm._config import load_llm

    try:
        return load_llm(
            ref.provider,
            ref.model,
            base_url=ref.base_url,
            api_key_env=ref.api_key_env,
            timeout_s=ref.timeout_s,
            compat=ref.compat,
            name=name,
        )
    except ConstructionError as exc:
        problems.extend(
            f"{where}: {p}"
            + (" -- or scripted, mock_openai" if p.startswith("unknown provider") else "")
            for p in exc.problems
        )
        return None


def _scripted_llm(spec: LLMSpec, problems: list[str], where: str) -> LLM | None:
    provider = spec.provider or "scripted"
    wire = provider.removeprefix("mock_") if provider.startswith("mock_") else None
    responses = list(spec.responses or [])
    if spec.raw_response is not None:
        responses.append({"raw_response": spec.raw_response})
    usage = None
    if spec.usage is not None:
        usage = Usage(
            spec.usage.get("prompt_tokens", 0),
            spec.usage.get("completion_tokens", 0),
            spec.usage.get("cached_tokens", 0),
        )
    if not spec.record_inputs:
        problems.append(
            f"{where}: record_inputs = false is not supported -- a scripted LLM always "
            "records the queries it receives"
        )
    if spec.retry_behavior and not any("error" in r for r in responses):
        problems.append(f"{where}: retry_behavior is set but the script has no error entry")
    try:
        return ScriptedLLM(
            responses,
            name=spec.name or where,
            usage=usage,
            provider=wire,
            latency_s=spec.latency_ms / 1000.0,
            medium_hint=_LLM_TYPE_MEDIUM.get(spec.type) if spec.type else None,
            per_entity=spec.script != "shared",
        )
    except ConstructionError as exc:
        problems.extend(f"{where}: {p}" for p in exc.problems)
        return None


def _build_identity(spec: IdentitySpec | None) -> Identity:
    if spec is None:
        return Identity()
    return Identity(
        system_prompt=spec.system_prompt,
        temperature=spec.temperature,
        top_p=spec.top_p,
        max_tokens=spec.max_tokens,
        stop=tuple(spec.stop),
        seed=spec.seed,
        tool_choice=spec.tool_choice,
        extra=(
            {**spec.extra, "reasoning_effort": spec.reasoning_effort}
            if spec.reasoning_effort is not None
            else spec.extra
        ),
    )


def _resolve_medium(spec: CircleSpec, strict: bool, problems: list[str]) -> Medium | None:
    declared = {
        key: value
        for key, value in (
            ("medium", spec.medium),
            ("type", spec.type),
            ("circle_type", spec.circle_type),
        )
        if value is not None
    }
    canonical = {key: MEDIUM_ALIASES.get(value, value) for key, value in declared.items()}
    if len(set(canonical.values())) > 1:
        listed = ", ".join(f"{k}={v!r}" for k, v in declared.items())
        problems.append(f"circle must declare exactly one medium; these disagree: {listed}")
        return None
    for key, name in canonical.items():
        if name not in MEDIUM_ALIASES.values():
            problems.append(
                f"circle: unknown medium {declared[key]!r} "
                f"(known: {', '.join(sorted(MEDIUM_ALIASES))})"
            )
            return None
        if name not in _MEDIUMS:
            problems.append(
                f"circle: medium {declared[key]!r} is not available in this build "
                f"(available: {', '.join(sorted(_MEDIUMS))})"
            )
            return None
    if not canonical:
        if strict:
            problems.append(
                "circle must declare a medium (MEDIUM-1): medium = "
                + " | ".join(f'"{m}"' for m in sorted(_MEDIUMS))
            )
            return None
        return conversation
    return _MEDIUMS[next(iter(canonical.values()))]()


def _with_isolation(medium: Medium, spec: CircleSpec, problems: list[str]) -> Medium:
    """The bash medium's ``isolation``/``network`` keys (issue 13, item 7)."""
    if not isinstance(medium, BashMedium):
        problems.append(
            f"circle: isolation and network apply to the bash medium, not {medium.name}"
        )
        return medium
    changes: dict[str, Any] = {}
    if spec.isolation is not None:
        changes["isolation"] = spec.isolation
    if spec.network is not None:
        changes["network"] = spec.network
    try:
        return attrs.evolve(medium, **changes)
    except ConstructionError as exc:
        problems.append(f"circle: {exc}")
        return medium


def _with_loom(medium: Medium, expose: bool, problems: list[str]) -> Medium:
    if attrs.has(type(medium)) and hasattr(medium, "expose_loom"):
        evolved: Medium = attrs.evolve(medium, expose_loom=expose)  # type: ignore[misc]
        return evolved
    if expose:
        problems.append(f"circle: the {medium.name} medium cannot expose the loom (expose_loom)")
    return medium


def protected_files(spec_file: Path | None, loom_file: str | Path | None) -> tuple[str, ...]:
    """What file gates may not read by default (issue 21): the spec file, and the
    loom with its SQLite companions (write-ahead log, shared memory, rollback journal)."""
    found: list[str] = []
    if spec_file is not None:
        found.append(str(Path(spec_file).resolve()))
    if loom_file is not None:
        loom = Path(loom_file).resolve()
        found.extend(str(loom) + suffix for suffix in ("", "-wal", "-shm", "-journal"))
    return tuple(found)


def _build_gate(
    spec: str | GateSpec,
    problems: list[str],
    *,
    base_dir: Path | None,
    fs_root: Path | None,
    hidden: tuple[str, ...] = (),
) -> Gate | None:
    if isinstance(spec, str):
        spec = GateSpec(name=spec)
    is_fixture = spec.behavior is not None or spec.stateful or spec.result is not None
    builtin = builtin_gates.BUILTIN.get(spec.name)
    if builtin is None:
        for candidate in builtin_gates.BUILTIN.values():
            if spec.name in candidate.aliases:
                builtin = candidate  # aliases normalize to the canonical gate (D-002)
    if is_fixture or builtin is None:
        if not is_fixture:
            names = [
                *builtin_gates.BUILTIN,
                *(a for g in builtin_gates.BUILTIN.values() for a in g.aliases),
            ]
            hint = did_you_mean(spec.name, names) or (
                f" (built-in gates: {', '.join(sorted(builtin_gates.BUILTIN))}; or declare a "
                "fixture gate with result/behavior)"
            )
            problems.append(f"unknown gate {spec.name!r}{hint}")
            return None
        if spec.dependencies:
            problems.append(f"gate {spec.name!r}: fixture gates take no dependencies")
        try:
            g = fixture_gate(
                spec.name,
                behavior=spec.behavior,
                result=spec.result,
                error=spec.error,
                delay_ms=spec.delay_ms,
                stateful=spec.stateful,
                parameters=spec.parameters,
                description=spec.description,
            )
        except ConstructionError as exc:
            problems.extend(exc.problems)
            return None
        return g.with_options(ephemeral=spec.ephemeral)
    g = builtin
    if spec.parameters is not None:
        declared = set((spec.parameters.get("properties") or {}).keys())
        actual = set((g.parameters.get("properties") or {}).keys())
        if not declared <= actual:
            problems.append(
                f"gate {spec.name!r}: declared parameters {sorted(declared - actual)} "
                f"are not parameters of the gate (it takes {sorted(actual)})"
            )
    if spec.description:
        g = g.with_options(description=spec.description)
    if spec.ephemeral:
        g = g.with_options(ephemeral=True)
    hints = get_type_hints(g.fn)
    values = {
        name: _path(value, base_dir, fs_root) if hints.get(name) is Path else value
        for name, value in spec.dependencies.items()
    }
    for name in g.missing_dependencies:
        # A path dependency left unset is the document's own folder.
        if hints.get(name) is Path and name not in values and base_dir is not None:
            values[name] = base_dir
    if "hidden" in g.dependencies and "hidden" not in spec.dependencies and hidden:
        values["hidden"] = hidden  # a spec that sets hidden (even to []) decides itself
    if values:
        try:
            g = g.bind(**values)
        except ConstructionError as exc:
            problems.extend(exc.problems)
            return None
    return g


def _path(value: Any, base_dir: Path | None, fs_root: Path | None = None) -> Path:
    path = Path(str(value))
    if fs_root is not None:
        return fs_root / path.relative_to(path.anchor) if path.is_absolute() else fs_root / path
    if not path.is_absolute() and base_dir is not None:
        return base_dir / path
    return path


def _build_retry(spec: RetrySpec | None) -> RetryPolicy:
    if spec is None:
        return RetryPolicy()
    return RetryPolicy(
        max_retries=spec.max_retries,
        retryable_status_codes=frozenset(spec.retryable_status_codes),
        base_delay=spec.base_delay,
        max_delay=spec.max_delay,
    )


def _pydantic_problems(exc: pydantic.ValidationError) -> list[str]:
    out = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            key = str(error["loc"][-1])
            out.append(f"unknown key {where!r}{did_you_mean(key, _keys_at(error['loc'][:-1]))}")
        elif error["type"] == "missing":
            out.append(f"missing key {where!r}")
        else:
            out.append(f"{where}: {error['msg']}")
    return out


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` of a :class:`SpecDocument` accepts (names and
    aliases), for a "did you mean"; empty where the place has no fixed keys."""
    current: Any = SpecDocument
    for part in loc:
        model = _model_in(current)
        field = None
        if model is not None and isinstance(part, str):
            field = model.model_fields.get(part) or next(
                (f for f in model.model_fields.values() if f.alias == part), None
            )
        if field is not None:
            current = field.annotation
        # else a list index, a dict key or a union member's tag: the same type goes on
    model = _model_in(current)
    if model is None:
        return []
    return [
        name
        for key, field in model.model_fields.items()
        for name in (key, field.alias)
        if name is not None
    ]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model in a type (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
