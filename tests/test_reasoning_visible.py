"""Thinking is visible as it streams and in the loom; the artefacts themselves stay opaque.

A redacting Anthropic fake adds a ``redacted_thinking`` block (its ``data`` an
opaque token) to every answer, and the Responses fake an encrypted reasoning
item: those bytes must reach the loom and the next request, and never a
person -- not ACP's ``agent_thought_chunk``, not the HTTP SSE stream, not
``cantrip loom show``. A fork and an export keep them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_providers import Answer, Call, isolate, serve
from fake_reasoning import REASONING_MODELS, REASONING_PREFIXES, FakeThinkingAnthropic
from test_acp import started, updates, validate
from test_http import serving, sse_events

import cantrip
from cantrip import Loom
from cantrip.llm import load_llm
from cantrip.loom._export import export_jsonl, load_jsonl
from gates import done, echo

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
SCRIPT = [
    Answer(thinking="Echo it first.", calls=(Call("echo", {"text": "hi"}),)),
    Answer(thinking="Now finish.", calls=(Call("done", {"answer": "finished"}),)),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def spell(llm: Any, loom: Loom | None = None) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="sys", extra={"reasoning_effort": "low"}),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(4)]),
        loom=loom if loom is not None else Loom(),
    )


def opaque_tokens(fake: FakeThinkingAnthropic) -> list[str]:
    """The redacted blocks' data the fake issued (what must never be shown)."""
    return [f"redacted-{n}:{fake.signer.sign(f'redacted-{n}')}" for n in (1, 2)]


async def test_acp_streams_thoughts_but_never_the_redacted_data(nursery: trio.Nursery) -> None:
    fake = FakeThinkingAnthropic(SCRIPT, redact=True)
    async with serve(fake, REASONING_PREFIXES["anthropic"]) as url:
        llm = load_llm("anthropic", model=REASONING_MODELS["anthropic"], base_url=url)
        client = await started(nursery, spell(llm))
        sid = await client.session()
        response = await client.call("session/prompt", sessionId=sid, prompt="go")
        await llm.aclose()
    assert response["result"]["stopReason"] == "end_turn"
    validate(client.notes)
    thoughts = "".join(
        u["content"]["text"]
        for u in updates(client.notes)
        if u["sessionUpdate"] == "agent_thought_chunk"
    )
    assert thoughts == "Echo it first.Now finish."
    shown = json.dumps(client.notes)
    assert not any(token in shown for token in opaque_tokens(fake))
    assert "signature" not in shown
    assert len(fake.requests) == 2  # the redacted block went back to the provider, verified


async def test_http_sse_streams_thinking_deltas_but_never_the_redacted_data() -> None:
    fake = FakeThinkingAnthropic(SCRIPT, redact=True)
    async with serve(fake, REASONING_PREFIXES["anthropic"]) as url:
        llm = load_llm("anthropic", model=REASONING_MODELS["anthropic"], base_url=url)
        async with serving(spell(llm)) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            async with http.stream(
                "POST",
                f"/sessions/{sid}/prompt",
                json={"intent": "go"},
                headers={"accept": "text/event-stream"},
            ) as response:
                lines = [line async for line in response.aiter_lines()]
        await llm.aclose()
    events = sse_events(lines)
    thinking = "".join(data["text"] for name, data in events if name == "thinking_delta")
    assert thinking == "Echo it first.Now finish."
    assert events[-1][1]["result"] == "finished"
    shown = "\n".join(lines)
    assert not any(token in shown for token in opaque_tokens(fake))


async def test_loom_show_export_and_fork_keep_artefacts_opaque_and_intact(tmp_path: Path) -> None:
    fake = FakeThinkingAnthropic([*SCRIPT, *SCRIPT], redact=True)
    path = tmp_path / "loom.db"
    async with serve(fake, REASONING_PREFIXES["anthropic"]) as url:
        llm = load_llm("anthropic", model=REASONING_MODELS["anthropic"], base_url=url)
        loom = Loom.open(path)
        casting = spell(llm, loom)
        first = await casting.cast_async("go")
        # A fork from the first turn continues the tool loop: its thinking and the
        # redacted block must go back exactly, or the fake refuses.
        forked = await casting.fork_async(first.turns[0], "go on")
        await llm.aclose()
    assert forked.result == "finished"
    sent = fake.requests[-2].json()["messages"]
    replayed = [b for m in sent if m["role"] == "assistant" for b in m["content"]]
    assert [b["type"] for b in replayed][:2] == ["thinking", "redacted_thinking"]

    text = export_jsonl(loom)
    again = load_jsonl_text(tmp_path, text)
    assert [t.reasoning for t in again] == [t.reasoning for t in loom.turns]
    loom.close()

    done_show = await trio.run_process(
        [CANTRIP, "loom", str(path), "show", first.turns[0].id],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    shown = done_show.stdout.decode()
    assert done_show.returncode == 0, done_show.stderr.decode()
    assert "thinking:" in shown and "Echo it first." in shown
    assert "redacted or encrypted by the provider (not shown)" in shown
    assert not any(token in shown for token in opaque_tokens(fake))
    assert fake.signer.sign("Echo it first.") not in shown


def load_jsonl_text(folder: Path, text: str) -> list[cantrip.Turn]:
    path = folder / "export.jsonl"
    path.write_text(text)
    return [item.turn for item in load_jsonl(path)]
