"""Per-turn shortcuts that must answer exactly what the slow path answered.

Each turn asks whether its LLM can stream and what its model costs; both
answers are now remembered (per type, per environment) -- these tests pin
that the remembered answer is the one the full check gives, and that a
change which should change it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fake_providers import isolate

from cantrip.llm import (
    Message,
    Response,
    RetryingLLM,
    ScriptedLLM,
    clear_cache,
    load_llm,
    load_provider_config,
)
from cantrip.llm._contract import StreamingLLM, can_stream
from cantrip.llm._telemetry import Pricing, config_pricing


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


class QueryOnly:
    name = "q"

    async def query(self, messages: Sequence[Message], *args: Any, **kw: Any) -> Response:
        return Response(content="q")


class StreamNone(QueryOnly):
    stream = None


class Streams(QueryOnly):
    async def stream(self, messages: Sequence[Message], *args: Any, **kw: Any) -> Response:
        return Response(content="s")


def test_can_stream_answers_what_the_protocol_check_answers() -> None:
    given = QueryOnly()
    given.stream = Streams().stream  # type: ignore[attr-defined]  # on the instance only
    objects: list[Any] = [
        load_llm("openai", base_url="http://127.0.0.1:9/v1"),
        ScriptedLLM([]),
        RetryingLLM(ScriptedLLM([])),
        RetryingLLM(load_llm("openai", base_url="http://127.0.0.1:9/v1")),
        QueryOnly(),
        StreamNone(),
        Streams(),
        given,
        object(),
    ]
    for _ in range(2):  # the second round answers from what the first remembered
        for obj in objects:
            assert can_stream(obj) == isinstance(obj, StreamingLLM), obj
    assert not can_stream(QueryOnly())  # the instance-only member did not make the type stream
    assert can_stream(Streams())


def test_provider_configs_are_cached_per_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = load_provider_config("openai")
    assert load_provider_config("openai") is first
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "openai.toml").write_text('[provider]\nbase_url = "http://127.0.0.1:7/v1"\n')
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(folder))
    moved = load_provider_config("openai")  # another folder: read again
    assert moved.provider.base_url == "http://127.0.0.1:7/v1"
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(tmp_path / "user-providers"))
    assert load_provider_config("openai") is first  # back: the first folder's config
    clear_cache()
    assert load_provider_config("openai") is not first


def test_model_prices_follow_the_providers_folder_and_clear_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each turn's price is remembered (issue 34), but only while the provider's
    config is the one it was read from: a providers folder named by another
    variable value, or one edited and then ``clear_cache()``, prices afresh."""
    assert config_pricing("openai", "house-model") is None  # not in the shipped list
    folder = tmp_path / "priced"
    folder.mkdir()
    toml = folder / "openai.toml"
    toml.write_text("[models.house-model]\ncost_input_per_1m = 1.0\ncost_output_per_1m = 2.0\n")
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(folder))
    assert config_pricing("openai", "house-model") == Pricing(1.0, 2.0)
    toml.write_text("[models.house-model]\ncost_input_per_1m = 3.0\ncost_output_per_1m = 4.0\n")
    assert config_pricing("openai", "house-model") == Pricing(1.0, 2.0)  # cached until...
    clear_cache()
    assert config_pricing("openai", "house-model") == Pricing(3.0, 4.0)  # ...cleared
    monkeypatch.delenv("CANTRIP_PROVIDERS_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty"))  # no folder: shipped only
    assert config_pricing("openai", "house-model") is None
    (tmp_path / "xdg" / "cantrip" / "providers").mkdir(parents=True)
    (tmp_path / "xdg" / "cantrip" / "providers" / "openai.toml").write_text(
        "[models.house-model]\ncost_input_per_1m = 5.0\ncost_output_per_1m = 6.0\n"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_pricing("openai", "house-model") == Pricing(5.0, 6.0)
    assert config_pricing("nonesuch", "house-model") is None  # an unknown provider: no price


def test_a_finished_response_keeps_every_field_the_adapter_parsed() -> None:
    """The adapter's last step builds the response anew (not attrs.evolve, issue 34):
    every field of :class:`Response` survives it, so a field added later cannot be
    dropped there silently."""
    import attrs

    from cantrip.llm import ReasoningPart, ToolCall, Usage

    adapter = load_llm("openai", "gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    parsed = Response(
        content="text",
        tool_calls=(ToolCall(id="call_1", name="done", arguments={"answer": 1}),),
        usage=Usage(3, 4, 1, 0, 2),
        thinking="mulled",
        stop_reason="tool_use",
        model="gpt-4o-mini-2024",
        provider="ignored",
        metadata={"id": "chatcmpl-1"},
        reasoning=(ReasoningPart("openai-chat", 0, "{}"),),
    )
    unset = {f.name for f in attrs.fields(Response) if getattr(parsed, f.name) == f.default}
    assert not unset - {"provider"}, f"give every field a value here: {unset}"
    finished = adapter._finish(parsed, {})  # type: ignore[attr-defined]
    for field in attrs.fields(Response):
        if field.name not in ("provider", "metadata"):
            assert getattr(finished, field.name) == getattr(parsed, field.name), field.name
    assert finished.provider == "openai"
    assert dict(finished.metadata) == {"id": "chatcmpl-1", "requested_model": "gpt-4o-mini"}


async def test_cast_and_entity_usage_sum_their_turns() -> None:
    """Token totals are kept as counts and read as :class:`Usage` (issue 34): the sum
    of the recorded turns' usage, over casts for the entity, per cast for its result."""
    import cantrip
    from cantrip.llm import Usage
    from gates import done

    def answer(tokens: int) -> dict[str, Any]:
        return {
            "tool_calls": [{"id": f"c{tokens}", "gate": "done", "args": {"answer": "x"}}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": 2, "cached_tokens": 1},
        }

    llm = ScriptedLLM([answer(10), answer(20)])
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="count"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
    )
    entity = spell.summon()
    first = await entity.send("one")
    second = await entity.send("two")
    assert first.usage == Usage(10, 2, 1)
    assert second.usage == Usage(20, 2, 1)
    total = Usage()
    for turn in spell.loom.turns:
        total = total + turn.metadata.usage
    assert entity.usage == total == Usage(30, 4, 2)


@pytest.mark.parametrize(
    "message",
    [
        Message("user", ""),
        Message("user", None),
        Message("user", "héllo\nthere"),
        Message("assistant", None, tool_calls=()),
        Message("assistant", "", tool_calls=()),
    ],
)
def test_a_message_counts_its_text_without_building_it(message: Message) -> None:
    assert message.text_length() == len(message.text())


def test_text_length_matches_the_text_for_any_calls_and_content() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from cantrip.llm import ToolCall

    calls = st.lists(
        st.builds(
            ToolCall,
            id=st.text(max_size=5),
            name=st.text(max_size=8),
            arguments=st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=6)),
        ),
        max_size=3,
    )

    @given(content=st.none() | st.text(max_size=20), tool_calls=calls)
    def check(content: str | None, tool_calls: list[ToolCall]) -> None:
        message = Message("assistant", content, tool_calls=tuple(tool_calls))
        assert message.text_length() == len(message.text())

    check()


async def test_a_cast_looks_its_model_prices_up_once_and_the_next_cast_afresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every turn is priced (``cost_usd``), from prices a cast finds once (issue 34):
    three turns, one catalogue lookup, each turn charged at those prices; after the
    catalogue changed (and ``clear_cache()``), the next cast charges the new ones."""
    import cantrip
    from cantrip.llm import _cost
    from gates import done, echo

    folder = tmp_path / "priced"
    folder.mkdir()
    toml = folder / "openai.toml"
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(folder))
    lookups: list[tuple[str | None, str]] = []
    real = _cost.config_pricing

    def counted(provider: str | None, model: str) -> Pricing | None:
        lookups.append((provider, model))
        return real(provider, model)

    monkeypatch.setattr(_cost, "config_pricing", counted)

    from fake_providers import Answer, Call, running

    million = {"prompt_tokens": 10**6, "completion_tokens": 10**6}
    script = [
        Answer(calls=(Call("echo", {"text": "a"}),), **million),
        Answer(calls=(Call("echo", {"text": "b"}),), **million),
        Answer(calls=(Call("done", {"answer": "x"}),), **million),
    ]
    costs: list[list[float | None]] = []
    for prices in ((1.0, 2.0), (3.0, 4.0)):
        toml.write_text(
            f"[models.house]\ncost_input_per_1m = {prices[0]}\ncost_output_per_1m = {prices[1]}\n"
        )
        clear_cache()
        lookups.clear()
        async with running("openai", script, model="house") as (_, llm):
            spell = cantrip.Cantrip(
                llm=llm,
                identity=cantrip.Identity(system_prompt="price"),
                circle=cantrip.Circle([done, echo], [cantrip.max_turns(5)]),
            )
            result = await spell.cast_async("go")
        costs.append([t.metadata.cost_usd for t in spell.loom.turns])
        assert lookups == [("openai", "house")]  # once for the three turns
        assert result.cost_usd == pytest.approx(sum(c or 0.0 for c in costs[-1]))
    assert costs == [[3.0, 3.0, 3.0], [7.0, 7.0, 7.0]]


@pytest.mark.parametrize("model_in_reply", ["gpt-4o-mini-2024-07-18", None])
def test_a_parsed_openai_answer_is_final_as_the_adapter_would_make_it(
    model_in_reply: str | None,
) -> None:
    """The OpenAI-compatible parser names the adapter's provider and requested model
    itself, so the adapter's last step returns it as it is (issue 34) -- equal to
    what that step builds from a parse that did not."""
    from cantrip.llm._openai_chat import parse_chat_completion

    adapter: Any = load_llm("openai", "gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    payload: dict[str, Any] = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "done", "arguments": '{"answer": "ok"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    if model_in_reply is not None:
        payload["model"] = model_in_reply
    parsed = adapter.parse(payload, [])
    final = adapter._finish(parsed, {}, False)
    assert final is parsed  # nothing left to do
    built = adapter._finish(parse_chat_completion(payload, [], provider="x"), {}, True)
    assert final == built
    assert final.model == (model_in_reply or "gpt-4o-mini")
    assert final.metadata["requested_model"] == "gpt-4o-mini"


def test_a_context_view_is_rendered_from_where_its_list_was_left() -> None:
    """A context's transcript is an append-only list; the adapter's render memo finds
    it by that list and renders only what was appended (issue 34: comparing the
    whole prefix item by item cost O(history) every turn). Every render equals a
    fresh render of the same messages; an older, shorter view of the same list and
    a new list (a fold) render correctly too."""
    from cantrip._context import Transcript
    from cantrip.llm import ToolCall
    from cantrip.llm._transcript import render_transcript
    from cantrip.llm._transcript_incremental import IncrementalRenderer
    from cantrip.llm.providers._render_memo import RenderCache

    ingested: list[Message] = []
    real_extend = IncrementalRenderer.extend

    def counting(self: IncrementalRenderer, new: Any) -> Any:
        new = list(new)
        ingested.extend(new)
        return real_extend(self, new)

    read: list[int] = []

    class Counted(Transcript):
        """A transcript that counts the items read through it one by one."""

        def __iter__(self) -> Any:
            for message in super().__iter__():
                read.append(1)
                yield message

        def __getitem__(self, index: Any) -> Any:
            read.append(1)
            return super().__getitem__(index)

    IncrementalRenderer.extend = counting  # type: ignore[method-assign]
    try:
        cache = RenderCache("openai", False)
        items: list[Message] = [Message("system", "s"), Message("user", "go")]
        for turn in range(30):
            call = ToolCall(id=f"call_{turn}", name="echo", arguments={"text": str(turn)})
            items.append(Message("assistant", tool_calls=(call,)))
            items.append(Message("tool", str(turn), tool_call_id=call.id, name="echo"))
            rendered = cache.render(Counted(items, len(items)))
            assert tuple(rendered.messages) == render_transcript(items, "openai").messages
        assert len(ingested) == len(items)  # each message rendered once, not once a turn
        assert not read  # and the history was not walked to find where it had got to
        older = cache.render(Transcript(items, 10))  # a shorter view of the same list
        assert tuple(older.messages) == render_transcript(items[:10], "openai").messages
        again = cache.render(Transcript(items, len(items)))
        assert tuple(again.messages) == render_transcript(items, "openai").messages
        folded = [Message("system", "s"), Message("user", "summary"), *items[-2:]]
        fresh = cache.render(Transcript(folded, len(folded)))
        assert tuple(fresh.messages) == render_transcript(folded, "openai").messages
    finally:
        IncrementalRenderer.extend = real_extend  # type: ignore[method-assign]


def test_a_request_body_spliced_from_kept_bytes_is_the_one_dumps_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The OpenAI-compatible adapters write each message of a conversation's body once
    and splice the body from those bytes (issue 34): for growing conversations of
    generated messages -- non-ASCII text, lone surrogates (which orjson refuses), calls
    left unanswered in the open tail, an older view of the same history, streamed and
    not -- the bytes equal what ``dumps`` writes for the whole body."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cantrip._context import Transcript
    from cantrip.llm import ToolCall, ToolDefinition
    from cantrip.llm.providers import openai
    from cantrip.llm.providers._base import dumps

    monkeypatch.setattr(openai, "SPLICE_FROM", 0)  # short conversations spliced too
    texts = st.text(max_size=12) | st.sampled_from(["é ☃ 𝄞", "lone \ud800 surrogate", ""])
    tools = (ToolDefinition("echo", "Echo.", {"type": "object", "properties": {}}),)

    @settings(max_examples=60, deadline=None)
    @given(
        steps=st.lists(st.tuples(st.sampled_from(["user", "call", "answer"]), texts), max_size=12)
    )
    def check(steps: list[tuple[str, str]]) -> None:
        adapter: Any = load_llm("openai", "gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
        items: list[Message] = [Message("system", "sys"), Message("user", "go")]
        views: list[int] = []
        for number, (kind, text) in enumerate(steps):
            if kind == "user":
                items.append(Message("user", text))
            elif kind == "call":
                call = ToolCall(id=f"call_{number}", name="echo", arguments={"t": text})
                items.append(Message("assistant", text or None, tool_calls=(call,)))
            else:
                last = next((m for m in reversed(items) if m.tool_calls), None)
                if last is not None:
                    call_id = last.tool_calls[0].id
                    items.append(Message("tool", text, tool_call_id=call_id, name="echo"))
            views.append(len(items))
        for n in [*views, *views[: len(views) // 2]]:  # growing, then older views again
            rendered = adapter._renders.render(Transcript(items, n))
            for stream in (False, True):
                url, body = adapter.build_request(rendered.messages, tools, None, {}, stream)
                assert adapter.encode_request(rendered.messages, tools, None, {}, stream) == (
                    url,
                    dumps(body),
                )
        if views and not any("\ud800" in text for _, text in steps):  # none fell back
            assert any(memo.encoded for memo in adapter._wire_memo.values())

    check()
