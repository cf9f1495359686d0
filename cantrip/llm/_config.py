"""Provider configuration: one TOML file per provider, keys only in the environment.

The files shipped in ``cantrip/llm/providers/*.toml`` describe each provider
(which adapter speaks its wire format, base URL, the *name* of the environment
variable holding its key, compatibility flags) and its models (context window,
output limit, capabilities, prices per million tokens). A user directory --
``$CANTRIP_PROVIDERS_DIR``, else ``$XDG_CONFIG_HOME/cantrip/providers``, else
``~/.config/cantrip/providers`` -- may override any of it or add providers:
``[provider]`` keys override key by key, ``[models.X]`` tables model by model.

Provider names are checked against ``^[a-z][a-z0-9_]*$`` before any path is
built from them (no traversal). A key is never read from a file: a
``[provider.headers]`` table that tries to carry one is refused. A provider
whose key variable is unset fails at construction with a
:class:`~cantrip.ConstructionError` naming the variable, before any request.

Nothing here imports httpx; adapters are imported only by :func:`load_llm`.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from cantrip._errors import ConstructionError
from cantrip._redact import get_logger, register_secret_env

if TYPE_CHECKING:
    import httpx

    from cantrip.llm._contract import LLM

SHIPPED_DIR = Path(__file__).parent / "providers"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
ADAPTERS = frozenset({"openai", "openai_responses", "anthropic", "gemini", "openrouter", "local"})
"""Adapter modules in :mod:`cantrip.llm.providers` a config may name."""
log = get_logger("cantrip.llm.config")
_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compat(_Strict):
    """How an OpenAI-compatible endpoint deviates (and the few flags others use)."""

    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """Which request field carries the output limit."""
    stream_usage: bool = True
    """Whether to ask for usage in the stream (``stream_options.include_usage``)."""
    tool_ids: Literal["openai", "mistral", "kimi"] = "openai"
    """Which tool-id constraints the transcript renderer must project onto."""
    system_role: Literal["system", "developer"] = "system"
    """The role system messages are sent as (``developer`` for OpenAI reasoning models)."""
    thinking_format: Literal["reasoning_content", "reasoning", "think_tags", "none"] = (
        "reasoning_content"
    )
    """Where reasoning arrives: a message field, or ``<think>`` tags in the text."""
    tool_choice: bool = True
    """Whether the endpoint accepts ``tool_choice`` at all."""
    tool_choice_required: bool = True
    """Whether it can force a tool call; if not, ``required`` is simulated (LLM-5)."""
    send_thinking: bool = False
    """Whether earlier reasoning is sent back (as ``reasoning_content``)."""
    synthesize_tool_ids: bool = False
    """Give tool calls that arrive without an id a deterministic one (else LLM-4 refuses)."""
    tool_message_name: bool = False
    """Whether tool-result messages carry the gate's ``name`` (Mistral-style servers)."""
    thinking_mode: Literal["budget", "adaptive"] = "budget"
    """How ``reasoning_effort`` turns Anthropic thinking on: a token budget
    (``thinking.type = "enabled"``, older models) or ``"adaptive"`` with an
    ``output_config.effort`` (current models refuse a budget)."""
    prompt_cache: bool = False
    """Ask for prompt caching: Anthropic ``cache_control`` breakpoints, OpenAI
    ``prompt_cache_key`` (a server that does not know the field must keep it off)."""


class RateLimitConfig(_Strict):
    requests_per_minute: float = Field(gt=0)
    burst: int | None = Field(default=None, ge=1)


class ModelInfo(_Strict):
    """What is known about one model (D-023); prices are USD per million tokens."""

    context_window: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    supports_tools: bool = True
    supports_vision: bool = False
    supports_thinking: bool = False
    input_modalities: tuple[str, ...] = ("text",)
    cost_input_per_1m: float | None = Field(default=None, ge=0)
    cost_output_per_1m: float | None = Field(default=None, ge=0)
    cost_cache_read_per_1m: float | None = Field(default=None, ge=0)
    cost_cache_write_per_1m: float | None = Field(default=None, ge=0)
    compat: dict[str, Any] = Field(default_factory=dict)
    """Compatibility flags that differ for this model (e.g. ``system_role``)."""


class ProviderSettings(_Strict):
    """``[provider]``: how to reach it (D-024)."""

    adapter: str
    api_format: Literal[
        "openai-chat", "openai-responses", "anthropic-messages", "gemini-generate-content"
    ]
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_required: bool = True
    default_model: str | None = None
    default_embedding_model: str | None = None
    """The model :func:`cantrip.llm.embedder_from_config` uses when none is named."""
    default_max_tokens: int | None = Field(default=None, ge=1)
    """Output limit sent when neither the identity nor the model gives one (Anthropic needs one)."""
    timeout_s: float = Field(default=120.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    compat: Compat = Field(default_factory=Compat)
    rate_limit: RateLimitConfig | None = None

    @pydantic.field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str) -> str:
        if value not in ADAPTERS:
            raise ValueError(f"unknown adapter {value!r} (known: {', '.join(sorted(ADAPTERS))})")
        return value

    @pydantic.field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @pydantic.field_validator("headers")
    @classmethod
    def _no_secret_headers(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in value if k.lower() in _SECRET_HEADERS)
        if bad:
            raise ValueError(
                f"headers {bad} carry credentials; keys live in the environment "
                "(name the variable in api_key_env)"
            )
        return value


class ProviderConfig(_Strict):
    """One provider's whole file, after user overrides are merged in."""

    name: str
    provider: ProviderSettings
    models: dict[str, ModelInfo] = Field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def model_info(self, model: str) -> ModelInfo:
        """The model's metadata; an unlisted model gets none (lists go stale)."""
        return self.models.get(model) or ModelInfo()

    def compat_for(self, model: str, overrides: Mapping[str, Any] | None = None) -> Compat:
        data = self.provider.compat.model_dump()
        data.update(self.model_info(model).compat)
        data.update(overrides or {})
        try:
            return Compat.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ConstructionError(
                [f"provider {self.name!r}: compat: {e['msg']} ({e['loc']})" for e in exc.errors()]
            ) from None


def user_dir() -> Path:
    explicit = os.environ.get("CANTRIP_PROVIDERS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "cantrip" / "providers"


def check_name(name: str) -> str:
    """A provider name that is safe to build a path from (D-035, D-045)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConstructionError(
            f"invalid provider name {name!r}: use lowercase letters, digits and underscores, "
            "starting with a letter (at most 64 characters)"
        )
    return name


_CACHE: dict[tuple[str, str], ProviderConfig] = {}
_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget parsed configs (tests; after editing files). Also clears rate-limit buckets."""
    with _LOCK:
        _CACHE.clear()
        _BY_ENV.clear()
    from cantrip.llm._ratelimit import clear_buckets

    clear_buckets()


def available_providers() -> list[str]:
    names: set[str] = set()
    for folder in (SHIPPED_DIR, user_dir()):
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.toml") if NAME_PATTERN.fullmatch(p.stem))
    return sorted(names)


_FOLDER_ENV = ("CANTRIP_PROVIDERS_DIR", "XDG_CONFIG_HOME", "HOME")
"""The variables :func:`user_dir` depends on."""
_BY_ENV: dict[tuple[str, tuple[str | None, ...]], ProviderConfig] = {}
"""The cache by name and those variables' values: each turn's cost looks its model's
prices up here, and building the folder's path costs more than the rest of the lookup."""


def load_provider_config(name: str) -> ProviderConfig:
    """The merged configuration of provider ``name`` (cached)."""
    get = os.environ.get  # the three of _FOLDER_ENV, spelled out: a generator costs more
    env_key = (name, (get("CANTRIP_PROVIDERS_DIR"), get("XDG_CONFIG_HOME"), get("HOME")))
    fast = _BY_ENV.get(env_key)
    if fast is not None:
        return fast
    check_name(name)
    folder = user_dir()
    key = (name, str(folder))
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        with _LOCK:
            _BY_ENV[env_key] = cached
        return cached
    merged: dict[str, Any] = {}
    sources: list[str] = []
    for path in (SHIPPED_DIR / f"{name}.toml", folder / f"{name}.toml"):
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConstructionError(f"{path}: cannot read provider config: {exc}") from None
        _merge(merged, data)
        sources.append(str(path))
    if not sources:
        known = ", ".join(available_providers()) or "none"
        raise ConstructionError(f"unknown provider {name!r} (available: {known})")
    try:
        config = ProviderConfig.model_validate({**merged, "name": name, "sources": sources})
    except pydantic.ValidationError as exc:
        raise ConstructionError(
            [
                f"{' + '.join(sources)}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors()
            ]
        ) from None
    if config.provider.api_key_env:
        # Any variable a loaded config names holds a secret, whether or not this
        # process ends up reading it (issue 21: the redactor knows them all).
        register_secret_env(config.provider.api_key_env)
    with _LOCK:
        _CACHE[key] = config
        _BY_ENV[env_key] = config
    return config


def _merge(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    """Later files win key by key in ``[provider]``, model by model in ``[models]``."""
    for section, value in data.items():
        if section == "provider" and isinstance(value, Mapping):
            target = into.setdefault("provider", {})
            for key, item in value.items():
                if key in ("compat", "headers") and isinstance(item, Mapping):
                    target[key] = {**target.get(key, {}), **item}
                else:
                    target[key] = item
        elif section == "models" and isinstance(value, Mapping):
            models = into.setdefault("models", {})
            for model, info in value.items():
                if isinstance(info, Mapping) and isinstance(models.get(model), Mapping):
                    models[model] = {**models[model], **info}
                else:
                    models[model] = info
        else:
            into[section] = value


def resolve_api_key(config: ProviderConfig, api_key_env: str | None = None) -> str | None:
    """The provider's key from its environment variable; refuses early when missing."""
    env = api_key_env or config.provider.api_key_env
    if env is None:
        if config.provider.api_key_required:
            raise ConstructionError(
                f"provider {config.name!r} needs an API key but names no variable for it "
                "(set api_key_env)"
            )
        return None
    register_secret_env(env)
    value = os.environ.get(env, "").strip()
    if not value:
        if config.provider.api_key_required:
            raise ConstructionError(
                f"provider {config.name!r} needs an API key: set the environment variable {env}"
            )
        return None
    return value


def load_llm(
    provider: str,
    model: str | None = None,
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
    timeout_s: float | None = None,
    compat: Mapping[str, Any] | None = None,
    name: str | None = None,
    client: httpx.AsyncClient | None = None,
    debug: bool | None = None,
) -> LLM:
    """A provider adapter, configured from its TOML and keyed from the environment.

    Everything is checked here -- the name, the config, the model, the key,
    the base URL -- so a bad configuration fails before any request. ``debug``
    logs the transcript diagnostics of every request (default: the
    ``CANTRIP_DEBUG_TRANSCRIPT`` environment variable).
    """
    config = load_provider_config(provider)
    model = model or config.provider.default_model
    if not model:
        raise ConstructionError(f"provider {provider!r} has no default model: name one (model=)")
    url = base_url or config.provider.base_url
    if not url:
        raise ConstructionError(f"provider {provider!r} has no base_url: give one")
    if not re.match(r"^https?://[^\s/]+", url):
        raise ConstructionError(f"provider {provider!r}: base_url {url!r} is not an http(s) URL")
    key = resolve_api_key(config, api_key_env)
    if config.models and model not in config.models:
        # Lists go stale faster than models appear: an unlisted model still works.
        log.warning(
            "provider %r: model %r is not in its catalogue (%s); it is used as given, "
            "with no context window and no cost figure",
            provider,
            model,
            " + ".join(config.sources),
        )
    module = importlib.import_module(f"cantrip.llm.providers.{config.provider.adapter}")
    # The adapter module is found by name (config -> module), so this layer never
    # imports the adapters' base, which itself reads the config types from here.
    adapter_cls: Any = module.ADAPTER
    adapter: LLM = adapter_cls(
        config,
        model,
        api_key=key,
        base_url=url,
        timeout_s=timeout_s,
        compat=config.compat_for(model, compat),
        name=name,
        client=client,
        debug=debug,
    )
    return adapter
