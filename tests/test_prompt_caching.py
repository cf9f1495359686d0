"""Prompt caching: Anthropic breakpoints read back turn after turn, OpenAI cache keys, costs.

The Anthropic fake accounts the cache the way the API does: the prefix up to
a ``cache_control`` breakpoint is written once and read by a later request
whose prefix is byte-identical. A cache read on every turn after the first is
therefore proof that cantrip's rendering keeps the prefix stable (replayed
thinking included) and moves the end breakpoint along.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_providers import Answer, Call, isolate, running
from fake_reasoning import running_reasoning

import cantrip
from cantrip.llm import Message, ToolDefinition
from cantrip.llm._telemetry import config_pricing
from gates import done, echo

ECHO = ToolDefinition(
    "echo", "Return the text.", {"type": "object", "properties": {"text": {"type": "string"}}}
)
LOOP = [
    Answer(thinking="First echo.", calls=(Call("echo", {"text": "one"}),)),
    Answer(thinking="Second echo.", calls=(Call("echo", {"text": "two"}),)),
    Answer(thinking="Finish.", calls=(Call("done", {"answer": "finished"}),)),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def spell(llm: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(
            system_prompt="You are a careful test entity. " * 20, extra={"reasoning_effort": "low"}
        ),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(5)]),
    )


def marked(body: dict[str, Any]) -> list[str]:
    """Where the request's cache breakpoints are."""
    out = [f"tool:{t['name']}" for t in body.get("tools", ()) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        out += ["system" for b in system if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        for block in message["content"] if isinstance(message["content"], list) else ():
            if "cache_control" in block:
                out.append(f"messages.{i}:{block['type']}")
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_breakpoints_are_read_back_every_turn(stream: bool) -> None:
    async with running_reasoning("anthropic", LOOP) as (fake, llm):
        result = await spell(llm).cast_async("go", on_event=(lambda e: None) if stream else None)
    assert result.result == "finished"
    bodies = [r.json() for r in fake.requests]
    assert marked(bodies[0]) == ["tool:echo", "system", "messages.0:text"]
    assert marked(bodies[2]) == ["tool:echo", "system", "messages.4:tool_result"]
    cached = [t.metadata.tokens_cached for t in result.turns]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert cached[2] > cached[1]  # the moving end breakpoint: more is read each turn
    assert result.turns[0].metadata.tokens_cache_write > 0
    assert result.usage.cache_write_tokens == sum(
        t.metadata.tokens_cache_write for t in result.turns
    )
    # Cost prices reads, writes and fresh input apart.
    pricing = config_pricing("anthropic", "claude-sonnet-5-5")
    assert pricing is not None
    usage = result.usage
    fresh = usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
    expected = (
        fresh * 2.00
        + usage.cached_tokens * 0.10
        + usage.cache_write_tokens * 2.50
        + usage.completion_tokens * 10.00
    ) / 1e6
    assert pricing.cost(usage) == pytest.approx(expected)


async def test_caching_can_be_turned_off() -> None:
    async with running_reasoning("anthropic", LOOP[:1], compat={"prompt_cache": False}) as (
        fake,
        llm,
    ):
        await llm.query([Message("system", "sys"), Message("user", "go")], [ECHO])
    body = fake.requests[0].json()
    assert "cache_control" not in json.dumps(body) and body["system"] == "sys"


async def test_openai_gets_one_cache_key_per_identity_and_local_servers_none() -> None:
    answers = [Answer(text="ok"), Answer(text="ok"), Answer(text="ok")]
    a = [Message("system", "identity A"), Message("user", "one")]
    b = [Message("system", "identity B"), Message("user", "one")]
    async with running("openai", answers) as (fake, llm):
        await llm.query(a, [ECHO])
        await llm.query([*a, Message("assistant", "ok"), Message("user", "two")], [ECHO])
        await llm.query(b, [ECHO])
    keys = [r.json()["prompt_cache_key"] for r in fake.requests]
    assert keys[0] == keys[1] != keys[2]
    async with running("ollama", [Answer(text="ok")], model="llama3.1:8b") as (fake, llm):
        await llm.query(a, [ECHO])
    assert "prompt_cache_key" not in fake.requests[0].json()
