"""OpenTelemetry GenAI traces: live from the event stream, exported from a loom, and
shipped over real OTLP/HTTP to a receiver started by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from otlp_receiver import otlp_receiver

import cantrip
from cantrip.cli._loom import main as loom_main
from cantrip.tracing._sink import TraceSink, configured_tracer, with_tracing
from gates import call_agent, done, echo

PRICES = cantrip.Pricing(1.0, 2.0)


def traced(
    capture_content: bool = False,
) -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def sink_for(provider: TracerProvider, loom: cantrip.Loom, **options: Any) -> TraceSink:
    return TraceSink(provider.get_tracer("test"), loom, **options)


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def echo_then_done() -> cantrip.ScriptedLLM:
    return cantrip.ScriptedLLM(
        [
            {
                "tool_calls": [{"gate": "echo", "args": {"text": "hi"}, "id": "call-1"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 40},
            },
            {
                "tool_calls": [{"gate": "done", "args": {"answer": "ok"}}],
                "usage": {"prompt_tokens": 120, "completion_tokens": 5},
            },
        ],
        pricing=PRICES,
    )


def spell(llm: Any, *gates: cantrip.Gate, **kwargs: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo, *gates], [cantrip.max_turns(6), cantrip.max_depth(1)]),
        **kwargs,
    )


async def test_a_cast_is_an_invoke_agent_span_with_chat_and_tool_children() -> None:
    exporter, provider = traced()
    s = spell(echo_then_done())
    outcome = await s.cast_async("say hi", on_event=sink_for(provider, s.loom))
    spans = exporter.get_finished_spans()
    (agent,) = by_name(spans, "invoke_agent")
    chats = by_name(spans, "chat")
    tools = by_name(spans, "execute_tool")
    assert [t.name for t in tools] == ["execute_tool echo", "execute_tool done"]
    assert len(chats) == 2
    assert all(parent_of(s) == agent.context.span_id for s in (*chats, *tools))
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.id"] == outcome.entity_id
    assert agent.attributes["cantrip.reason"] == "done"
    assert agent.attributes["gen_ai.usage.input_tokens"] == 220
    assert agent.status.status_code is StatusCode.UNSET
    first = chats[0].attributes
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.usage.input_tokens"] == 100
    assert first["gen_ai.usage.output_tokens"] == 10
    assert first["gen_ai.usage.cache_read.input_tokens"] == 40
    assert tuple(first["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert tools[0].attributes["gen_ai.tool.call.id"] == "call-1"
    assert tools[0].attributes["gen_ai.tool.name"] == "echo"
    # content is off by default
    assert "gen_ai.output.messages" not in first
    assert "gen_ai.tool.call.arguments" not in tools[0].attributes


async def test_children_nest_under_the_parents_call_agent_span() -> None:
    exporter, provider = traced()
    child = cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "c"}}]}])
    parent = cantrip.ScriptedLLM(
        [
            {"tool_calls": [{"gate": "call_agent", "args": {"intent": "help"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "p"}}]},
        ]
    )
    s = spell(parent, call_agent, llms={"child_llm": child})
    await s.cast_async("delegate", on_event=sink_for(provider, s.loom))
    spans = exporter.get_finished_spans()
    agents = by_name(spans, "invoke_agent")
    assert len(agents) == 2
    root = next(a for a in agents if a.parent is None)
    kid = next(a for a in agents if a.parent is not None)
    (delegation,) = [s for s in spans if s.name == "execute_tool call_agent"]
    assert parent_of(delegation) == root.context.span_id
    assert parent_of(kid) == delegation.context.span_id
    assert kid.context.trace_id == root.context.trace_id
    kid_chats = [s for s in by_name(spans, "chat") if parent_of(s) == kid.context.span_id]
    assert len(kid_chats) == 1


async def test_a_cancelled_entity_ends_its_span_with_an_error(autojump_clock: Any) -> None:
    exporter, provider = traced()

    @cantrip.gate
    async def slow() -> str:
        """Takes a while."""
        await trio.sleep(60)
        return "late"

    s = spell(cantrip.ScriptedLLM([{"tool_calls": [{"gate": "slow", "args": {}}]}]), slow)
    entity = s.summon(on_event=sink_for(provider, s.loom))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(entity.send, "wait")
        await trio.sleep(1)
        assert entity.cancel()
    (agent,) = by_name(exporter.get_finished_spans(), "invoke_agent")
    assert agent.status.status_code is StatusCode.ERROR
    assert agent.attributes["cantrip.reason"] == "cancelled"


async def test_a_failed_llm_call_is_an_error_chat_span() -> None:
    exporter, provider = traced()
    s = spell(cantrip.ScriptedLLM([{"error": {"status": 400, "message": "bad request"}}]))
    with pytest.raises(cantrip.LLMError):
        await s.cast_async("fail", on_event=sink_for(provider, s.loom))
    spans = exporter.get_finished_spans()
    (chat,) = by_name(spans, "chat")
    (agent,) = by_name(spans, "invoke_agent")
    assert chat.status.status_code is StatusCode.ERROR
    assert agent.status.status_code is StatusCode.ERROR
    assert agent.attributes["cantrip.reason"] == "llm_error"


async def test_retries_are_span_events(autojump_clock: Any) -> None:
    exporter, provider = traced()
    llm = cantrip.ScriptedLLM(
        [
            {"error": {"status": 503, "message": "overloaded"}},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    )
    s = spell(llm)
    await s.cast_async("retry", on_event=sink_for(provider, s.loom))
    (chat,) = by_name(exporter.get_finished_spans(), "chat")
    assert chat.attributes["cantrip.attempts"] == 2
    assert [e.name for e in chat.events] == ["gen_ai.retry"]


async def test_content_is_captured_only_when_asked_and_always_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secretvalue1234567890")
    exporter, provider = traced()
    llm = cantrip.ScriptedLLM(
        [
            {
                "content": "key sk-secretvalue1234567890",
                "tool_calls": [{"gate": "echo", "args": {"text": "sk-secretvalue1234567890"}}],
            },
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    )
    s = spell(llm)
    await s.cast_async("leak?", on_event=sink_for(provider, s.loom, capture_content=True))
    spans = exporter.get_finished_spans()
    text = json.dumps([dict(span.attributes or {}) for span in spans], default=str)
    assert "gen_ai.output.messages" in text and "gen_ai.tool.call.arguments" in text
    assert "sk-secretvalue1234567890" not in text
    assert "[REDACTED]" in text


def test_without_a_tracer_provider_nothing_is_added() -> None:
    assert configured_tracer() is None  # this process never sets one
    sink = print
    assert with_tracing(sink, cantrip.Loom()) is sink
    assert with_tracing(None, cantrip.Loom()) is None


def test_a_configured_global_provider_traces_every_entity_automatically() -> None:
    program = textwrap.dedent(
        """
        import json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        import cantrip
        from gates import done

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        spell = cantrip.Cantrip(
            llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": 1}}]}]),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done], [cantrip.max_turns(2)]),
        )
        spell.cast("go")
        print(json.dumps(sorted(s.name for s in exporter.get_finished_spans())))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    names = json.loads(out.stdout)
    assert names[:2] == ["chat scripted", "execute_tool done"]
    assert len(names) == 3 and names[2].startswith("invoke_agent cantrip-")


def test_a_recorded_loom_exports_as_otlp_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "traced.db"
    child = cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "c"}}]}])
    parent = cantrip.ScriptedLLM(
        [
            {
                "tool_calls": [{"gate": "call_agent", "args": {"intent": "help"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2},
            },
            {"tool_calls": [{"gate": "done", "args": {"answer": "p"}}]},
        ]
    )
    s = spell(parent, call_agent, llms={"child_llm": child}, loom=cantrip.Loom.open(path))
    s.cast("delegate")
    s.loom.close()
    assert loom_main([str(path), "export", "--format", "otlp"]) == 0
    payload = json.loads(capsys.readouterr().out)
    spans = payload["resourceSpans"][0]["scopeSpans"][0]["spans"]
    by_id = {span["spanId"]: span for span in spans}
    agents = [span for span in spans if span["name"].startswith("invoke_agent")]
    assert len(agents) == 2
    root = next(a for a in agents if "parentSpanId" not in a)
    kid = next(a for a in agents if "parentSpanId" in a)
    delegation = by_id[kid["parentSpanId"]]
    assert delegation["name"] == "execute_tool call_agent"
    assert delegation["parentSpanId"] == root["spanId"]
    assert {span["traceId"] for span in spans} == {root["traceId"]}
    chats = [span for span in spans if span["name"].startswith("chat")]
    assert len(chats) == 3  # parent's two replies, child's one
    tokens = {
        a["key"]: a["value"] for a in chats[0]["attributes"] if a["key"].startswith("gen_ai.usage")
    }
    assert tokens["gen_ai.usage.input_tokens"] == {"intValue": "10"}
    for span in spans:
        assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0
    # the same loom exports to the same trace
    assert loom_main([str(path), "export", "--format", "otlp"]) == 0
    assert json.loads(capsys.readouterr().out) == payload


async def test_cast_otlp_posts_real_otlp_http_to_a_receiver(tmp_path: Path) -> None:
    """`cantrip cast --otlp URL` with the real exporter, into a loopback receiver."""
    spec = tmp_path / "traced.toml"
    spec.write_text(
        textwrap.dedent(
            """
            [llm]
            provider = "scripted"
            responses = [{tool_calls = [{gate = "done", args = {answer = "ok"}}]}]
            [circle]
            medium = "conversation"
            gates = ["done"]
            wards = [{max_turns = 2}]
            """
        )
    )
    async with otlp_receiver() as (url, received):
        result = await trio.run_process(
            [sys.executable, "-m", "cantrip", "cast", "-q", "--otlp", url, str(spec), "go"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
    assert result.returncode == 0, result.stderr.decode()
    names = sorted(span.name for span in received.spans())  # type: ignore[attr-defined]
    assert names[0].startswith("chat") and names[1] == "execute_tool done"
    assert names[2].startswith("invoke_agent")


def test_otlp_without_a_url_scheme_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cantrip.cli._main import main

    assert main(["cast", "--otlp", "localhost:4318", str(tmp_path / "x.toml"), "go"]) == 1
    assert "--otlp wants an http(s) URL" in capsys.readouterr().err


# -- issue 39.24: spans pay for redaction once per value ---------------------------------


def echoes(turns: int) -> cantrip.ScriptedLLM:
    """``turns - 1`` echo calls, then done: every turn but the last has one tool span."""
    echo_call = {"tool_calls": [{"gate": "echo", "args": {"text": "the quick brown fox"}}]}
    finish = {"tool_calls": [{"gate": "done", "args": {"answer": "finished"}}]}
    return cantrip.ScriptedLLM([echo_call] * (turns - 1) + [finish])


async def test_spans_redact_a_value_that_repeats_once_not_every_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Span names and most attribute values repeat every turn (``chat``, the model, the
    provider, the gate's name, its status); each distinct one is redacted once. Only what
    is new in a turn -- here its tool call's id -- is redacted again."""
    import cantrip._redact as redactor

    scanned: list[str] = []
    full_redaction = redactor._redact_with

    def counted(text: str, secrets: list[str]) -> str:
        scanned.append(text)
        return full_redaction(text, secrets)

    monkeypatch.setattr(redactor, "_redact_with", counted)

    async def redactions(turns: int) -> int:
        _, provider = traced()
        s = cantrip.Cantrip(
            llm=echoes(turns),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done, echo], [cantrip.max_turns(turns + 1)]),
        )
        scanned.clear()
        result = await s.cast_async("go", on_event=sink_for(provider, s.loom))
        assert len(result.turns) == turns
        return len(scanned)

    await redactions(4)  # the values every cast has, seen once
    short, long = await redactions(4), await redactions(24)
    per_turn = (long - short) / 20
    assert per_turn <= 1, f"{per_turn} redactions per turn: repeated values are redacted again"


def test_a_value_remembered_as_clean_is_redacted_once_the_environment_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever reaches a span, through an event or not, passes the redactor: a value
    first seen clean (and remembered so) is redacted as soon as a variable holds it as a
    secret -- set afresh, or an existing variable's value replaced in place."""
    from opentelemetry.trace import Status

    from cantrip.tracing._redacted import RedactedSpan

    exporter, provider = traced()
    tracer = provider.get_tracer("test")
    value = "model-4711-not-yet-a-secret"

    def send_everywhere() -> ReadableSpan:
        span = RedactedSpan(tracer.start_span("start"))
        span.update_name(f"chat {value}")
        span.set_attribute("gen_ai.request.model", value)
        span.set_attributes({"gen_ai.response.model": value, "list": [value, "ok"]})
        span.add_event(value, {"cantrip.attempt": value})
        span.set_status(Status(StatusCode.ERROR, f"failed: {value}"))
        span.record_exception(RuntimeError(value))
        span.end()
        return exporter.get_finished_spans()[-1]

    def carried(span: ReadableSpan) -> str:
        return json.dumps(
            [
                span.name,
                dict(span.attributes or {}),
                [[e.name, dict(e.attributes or {})] for e in span.events],
                span.status.description,
            ]
        )

    monkeypatch.delenv("CANTRIP_TEST_SECRET", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unrelated-1234567890")
    assert value in carried(send_everywhere())  # clean: remembered as clean
    monkeypatch.setenv("CANTRIP_TEST_SECRET", value)  # a new variable names it a secret
    leaked = carried(send_everywhere())
    assert value not in leaked and leaked.count("[REDACTED]") >= 8, leaked
    monkeypatch.delenv("CANTRIP_TEST_SECRET")
    assert value in carried(send_everywhere())
    monkeypatch.setenv("OPENAI_API_KEY", value)  # an existing variable's value replaced
    leaked = carried(send_everywhere())
    assert value not in leaked and leaked.count("[REDACTED]") >= 8, leaked
    shape = "sk-proj-ABCDEFGHIJKLMNOP"  # a credential's shape: redacted, no variable needed
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unrelated-1234567890")
    value = shape
    assert shape not in carried(send_everywhere())


class _Text(str):
    """A subclass of ``str`` (an enum's value, say): redacted like any text."""


_ATTRIBUTE_TEXTS = st.sampled_from(
    ["chat", "", "ok", "sk-abcdefghijklmnop", "key sk-proj-ABCDEFGH12345", "call_12"]
) | st.text(max_size=30)
_ATTRIBUTE_ITEMS = _ATTRIBUTE_TEXTS | st.integers() | st.floats(allow_nan=False) | st.booleans()
_ATTRIBUTE_VALUES = (
    _ATTRIBUTE_ITEMS
    | _ATTRIBUTE_TEXTS.map(_Text)
    | st.lists(_ATTRIBUTE_ITEMS, max_size=4)
    | st.lists(_ATTRIBUTE_ITEMS, max_size=4).map(tuple)
    | st.none()
    | st.binary(max_size=4)
)


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), _ATTRIBUTE_VALUES))
@settings(max_examples=500, deadline=None)
def test_span_attributes_are_what_the_redactor_makes_of_each_value(
    attributes: dict[str, Any],
) -> None:
    """Differential: ``clean_attributes`` sorts values by exact type for speed; whatever
    the type (text, a subclass of it, numbers, lists and tuples of them, anything else),
    every string comes out as ``redact`` makes it, sequences as lists, the rest as is."""
    from cantrip._redact import redact
    from cantrip.tracing._redacted import clean_attributes

    def expected(value: Any) -> Any:
        if isinstance(value, str):
            return redact(value)
        if isinstance(value, list | tuple):
            return [expected(item) if isinstance(item, str) else item for item in value]
        return value

    cleaned = clean_attributes(attributes)
    assert cleaned == {key: expected(value) for key, value in attributes.items()}
