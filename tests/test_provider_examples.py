"""The example spec of each provider (examples/providers/) builds the LLM it says it does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_providers import isolate

from cantrip.spec import build_cantrip, load_spec_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "providers"
EXPECTED = {
    "anthropic.toml": ("AnthropicAdapter", "claude-sonnet-5-5", "medium"),
    "openai_responses.toml": ("ResponsesAdapter", "gpt-5-mini", "low"),
    "openai.toml": ("OpenAIAdapter", "gpt-5-mini", "low"),
    "gemini.toml": ("GeminiAdapter", "gemini-3.5-flash", "low"),
    "openrouter.toml": ("OpenRouterAdapter", "anthropic/claude-sonnet-4", None),
    "ollama.toml": ("LocalAdapter", "llama3.1:8b", None),
}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.toml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_builds_its_provider(name: str) -> None:
    adapter, model, effort = EXPECTED[name]
    spell = build_cantrip(load_spec_file(EXAMPLES / name), base_dir=EXAMPLES)
    llm: Any = spell.llm
    while not hasattr(llm, "model") and hasattr(llm, "inner"):
        llm = llm.inner  # through the retry wrapper
    assert type(llm).__name__ == adapter and llm.model == model
    assert spell.identity.extra.get("reasoning_effort") == effort
