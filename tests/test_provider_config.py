"""Provider configuration (TOML, user overrides, keys from the environment) and spec files."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_providers import Answer, Call, FakeAnthropic, FakeOpenAI, Fault, isolate, running, serve

import cantrip
from cantrip import ConstructionError
from cantrip.llm import (
    FallbackLLM,
    RateLimitedLLM,
    ScriptedLLM,
    TelemetryLLM,
    available_providers,
    clear_cache,
    load_llm,
    load_provider_config,
)
from cantrip.llm._config import SHIPPED_DIR
from cantrip.spec import build_cantrip, parse_spec


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "user-providers"
    folder.mkdir()
    return folder


def test_shipped_providers_load_and_validate() -> None:
    names = available_providers()
    for name in ("openai", "anthropic", "gemini", "openrouter", "local", "ollama", "lmstudio"):
        assert name in names
    for name in names:
        config = load_provider_config(name)
        assert config.provider.base_url and config.provider.api_key_env
    openai = load_provider_config("openai")
    mini = openai.models["gpt-4o-mini"]
    assert mini.context_window == 128000 and mini.cost_input_per_1m == 0.15
    assert openai.compat_for("o3-mini").system_role == "developer"
    assert openai.compat_for("gpt-4o-mini").system_role == "system"


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "openai/../x", "OpenAI", "open-ai", "", "a" * 65, "x.toml", "1st"]
)
def test_provider_names_are_validated_before_any_path_is_built(name: str) -> None:
    with pytest.raises(ConstructionError, match="invalid provider name"):
        load_provider_config(name)


def test_unknown_provider_lists_the_available_ones() -> None:
    with pytest.raises(ConstructionError, match=r"unknown provider 'nope' \(available: .*openai"):
        load_llm("nope")


def test_a_missing_key_names_the_variable_before_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ConstructionError, match="set the environment variable ANTHROPIC_API_KEY"):
        load_llm("anthropic")
    monkeypatch.setenv("MY_TEAM_KEY", "team-key")
    llm = load_llm("anthropic", api_key_env="MY_TEAM_KEY")
    assert llm.provider == "anthropic"


def test_keys_never_appear_in_reprs_or_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-abcdefghijklmnop")
    llm = load_llm("openai")
    assert "sk-proj" not in repr(llm) and "sk-proj" not in repr(llm.config)
    assert "sk-proj" not in repr(vars(llm.config))


def test_user_files_override_and_add(user_dir: Path) -> None:
    (user_dir / "openai.toml").write_text(
        '[provider]\nbase_url = "https://proxy.example/v1"\ndefault_model = "gpt-4.1"\n'
        "[provider.compat]\nstream_usage = false\n"
        '[models."gpt-4.1"]\ncost_input_per_1m = 1.0\n'
        '[models."my-finetune"]\ncontext_window = 1000\n'
    )
    (user_dir / "groq.toml").write_text(
        '[provider]\nadapter = "openai"\napi_format = "openai-chat"\n'
        'base_url = "https://api.groq.com/openai/v1"\napi_key_env = "GROQ_API_KEY"\n'
    )
    clear_cache()
    config = load_provider_config("openai")
    assert config.provider.base_url == "https://proxy.example/v1"
    assert config.provider.api_key_env == "OPENAI_API_KEY"  # untouched keys survive
    assert config.provider.compat.stream_usage is False
    assert config.provider.compat.max_tokens_field == "max_completion_tokens"
    assert config.models["gpt-4.1"].cost_input_per_1m == 1.0
    assert config.models["gpt-4.1"].context_window == 1047576  # merged model by model
    assert config.models["my-finetune"].context_window == 1000
    assert len(config.sources) == 2
    assert "groq" in available_providers()
    assert load_provider_config("groq").provider.adapter == "openai"


def test_keys_in_files_are_refused(user_dir: Path) -> None:
    (user_dir / "leaky.toml").write_text(
        '[provider]\nadapter = "openai"\napi_format = "openai-chat"\nbase_url = "http://x/v1"\n'
        'api_key_env = "LEAKY_KEY"\n[provider.headers]\nAuthorization = "Bearer sk-123"\n'
    )
    (user_dir / "inline.toml").write_text(
        '[provider]\nadapter = "openai"\napi_format = "openai-chat"\napi_key = "sk-123"\n'
    )
    clear_cache()
    with pytest.raises(ConstructionError, match="carry credentials"):
        load_provider_config("leaky")
    with pytest.raises(ConstructionError, match="api_key"):
        load_provider_config("inline")


def test_broken_configs_report_file_and_key(user_dir: Path) -> None:
    (user_dir / "broken.toml").write_text('[provider]\nadapter = "soap"\napi_format = "x"\n')
    (user_dir / "garbled.toml").write_text("[provider\n")
    clear_cache()
    with pytest.raises(ConstructionError) as info:
        load_provider_config("broken")
    assert "broken.toml" in str(info.value) and "provider.adapter" in str(info.value)
    assert "provider.api_format" in str(info.value)
    with pytest.raises(ConstructionError, match="cannot read provider config"):
        load_provider_config("garbled")


def test_bad_base_urls_and_models_are_refused_early() -> None:
    with pytest.raises(ConstructionError, match="not an http"):
        load_llm("openai", base_url="ftp://example.com")
    with pytest.raises(ConstructionError, match="no default model"):
        load_llm("ollama")
    with pytest.raises(ConstructionError, match="compat"):
        load_llm("ollama", "m", compat={"max_tokens_field": "tokens"})


def test_importing_cantrip_loads_no_provider_code() -> None:
    code = (
        "import sys, cantrip, cantrip.llm\n"
        "heavy = [m for m in sys.modules if m == 'httpx' or m.startswith('cantrip.llm.providers')"
        " or m in ('cantrip.llm._config', 'cantrip.llm._sse')]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_adapters_are_imported_on_first_use() -> None:
    code = (
        "import sys, os\n"
        "os.environ['OPENAI_API_KEY'] = 'k'\n"
        "from cantrip.llm import load_llm\n"
        "load_llm('openai')\n"
        "print(sorted(m for m in sys.modules if m.startswith('cantrip.llm.providers.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "cantrip.llm.providers.openai" in out.stdout
    assert "anthropic" not in out.stdout and "gemini" not in out.stdout


def test_shipped_configs_are_package_files() -> None:
    assert (SHIPPED_DIR / "openai.toml").is_file()


# -- spec files -------------------------------------------------------------------------------


def spec(llm: dict[str, Any]) -> dict[str, Any]:
    return {
        "llm": llm,
        "circle": {
            "medium": "conversation",
            "gates": ["done", "echo"],
            "wards": [{"max_turns": 4}],
        },
    }


def test_a_spec_file_names_a_provider_and_model() -> None:
    spell = build_cantrip(parse_spec(spec({"provider": "openai", "model": "gpt-4o-mini"})))
    assert spell.llm.name == "openai:gpt-4o-mini"
    assert type(spell.llm).__name__ == "OpenAIAdapter"


def test_spec_problems_are_reported_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    doc = parse_spec(
        spec(
            {
                "provider": "gemini",
                "responses": [{"content": "x"}],
                "fallback": ["nope", "anthropic:claude-3-5-haiku-20241022"],
            }
        )
    )
    with pytest.raises(ConstructionError) as info:
        build_cantrip(doc)
    problems = info.value.problems
    assert any("GEMINI_API_KEY" in p for p in problems)
    assert any("'responses' applies only to a scripted LLM" in p for p in problems)
    assert any("fallback[0]" in p and "unknown provider 'nope'" in p for p in problems)


def test_scripted_specs_are_unchanged() -> None:
    spell = build_cantrip(parse_spec(spec({"responses": [{"content": "hi"}]})))
    assert isinstance(spell.llm, ScriptedLLM)
    mock = build_cantrip(parse_spec(spec({"provider": "mock_openai", "responses": []})))
    assert isinstance(mock.llm, ScriptedLLM) and mock.llm.provider == "openai"
    with pytest.raises(ConstructionError, match="'base_url' applies only to a real provider"):
        build_cantrip(parse_spec(spec({"responses": [], "base_url": "http://x"})))


def test_a_spec_builds_the_whole_stack() -> None:
    doc = parse_spec(
        spec(
            {
                "provider": "openai",
                "model": "gpt-4o-mini",
                "fallback": [
                    "anthropic:claude-3-5-haiku-20241022",
                    {"provider": "ollama", "model": "llama3.1:8b"},
                ],
                "fallback_retries": 1,
                "rate_limit": {"requests_per_minute": 120, "burst": 5},
                "telemetry": {"log_level": "DEBUG"},
            }
        )
    )
    llm = build_cantrip(doc).llm
    assert isinstance(llm, TelemetryLLM) and llm.log_level == logging.DEBUG
    assert isinstance(llm.inner, FallbackLLM)
    chain = llm.inner.chain
    assert [m.name for m in chain] == [
        "openai:gpt-4o-mini",
        "anthropic:claude-3-5-haiku-20241022",
        "ollama:llama3.1:8b",
    ]
    assert all(isinstance(m, RateLimitedLLM) for m in chain)
    assert llm.inner.retry is not None and llm.inner.retry.max_retries == 1


async def test_a_spec_file_cast_against_a_fake_provider(tmp_path: Path) -> None:
    script = [
        Answer(calls=(Call("echo", {"text": "hi"}),)),
        Answer(calls=(Call("done", {"answer": "from the spec"}),)),
    ]
    fake = FakeOpenAI(script)
    async with serve(fake, "/v1") as url:
        path = tmp_path / "spell.toml"
        path.write_text(
            f'[llm]\nprovider = "openai"\nmodel = "gpt-4.1-mini"\nbase_url = "{url}"\n'
            '[identity]\nsystem_prompt = "be brief"\ntemperature = 0.1\nmax_tokens = 50\n'
            '[circle]\nmedium = "conversation"\ngates = ["done", "echo"]\n'
            "wards = [{max_turns = 4}]\n"
        )
        spell = build_cantrip(cantrip.spec.load_spec_file(path))
        outcome = await spell.cast_async("go")
    assert outcome.result == "from the spec"
    body = fake.requests[0].json()
    assert body["model"] == "gpt-4.1-mini" and body["temperature"] == 0.1
    assert body["max_completion_tokens"] == 50


async def test_a_spec_with_fallback_answers_from_the_second_provider() -> None:
    primary = FakeOpenAI([Fault(401, "bad key")])
    backup = FakeAnthropic([Answer(calls=(Call("done", {"answer": "backup"}),))])
    async with serve(primary, "/v1") as first, serve(backup, "/v1") as second:
        doc = parse_spec(
            spec(
                {
                    "provider": "openai",
                    "base_url": first,
                    "fallback": [{"provider": "anthropic", "base_url": second}],
                }
            )
        )
        outcome = await build_cantrip(doc).cast_async("go")
    assert outcome.result == "backup"
    assert outcome.turns[0].metadata.provider == "anthropic"


async def test_running_helper_cleans_up() -> None:
    async with running("openai", [Answer(text="x")]) as (_, llm):
        assert (await llm.query([cantrip.Message("user", "hi")])).content == "x"


def test_the_models_window_reaches_the_folding_trigger(
    user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding triggers from provider metadata without any folding policy (PROD-4)."""
    from cantrip._folding import effective_policy

    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-abcdefghijklmnop")
    (user_dir / "openai.toml").write_text('[models."tiny"]\ncontext_window = 1000\n')
    clear_cache()
    adapter = load_llm("openai", "tiny")
    assert adapter.context_window == 1000
    stacked = cantrip.RetryPolicy()  # the entity wraps every LLM in the retry layer
    from cantrip.llm._retry import RetryingLLM

    policy = effective_policy(None, RetryingLLM(adapter, stacked))
    assert policy is not None and policy.context_window == 1000
    assert policy.should_fold(turns_in_view=3, estimated_tokens=801)
    assert not policy.should_fold(turns_in_view=3, estimated_tokens=799)


def test_a_missing_key_is_the_one_problem_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    doc = parse_spec(
        {
            "llm": {"provider": "openai", "model": "gpt-4o-mini"},
            "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
        }
    )
    with pytest.raises(ConstructionError) as info:
        build_cantrip(doc)
    assert info.value.problems == [
        "llm: provider 'openai' needs an API key: set the environment variable OPENAI_API_KEY"
    ]
