"""The SSE decoder: tolerant of everything real streams contain."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cantrip.llm._sse import SSEDecoder, SSEEvent, iter_sse


def events(text: str) -> list[SSEEvent]:
    return list(iter_sse(text.splitlines()))


def test_data_lines_dispatch_on_a_blank_line() -> None:
    assert events("data: one\n\ndata: two\n\n") == [SSEEvent(data="one"), SSEEvent(data="two")]


def test_event_names_ids_and_retry() -> None:
    (event,) = events("event: message_start\nid: 42\nretry: 1500\ndata: {}\n\n")
    assert event == SSEEvent(event="message_start", data="{}", id="42", retry=1500)


def test_multi_line_data_joins_with_newlines() -> None:
    assert events("data: first\ndata: second\ndata:third\n\n") == [
        SSEEvent(data="first\nsecond\nthird")
    ]


def test_comments_keep_alives_and_garbage_are_ignored() -> None:
    text = (
        ": OPENROUTER PROCESSING\n\n"
        ":\n"
        "this line has no colon\n"
        "unknown: field\n"
        "retry: soon\n"
        "data: payload\n\n"
        "\n\n\n"
    )
    assert events(text) == [SSEEvent(data="payload")]


def test_an_event_without_data_is_not_dispatched() -> None:
    assert events("event: ping\n\nid: 3\n\n") == []


def test_crlf_bom_and_one_leading_space_only() -> None:
    decoder = SSEDecoder()
    assert decoder.decode("\ufeffdata:  two spaces") is None
    assert decoder.decode("") == SSEEvent(data=" two spaces")
    assert events("data: a\r\n\r\ndata: b\r\n\r\n") == [SSEEvent(data="a"), SSEEvent(data="b")]


def test_a_final_event_without_a_blank_line_is_delivered() -> None:
    assert events("data: one\n\ndata: [DONE]") == [SSEEvent(data="one"), SSEEvent(data="[DONE]")]


def test_the_event_name_does_not_leak_into_the_next_event() -> None:
    assert [e.event for e in events("event: error\ndata: x\n\ndata: y\n\n")] == ["error", "message"]


def test_an_event_with_empty_data_is_not_dispatched() -> None:
    stream = "data:\n\ndata: \n\nevent: ping\ndata:\n\ndata: x\n\ndata:\ndata:\n\n"
    # the ping's name goes with it; two empty lines are one newline of data (a payload)
    assert events(stream) == [SSEEvent(data="x"), SSEEvent(data="\n")]


TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\ufeff"),
    max_size=40,
)


@given(st.lists(TEXT))
def test_any_payload_round_trips(payloads: list[str]) -> None:
    text = "".join(
        "".join(f"data: {line}\n" for line in payload.split("\n")) + "\n" for payload in payloads
    )
    lines = text.split("\n")
    decoded = list(iter_sse(lines))
    # an empty payload is an empty data buffer: the standard does not dispatch it
    assert [e.data for e in decoded] == [p for p in payloads if p]


ENDS = st.sampled_from(["\n", "\r\n", "\r"])
LINE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=12
)


@given(st.lists(st.tuples(LINE, ENDS)), LINE, st.lists(st.integers(0, 200), max_size=8))
def test_lines_split_at_cr_lf_and_crlf_only_wherever_the_chunks_break(
    ended: list[tuple[str, str]], last: str, cuts: list[int]
) -> None:
    """The stream's bytes cut anywhere (inside a CRLF, inside a UTF-8 character)
    give the lines the event-stream rules give: U+2028, U+0085 and the like are data."""
    from cantrip.llm._sse import LineSplitter

    text = "".join(line + end for line, end in ended) + last
    data = text.encode()
    splitter = LineSplitter()
    got: list[str] = []
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        got += splitter.feed(data[start:cut])
        start = cut
    got += splitter.feed(data[start:])
    got += splitter.close()
    # the rules' split of the whole text (a CR then an LF is one CRLF)
    whole = re.split("\r\n|\r|\n", text)
    if not whole[-1]:
        whole.pop()
    assert got == whole
    if all(end == "\n" for _, end in ended):
        assert got == [line for line, _ in ended] + ([last] if last else [])


async def test_a_streamed_answer_keeps_a_line_separator_inside_its_text(
    monkeypatch: Any, tmp_path: Any
) -> None:
    """U+2028 sent raw inside a JSON string (as a server that does not escape it
    sends it) is part of the text, not the end of a line."""
    import json

    from fake_providers import Raw, isolate, running

    from cantrip.llm import Message

    isolate(monkeypatch, tmp_path)
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": []}
    say = {**chunk, "choices": [{"index": 0, "delta": {"content": "one\u2028two\u0085three"}}]}
    stop = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = (
        "".join(f"data: {json.dumps(c, ensure_ascii=False)}\r\n\r\n" for c in (say, stop))
        + "data: [DONE]\r\n\r\n"
    )
    reply = Raw(200, body.encode(), {"content-type": "text/event-stream; charset=utf-8"})
    async with running("openai", [reply]) as (_, llm):
        response = await llm.stream([Message("user", "hi")], on_event=lambda _: None)
    assert response.content == "one\u2028two\u0085three"


def test_a_streams_charset_is_the_one_httpx_would_decode_it_with() -> None:
    import httpx

    from cantrip.llm._sse import _encoding

    kinds = [
        None,
        "text/event-stream",
        "text/event-stream; charset=utf-8",
        "text/event-stream;charset=UTF-8",
        'text/event-stream; charset="utf-8"',
        "text/event-stream; charset=iso-8859-1",
        "text/event-stream; charset=nonsense",
    ]
    for default in ("utf-8", "latin-1"):
        for kind in kinds:
            headers = {"content-type": kind} if kind else {}
            response = httpx.Response(200, headers=headers, default_encoding=default)
            assert _encoding(response) == (response.encoding or "utf-8"), (default, kind)
