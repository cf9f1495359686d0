"""An ``[llm]`` table (or one of ``[llms]``) to an :class:`~cantrip.llm.LLM`.

A scripted LLM, or a real provider with the wrappers the table asks for: the stack
built is ``telemetry -> fallback -> rate limit -> adapter`` (the cantrip adds its retry
policy around it). Real providers are checked completely here (name, config, model,
key variable), so a bad spec fails before any request. Problems are appended to the
caller's list, each prefixed with where the table is, so that a document's problems
are reported together. Eval suites' judges use the same table (``cantrip.evals``).
"""

from __future__ import annotations

import logging

from cantrip._errors import ConstructionError
from cantrip.llm._contract import LLM, Usage
from cantrip.llm._retry import RetryPolicy
from cantrip.llm._scripted import ScriptedLLM
from cantrip.spec._tables import LLMSpec, ProviderRefSpec, TelemetrySpec

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

_LLM_TYPE_MEDIUM = {
    "code_circle": "code",
    "tool_calling": "conversation",
    "conversation": "conversation",
}
"""What an LLM spec's ``type`` says about the medium its responses are written for."""


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
