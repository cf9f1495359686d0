"""Tool-interaction integrity (seed 001) through the real loop, against the fake providers.

Each scenario runs entities -- summoned, fallen back, forked -- whose canonical
history holds completions the renderer must carry correctly (``skipped`` after
``done``, ids of another provider family, ``cancelled`` delegations), and checks
what actually went over the wire. The fakes refuse an invalid transcript with the
provider's 400; on top of that every request body is decoded back into canonical
messages and checked with :func:`validate_transcript`, and the ids are compared
call by call with their results.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio
from fake_providers import (
    Answer,
    Call,
    FakeProvider,
    Fault,
    isolate,
    running,
)

import cantrip
from cantrip._errors import LoomError, ProviderError
from cantrip.llm import FallbackLLM, Message, RetryPolicy, ToolCall
from cantrip.llm._config import load_provider_config
from cantrip.llm._contract import Response, ToolChoice, ToolDefinition
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_ids import project_id
from cantrip.llm._transcript_model import ProviderFormat
from cantrip.llm.providers.anthropic import AnthropicAdapter
from gates import call_agent, done, echo
from mediums.conversation import SKIPPED_AFTER_DONE

TOOLU = re.compile(r"toolu_[0-9a-f]{24}")
HASHED_CALL = re.compile(r"call_[0-9a-f]{24}")
CANCELLED = "cancelled: the call did not complete"
SYNTHETIC = "[cancelled:"
"""How the renderer's own synthetic completions begin (CompletionPolicy)."""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)
    monkeypatch.delenv("CANTRIP_DEBUG_TRANSCRIPT", raising=False)


# -- decoding what was sent ------------------------------------------------------------------


def decode_openai(body: Mapping[str, Any]) -> list[Message]:
    """A Chat Completions request body as canonical messages."""
    out: list[Message] = []
    for m in body["messages"]:
        role = m["role"]
        if role in ("system", "developer"):
            out.append(Message("system", m["content"]))
        elif role == "user":
            out.append(Message("user", m["content"]))
        elif role == "tool":
            out.append(
                Message("tool", m["content"], tool_call_id=m["tool_call_id"], name=m.get("name"))
            )
        else:
            calls = tuple(
                ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in m.get("tool_calls") or ()
            )
            out.append(Message("assistant", m["content"], tool_calls=calls))
    return out


def decode_anthropic(body: Mapping[str, Any]) -> list[Message]:
    """A Messages request body as canonical messages (a user turn's tool results first)."""
    out: list[Message] = []
    if body.get("system"):
        out.append(Message("system", body["system"]))
    for m in body["messages"]:
        blocks = m["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        if m["role"] == "user":
            for b in blocks:
                if b["type"] == "tool_result":
                    out.append(
                        Message(
                            "tool",
                            b["content"],
                            tool_call_id=b["tool_use_id"],
                            is_error=bool(b.get("is_error")),
                        )
                    )
            if texts:
                out.append(Message("user", "\n\n".join(texts)))
        else:
            calls = tuple(
                ToolCall(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"
            )
            out.append(Message("assistant", "\n\n".join(texts) or None, tool_calls=calls))
    return out


DECODERS = {"openai": decode_openai, "anthropic": decode_anthropic}


def sent(fake: FakeProvider, index: int, provider: ProviderFormat) -> list[Message]:
    """Request ``index`` of ``fake`` decoded, after checking it is valid for ``provider``."""
    messages = DECODERS[provider](fake.requests[index].json())
    assert validate_transcript(messages, provider) == []
    return messages


def pairing(messages: Sequence[Message]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """For each assistant message with calls: (call ids, ids of the tool block right after)."""
    out = []
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            block = []
            for follower in messages[i + 1 :]:
                if follower.role != "tool":
                    break
                block.append(follower.tool_call_id or "")
            out.append((tuple(c.id for c in m.tool_calls), tuple(block)))
    return out


def assert_answered_once(messages: Sequence[Message]) -> None:
    """Every call id answered exactly once, by the tool block right after its call, in order."""
    calls = [c.id for m in messages for c in m.tool_calls]
    results = [m.tool_call_id for m in messages if m.role == "tool"]
    assert len(set(calls)) == len(calls), calls
    assert Counter(results) == Counter(calls)
    for call_ids, answered in pairing(messages):
        assert answered == call_ids


def results_by_id(messages: Sequence[Message]) -> dict[str, Message]:
    return {m.tool_call_id or "": m for m in messages if m.role == "tool"}


def finish(answer: str) -> Answer:
    return Answer(calls=(Call("done", {"answer": answer}),))


def spell_for(llm: Any, *gates: Any, **options: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="You are a test entity."),
        circle=cantrip.Circle([done, echo, *gates], [cantrip.max_turns(6)]),
        **options,
    )


# -- 1. skipped completions after done, on the entity's next cast ----------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_skipped_calls_after_done_are_answered_once_on_the_next_cast(
    provider: ProviderFormat,
) -> None:
    """``done`` first, two echoes after it in the same utterance: the echoes are recorded as
    ``skipped``; the next cast's request carries each of the three calls answered exactly once,
    right after the assistant message, with the recorded completions (not synthetic ones)."""
    first = Answer(
        text="Finishing at once.",
        calls=(
            Call("done", {"answer": "first"}),
            Call("echo", {"text": "a"}),
            Call("echo", {"text": "b"}),
        ),
    )
    async with (
        running(provider, [first, finish("second")]) as (fake, llm),
        spell_for(llm).summon() as entity,
    ):
        one = await entity.send("first intent")
        two = await entity.send("second intent")
    assert (one.result, two.result) == ("first", "second")
    recorded = one.turns[0]
    assert [r.status for r in recorded.gate_calls] == ["ok", "skipped", "skipped"]
    ids = tuple(c.id for c in recorded.tool_calls)
    assert [r.tool_call_id for r in recorded.gate_calls] == list(ids)
    # The fake accepted both requests (it answers an invalid transcript with a 400).
    assert len(fake.requests) == fake.served == 2
    messages = sent(fake, 1, provider)
    assert_answered_once(messages)
    assert pairing(messages) == [(ids, ids)]  # native ids go out unchanged
    results = results_by_id(messages)
    assert results[ids[0]].content == "first"
    for skipped in ids[1:]:
        assert results[skipped].content == SKIPPED_AFTER_DONE
        assert not results[skipped].is_error
    # The second intent comes after the completions, as the user's next message.
    assert messages[-1] == Message("user", "second intent")
    body = fake.requests[1].json()
    if provider == "anthropic":
        # One user turn: the three tool_result blocks first, then the new intent.
        turn = body["messages"][2]
        assert turn["role"] == "user"
        assert [b["type"] for b in turn["content"]] == ["tool_result"] * 3 + ["text"]
        assert [b["tool_use_id"] for b in turn["content"][:3]] == list(ids)
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    else:
        roles = [m["role"] for m in body["messages"]]
        # gpt-5-mini (the default) takes system text in the developer role.
        assert roles == ["developer", "user", "assistant", "tool", "tool", "tool", "user"]


# -- 2. fallback from one provider family to another mid-entity --------------------------------


async def test_fallback_to_another_family_projects_ids_and_keeps_the_loom_canonical() -> None:
    """Turn 1 is answered by OpenAI (``call_…`` ids); from turn 2 OpenAI fails for good (500,
    its one retry spent too) and Anthropic answers. The Anthropic requests carry the OpenAI calls
    under deterministic, distinct ``toolu_…`` ids paired with their results; the OpenAI requests
    that failed were still valid (the fake validated them before failing them); the loom keeps
    every provider's own ids."""
    openai_script: list[Any] = [
        Answer(
            text="Two echoes.",
            calls=(Call("echo", {"text": "one"}), Call("echo", {"text": "two"})),
        ),
        *[Fault(500, "primary is down")] * 4,
    ]
    anthropic_script = [
        Answer(text="One more.", calls=(Call("echo", {"text": "three"}),)),
        finish("all echoed"),
    ]
    member_retry = RetryPolicy(max_retries=1, base_delay=0.001, max_delay=0.001, jitter=0.0)
    async with (
        running("openai", openai_script) as (openai_fake, openai_llm),
        running("anthropic", anthropic_script) as (anthropic_fake, anthropic_llm),
    ):
        chain = FallbackLLM([openai_llm, anthropic_llm], retry=member_retry)
        spell = spell_for(chain, retry=cantrip.RetryPolicy(max_retries=0))
        async with spell.summon() as entity:
            outcome = await entity.send("echo one, two and three")
    assert outcome.result == "all echoed"
    turns = outcome.turns
    assert [t.metadata.provider for t in turns] == ["openai", "anthropic", "anthropic"]
    # The loom keeps canonical ids: each provider's own, never a projection.
    assert [c.id for c in turns[0].tool_calls] == ["call_1_0", "call_1_1"]
    assert [r.tool_call_id for r in turns[0].gate_calls] == ["call_1_0", "call_1_1"]
    assert [c.id for c in turns[1].tool_calls] == ["toolu_0100"]
    assert [r.tool_call_id for r in turns[1].gate_calls] == ["toolu_0100"]
    assert [r.result for t in turns[:2] for r in t.gate_calls] == ["one", "two", "three"]

    # OpenAI: turn 1 answered, then two attempts for each of turns 2 and 3, all 500s --
    # never a 400: every request passed the fake's validation before the fault.
    assert len(openai_fake.requests) == openai_fake.served == 5
    assert len(anthropic_fake.requests) == anthropic_fake.served == 2

    projected = {
        cid: project_id(cid, "anthropic", index=i, name="echo", taken=set())
        for i, cid in enumerate(["call_1_0", "call_1_1"])
    }
    assert all(TOOLU.fullmatch(p) for p in projected.values())
    assert len(set(projected.values())) == 2
    turn2 = sent(anthropic_fake, 0, "anthropic")
    assert_answered_once(turn2)
    wire_ids = (projected["call_1_0"], projected["call_1_1"])
    assert pairing(turn2) == [(wire_ids, wire_ids)]
    assert [results_by_id(turn2)[p].content for p in wire_ids] == ["one", "two"]
    leaked = [i for m in turn2 for i in (m.tool_call_id, *(c.id for c in m.tool_calls))]
    assert not any(i and i.startswith("call_") for i in leaked)  # no OpenAI id reaches Anthropic

    turn3 = sent(anthropic_fake, 1, "anthropic")
    assert_answered_once(turn3)
    # The same projection on the next turn; Anthropic's own id goes out as it came.
    assert pairing(turn3) == [(wire_ids, wire_ids), (("toolu_0100",), ("toolu_0100",))]
    assert results_by_id(turn3)["toolu_0100"].content == "three"

    # The OpenAI request of turn 3 (which then failed with a 500) carried Anthropic's id
    # projected into OpenAI's format, paired with its result.
    openai_turn3 = sent(openai_fake, 3, "openai")
    assert_answered_once(openai_turn3)
    back = project_id("toolu_0100", "openai", index=2, name="echo", taken=set())
    assert HASHED_CALL.fullmatch(back)
    assert pairing(openai_turn3) == [
        (("call_1_0", "call_1_1"), ("call_1_0", "call_1_1")),
        ((back,), (back,)),
    ]
    assert openai_fake.requests[3].body == openai_fake.requests[4].body  # the retry: same body


# -- 3. a fork after a cancelled delegation -------------------------------------------------


class HangingLLM:
    """A child's LLM that never answers; says when it started waiting."""

    name = "hanging"

    def __init__(self) -> None:
        self.waiting = trio.Event()

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.waiting.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


PARENT_CALLS: list[dict[str, Any]] = [
    {"gate": "echo", "args": {"text": "before"}, "id": "hist_tool_1"},
    {"gate": "call_agent", "args": {"intent": "a slow sub-task"}, "id": "hist_tool_2"},
    {"gate": "echo", "args": {"text": "after"}, "id": "hist_tool_3"},
]


async def cancelled_delegation() -> tuple[cantrip.Cantrip, cantrip.Entity]:
    """A parent whose utterance is PARENT_CALLS, cancelled while its child hangs."""
    child = HangingLLM()
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"tool_calls": PARENT_CALLS}]),
        identity=cantrip.Identity(system_prompt="You are a parent entity."),
        circle=cantrip.Circle([done, echo, call_agent], [cantrip.max_turns(5)]),
        llms={"child_llm": child},
    )
    entity = spell.summon()
    # Cancelled from outside once the child is stuck in its LLM call. (An event rather than
    # move_on_after + autojump_clock: these tests also talk to a loopback server, and a clock
    # that jumps whenever every task waits on a socket would time those requests out.)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_the_child_waits() -> None:
                await child.waiting.wait()
                scope.cancel()

            nursery.start_soon(cancel_once_the_child_waits)
            await entity.send("delegate the slow part")
    assert scope.cancelled_caught
    await entity.aclose()
    return spell, entity


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_a_fork_after_a_cancelled_delegation_sends_one_completion_per_call(
    provider: str,
) -> None:
    """A parent delegates (between two echoes) to a child that hangs; the cast is cancelled
    from outside. Forking at the delegation checkpoint is refused by design (it is the middle
    of an utterance); the fork at the continuation that recorded the cancellation sends the
    provider every call answered once: the echo's real result, and the recorded ``cancelled``
    completions of the delegation and of the echo that never ran -- no synthetic ones."""
    spell, entity = await cancelled_delegation()
    checkpoint, continuation = spell.loom.entity_turns(entity.id)
    assert checkpoint.extras["phase"] == "checkpoint"
    assert [r.tool_call_id for r in checkpoint.gate_calls] == ["hist_tool_1"]
    assert continuation.extras["phase"] == "continuation"
    assert continuation.reason == "cancelled" and continuation.parent_id == checkpoint.id
    assert [(r.tool_call_id, r.status, r.result) for r in continuation.gate_calls] == [
        ("hist_tool_2", "cancelled", CANCELLED),
        ("hist_tool_3", "cancelled", CANCELLED),
    ]
    (child_id,) = [e for e in spell.loom.entities if e != entity.id]
    child_last = spell.loom.last_turn(child_id)
    assert child_last is not None and child_last.reason == "parent_terminated"

    with pytest.raises(LoomError, match="delegation checkpoint"):
        spell.fork(checkpoint, llm=spell.llm)

    async with (
        running(provider, [finish("resumed")]) as (fake, llm),
        spell.fork(continuation, llm=llm) as forked,
    ):
        outcome = await forked.send("continue")
    assert outcome.result == "resumed"
    assert len(fake.requests) == fake.served == 1
    body = fake.requests[0].json()
    if provider == "gemini":
        contents = body["contents"]
        model = [c for c in contents if c["role"] == "model"]
        assert len(model) == 1
        calls = [p["functionCall"]["name"] for p in model[0]["parts"] if "functionCall" in p]
        assert calls == ["echo", "call_agent", "echo"]
        after = contents[contents.index(model[0]) + 1]
        responses = [p["functionResponse"] for p in after["parts"] if "functionResponse" in p]
        assert [(r["name"], r["response"]) for r in responses] == [
            ("echo", {"result": "before"}),
            ("call_agent", {"error": CANCELLED}),
            ("echo", {"error": CANCELLED}),
        ]
        assert after["parts"][-1] == {"text": "continue"}
        return
    fmt: ProviderFormat = "anthropic" if provider == "anthropic" else "openai"
    messages = sent(fake, 0, fmt)
    assert_answered_once(messages)
    taken: set[str] = set()
    wire = tuple(
        project_id(call["id"], fmt, index=i, name=call["gate"], taken=taken)
        for i, call in enumerate(PARENT_CALLS)
    )
    pattern = TOOLU if provider == "anthropic" else HASHED_CALL
    assert all(pattern.fullmatch(w) for w in wire) and len(set(wire)) == 3
    assert pairing(messages) == [(wire, wire)]
    results = results_by_id(messages)
    assert results[wire[0]].content == "before" and not results[wire[0]].is_error
    for w in wire[1:]:
        assert results[w].content == CANCELLED
        assert not (results[w].content or "").startswith(SYNTHETIC)
        if provider == "anthropic":
            assert results[w].is_error
    assert messages[-1] == Message("user", "continue")
    # The loom still holds the canonical ids; the fork's thread shares that prefix.
    lineage = spell.loom.lineage(outcome.turns[-1].id)
    assert lineage[:2] == [checkpoint, continuation]
    assert [c.id for c in lineage[0].tool_calls] == [c["id"] for c in PARENT_CALLS]


# -- 4. diagnostics on a refused request, and on every request in debug mode ---------------


def transcript_records(caplog: pytest.LogCaptureFixture, level: int) -> list[dict[str, Any]]:
    return [
        r.transcript  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "cantrip.llm.transcript" and r.levelno == level
    ]


async def test_a_refused_request_logs_the_render_diagnostics_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the loop: OpenAI's ids go to Anthropic, which answers the next request 400.
    The warning carries the diagnostics of that request: canonical and projected call ids,
    result ids, the format, the status -- enough to tell a projection fault from a pairing one."""
    first = [Answer(calls=(Call("echo", {"text": "x"}),)), finish("echoed")]
    async with (
        running("openai", first) as (_, openai_llm),
        running("anthropic", [Fault(400, "refused for the test")]) as (fake, anthropic_llm),
    ):
        spell = spell_for(openai_llm)
        with caplog.at_level(logging.WARNING, logger="cantrip.llm.transcript"):
            async with spell.summon() as entity:
                assert (await entity.send("echo x")).result == "echoed"
            assert transcript_records(caplog, logging.WARNING) == []  # nothing was refused
            # The same entity continues on Anthropic, from its loom thread.
            async with spell.resume(entity.id, llm=anthropic_llm) as resumed:
                with pytest.raises(ProviderError) as refused:
                    await resumed.send("and again")
    assert refused.value.status == 400
    assert len(fake.requests) == 1
    (report,) = transcript_records(caplog, logging.WARNING)
    taken: set[str] = set()
    projected = [
        project_id("call_1_0", "anthropic", index=0, name="echo", taken=taken),
        project_id("call_2_0", "anthropic", index=1, name="done", taken=taken),
    ]
    assert report["provider_format"] == "anthropic"
    assert report["adapter"] == anthropic_llm.name
    assert report["canonical_call_ids"] == ["call_1_0", "call_2_0"]
    assert report["emitted_call_ids"] == report["emitted_result_ids"] == projected
    assert report["synthetic_completions"] == [] and report["dropped_orphan_results"] == []
    assert report["render_problems"] == []  # the renderer's output was valid
    assert report["status"] == 400 and report["code"]
    # What the diagnostics say is what was sent.
    wire = fake.requests[0].json()["messages"]
    sent_ids = [b["id"] for m in wire for b in m["content"] if b["type"] == "tool_use"]
    assert sent_ids == projected
    message = caplog.records[-1].getMessage()
    assert "refused for the test" in message and projected[0] in message


CORRUPT = [
    Message("system", "sys"),
    Message("user", "go"),
    Message(
        "assistant",
        "two echoes",
        tool_calls=(
            ToolCall("hist_tool_1", "echo", {"text": "1"}),
            ToolCall("hist_tool_2", "echo"),
        ),
    ),
    Message("tool", "two", tool_call_id="hist_tool_2", name="echo"),
    Message("tool", "boo", tool_call_id="ghost", name="echo"),
    Message("user", "next"),
]
"""A canonical history needing repair: a call without a result and an orphan result."""


async def test_refusal_diagnostics_report_the_repairs_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 400 on a transcript the renderer had to repair: the warning names the synthetic
    completion and the dropped orphan (canonical-state corruption), and says the rendered
    transcript itself was valid."""
    async with running("anthropic", [Fault(400, "nope")]) as (fake, llm):
        with (
            caplog.at_level(logging.WARNING, logger="cantrip.llm.transcript"),
            pytest.raises(ProviderError),
        ):
            await llm.query(CORRUPT, [echo.definition()])
    assert fake.served == 1  # the fake found the request valid before failing it
    (report,) = transcript_records(caplog, logging.WARNING)
    assert report["canonical_call_ids"] == ["hist_tool_1", "hist_tool_2"]
    assert all(TOOLU.fullmatch(i) for i in report["emitted_call_ids"])
    assert report["emitted_result_ids"] == report["emitted_call_ids"]
    (synthetic,) = report["synthetic_completions"]
    assert (synthetic["call_id"], synthetic["reason"]) == ("hist_tool_1", "missing")
    assert synthetic["projected_id"] == report["emitted_call_ids"][0]
    assert [o["tool_call_id"] for o in report["dropped_orphan_results"]] == ["ghost"]
    assert report["render_problems"] == []
    json.dumps(report)  # structured and serializable as it stands


@pytest.mark.parametrize(
    ("reply", "key"),
    [
        (Fault(500, "server trouble"), "test-key"),  # retryable: not the transcript
        (Fault(429, "slow down"), "test-key"),
        (Answer(text="unused"), "another-key"),  # 401: credentials, not the transcript
    ],
)
async def test_errors_a_transcript_cannot_cause_log_no_diagnostics(
    caplog: pytest.LogCaptureFixture, reply: Any, key: str
) -> None:
    async with running("openai", [reply], key=key) as (fake, llm):
        with (
            caplog.at_level(logging.DEBUG, logger="cantrip.llm.transcript"),
            pytest.raises(ProviderError),
        ):
            await llm.query(CORRUPT, [echo.definition()])
    assert len(fake.requests) == 1
    assert [r for r in caplog.records if r.name == "cantrip.llm.transcript"] == []


async def test_debug_mode_logs_every_request_at_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CANTRIP_DEBUG_TRANSCRIPT=1`` (read when the adapter is made) or ``debug=True``: one
    DEBUG record per request with that request's diagnostics; off by default."""
    script = [Answer(calls=(Call("echo", {"text": "x"}),)), finish("ok")]
    with caplog.at_level(logging.DEBUG, logger="cantrip.llm.transcript"):
        async with running("openai", list(script)) as (_, quiet):
            assert quiet.debug_transcript is False
            await spell_for(quiet).cast_async("echo x")
        assert transcript_records(caplog, logging.DEBUG) == []

        monkeypatch.setenv("CANTRIP_DEBUG_TRANSCRIPT", "1")
        async with running("openai", list(script)) as (_, loud):
            await spell_for(loud).cast_async("echo x")
        first, second = transcript_records(caplog, logging.DEBUG)
        assert first["canonical_call_ids"] == [] and first["adapter"] == loud.name
        assert second["canonical_call_ids"] == ["call_1_0"]
        assert second["emitted_result_ids"] == ["call_1_0"]
        assert second["render_problems"] == [] and "status" not in second
        caplog.clear()

        monkeypatch.delenv("CANTRIP_DEBUG_TRANSCRIPT")
        config = load_provider_config("anthropic")
        async with running("anthropic", [Fault(400, "nope")]) as (_, made_by_load_llm):
            assert made_by_load_llm.debug_transcript is False
            explicit = AnthropicAdapter(
                config,
                made_by_load_llm.model,
                api_key="test-key",
                base_url=made_by_load_llm.base_url,
                debug=True,
            )
            with pytest.raises(ProviderError):
                await explicit.query(CORRUPT, [echo.definition()])
            await explicit.aclose()
        (sent_report,) = transcript_records(caplog, logging.DEBUG)
        (refused,) = transcript_records(caplog, logging.WARNING)
        assert sent_report["synthetic_completions"] == refused["synthetic_completions"]
        assert refused["status"] == 400


async def test_resume_after_a_crash_mid_delegation_keeps_the_recorded_results() -> None:
    """A persisted loom after the process died while the child ran holds the parent's
    checkpoint (the utterance and the echo that completed before the child started) and
    nothing after it. The restarted entity's request is valid -- the renderer completes the
    delegation and the last echo synthetically -- but it must still carry the echo's recorded
    result, not a synthetic ``[cancelled: ...]`` in its place."""
    spell, entity = await cancelled_delegation()
    checkpoint = spell.loom.entity_turns(entity.id)[0]
    survived = cantrip.Loom()  # what the store held when the process died
    survived.register_entity(spell.loom.entity(entity.id))
    survived.append(checkpoint)
    restarted = spell.with_(loom=survived)
    async with (
        running("anthropic", [finish("resumed")]) as (fake, llm),
        restarted.resume(entity.id, llm=llm) as resumed,
    ):
        outcome = await resumed.send("continue")
    assert outcome.result == "resumed" and fake.served == 1
    messages = sent(fake, 0, "anthropic")
    assert_answered_once(messages)
    (calls,) = [m.tool_calls for m in messages if m.tool_calls]
    results = results_by_id(messages)
    for call in calls[1:]:
        assert (results[call.id].content or "").startswith(SYNTHETIC)  # never recorded
    assert results[calls[0].id].content == "before"  # recorded in the checkpoint
