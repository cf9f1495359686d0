"""Reasoning artefacts through the command line and across provider switches.

``cantrip cast`` records a tool loop with reasoning in a loom file; a new
process (``cantrip invoke --resume``) continues the entity, and the Responses
fake -- which refuses a function call whose reasoning item is missing or
altered -- accepts the replayed history: the artefacts survived the restart.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_providers import Answer, Call, isolate, serve
from fake_reasoning import (
    REASONING_MODELS,
    REASONING_PREFIXES,
    FakeResponses,
    FakeThinkingAnthropic,
    FakeThinkingGemini,
)

from cantrip import Loom
from cantrip.llm import Message, Response, ToolDefinition, load_llm

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
EFFORT = {"reasoning_effort": "low"}
ECHO = ToolDefinition(
    "echo", "Return the text.", {"type": "object", "properties": {"text": {"type": "string"}}}
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def loop(word: str, n: int) -> list[Answer]:
    return [
        Answer(thinking=f"Echo {word} first ({n}).", calls=(Call("echo", {"text": word}),)),
        Answer(thinking=f"Done with {word}.", calls=(Call("done", {"answer": f"said {word}"}),)),
    ]


async def cantrip(*args: str, cwd: Path, stdin: str = "") -> Any:
    env = {**os.environ, "OPENAI_API_KEY": "test-key"}
    return await trio.run_process(
        [CANTRIP, *args],
        cwd=cwd,
        env=env,
        stdin=stdin.encode(),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


async def test_cast_then_invoke_resume_replays_reasoning_after_a_restart(tmp_path: Path) -> None:
    fake = FakeResponses([*loop("one", 1), *loop("two", 2)])
    async with serve(fake, "/v1") as url:
        spec = tmp_path / "spec.toml"
        spec.write_text(
            textwrap.dedent(
                f"""
                [llm]
                provider = "openai_responses"
                model = "gpt-5-mini"
                base_url = "{url}"

                [identity]
                system_prompt = "You are a test entity."
                reasoning_effort = "low"

                [circle]
                medium = "conversation"
                gates = ["done", "echo"]
                wards = [{{ max_turns = 5 }}]

                [loom]
                path = "loom.db"
                """
            )
        )
        first = await cantrip("cast", str(spec), "Say one.", "--json", cwd=tmp_path)
        assert first.returncode == 0, first.stderr.decode()
        assert json.loads(first.stdout)["result"] == "said one"
        loom = Loom.open(tmp_path / "loom.db")
        entity_id = loom.turns[0].entity_id
        assert all(t.reasoning for t in loom.turns)
        loom.close()
        # A new process: everything it knows about turn 1 comes from the loom file.
        again = await cantrip(
            "invoke", str(spec), "--resume", entity_id, cwd=tmp_path, stdin="Say two.\n"
        )
        assert again.returncode == 0, again.stderr.decode()
        assert "said two" in again.stdout.decode()
    assert len(fake.requests) == 4  # every request passed the fake's reasoning checks
    body = fake.requests[2].json()
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    replayed = [item for item in body["input"] if item.get("type") == "reasoning"]
    assert [item["id"] for item in replayed] == ["rs_0001", "rs_0002"]
    assert all(item["encrypted_content"] for item in replayed)


async def answer(llm: Any, history: list[Message]) -> Response:
    return await llm.query(history, [ECHO], extra=EFFORT)


def reply_and_result(response: Response, result: str) -> list[Message]:
    return [
        Message(
            "assistant",
            response.content,
            tool_calls=response.tool_calls,
            thinking=response.thinking,
            reasoning=response.reasoning,
        ),
        Message("tool", result, tool_call_id=response.tool_calls[0].id, name="echo"),
    ]


async def test_a_conversation_that_switches_provider_every_turn_stays_valid() -> None:
    """Anthropic -> Responses -> Gemini 3 -> Anthropic: each strict fake accepts its turn."""
    step = Answer(thinking="Keep going.", calls=(Call("echo", {"text": "x"}),))
    fakes = {
        "anthropic": FakeThinkingAnthropic([step, step]),
        "openai_responses": FakeResponses([step]),
        "gemini": FakeThinkingGemini([step]),
    }
    history = [Message("system", "sys"), Message("user", "go")]
    async with (
        serve(fakes["anthropic"], REASONING_PREFIXES["anthropic"]) as anthropic_url,
        serve(fakes["openai_responses"], REASONING_PREFIXES["openai_responses"]) as responses_url,
        serve(fakes["gemini"], REASONING_PREFIXES["gemini"]) as gemini_url,
    ):
        urls = {
            "anthropic": anthropic_url,
            "openai_responses": responses_url,
            "gemini": gemini_url,
        }
        llms = {
            name: load_llm(name, model=REASONING_MODELS[name], base_url=url)
            for name, url in urls.items()
        }
        try:
            for name in ("anthropic", "openai_responses", "gemini", "anthropic"):
                response = await answer(llms[name], history)
                assert {p.format for p in response.reasoning} == {llms[name].reasoning_format}
                history += reply_and_result(response, f"from {name}")
        finally:
            for llm in llms.values():
                await llm.aclose()
    # What each provider was sent holds only its own artefacts.
    responses_body = fakes["openai_responses"].requests[0].json()
    assert [i.get("type") for i in responses_body["input"] if i.get("type") == "reasoning"] == []
    assert "signature" not in json.dumps(responses_body)
    gemini_body = fakes["gemini"].requests[0].json()
    assert "encrypted_content" not in json.dumps(gemini_body)
    assert '"signature"' not in json.dumps(gemini_body)
    # Calls Gemini did not make carry Google's documented stand-in signature.
    model_turns = [c for c in gemini_body["contents"] if c["role"] == "model"]
    assert [c["parts"][0].get("thoughtSignature") for c in model_turns] == [
        "skip_thought_signature_validator"
    ] * 2
    last = fakes["anthropic"].requests[1].json()
    # The first Anthropic turn's thinking is back, signed, in its place; the others' are not.
    assistant_blocks = [m["content"] for m in last["messages"] if m["role"] == "assistant"]
    assert assistant_blocks[0][0]["type"] == "thinking"
    assert all(b["type"] != "thinking" for blocks in assistant_blocks[1:] for b in blocks)
    assert "thoughtSignature" not in json.dumps(last) and "encrypted_content" not in json.dumps(
        last
    )
