"""Server-sent events: the framing every streaming provider uses.

A tolerant decoder after the WHATWG event-stream rules: ``field: value``
lines, a blank line dispatches, ``:`` starts a comment (keep-alives such as
OpenRouter's ``: OPENROUTER PROCESSING``), several ``data`` lines join with
newlines, unknown fields and lines that are not fields at all are ignored, and
so is an event whose data is empty (``data:`` alone, ``event: ping`` + ``data:``):
the standard never dispatches it.
A final event not followed by a blank line is still delivered (several
servers end with ``data: [DONE]`` and close).

Reading from a response, a connection that drops or stalls mid-stream
becomes a retryable :class:`~cantrip.ProviderError` (``stream_interrupted``
or ``timeout``), never a bare transport exception.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from typing import Protocol

import attrs

from cantrip._errors import ProviderError

MAX_EVENT = 64 * 1024 * 1024
"""What an event-stream line, or an event's data, may take: its characters (each at
least a byte on the wire), plus :data:`PIECE` for each piece it is held in (a line
that came in many chunks, an event of many ``data`` lines), so the bound is on the
memory held, however small the pieces. A provider's largest events -- a whole
answer in one event, an image as base64 -- are a few megabytes; past the bound the
stream is refused (:class:`EventTooLarge`) instead of held: a server that never
ends a line (or an event) would otherwise take all the memory it cares to send."""
PIECE = 64
"""What holding one more string costs, counted against :data:`MAX_EVENT` (a short
``str`` is ~50 bytes, and a list's slot 8)."""


class EventTooLarge(ValueError):
    """A line or an event's data past :data:`MAX_EVENT`."""


@attrs.frozen(slots=True)
class SSEEvent:
    """One dispatched event: its type (``message`` unless named), data, id, retry."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Feeds on lines (without their line terminators); returns events as they complete.

    An event's data (its ``data`` lines) may take at most ``limit``
    (:data:`MAX_EVENT`): past that, :class:`EventTooLarge` -- a server
    sending ``data:`` lines without the blank line that ends an event would
    otherwise have them all held."""

    __slots__ = ("_data", "_event", "_first", "_limit", "_retry", "_size", "last_event_id")

    def __init__(self, limit: int | None = None) -> None:
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        """What :attr:`_data` holds, counted as :data:`MAX_EVENT` says (from its second
        line: one line is bounded by the line splitter)."""
        self._limit = MAX_EVENT if limit is None else limit
        self._retry: int | None = None
        self._first = True
        self.last_event_id: str | None = None

    def decode(self, line: str) -> SSEEvent | None:
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None  # a comment or keep-alive
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            if self._data:  # a second line or more: what the event holds is counted
                self._more(value)
            else:  # one line: bounded by the line splitter already
                self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif field == "retry" and value.isdigit():
            self._retry = int(value)
        # Any other field -- or a line of garbage -- is ignored, as the rules require.
        return None

    def _more(self, value: str) -> None:
        data = self._data
        if len(data) == 1:  # the event's first line was not counted
            self._size = len(data[0]) + PIECE
        self._size += len(value) + PIECE
        if self._size > self._limit:
            self._data = []
            raise EventTooLarge(
                f"an event-stream event whose data takes more than {self._limit:,} bytes; refused"
            )
        data.append(value)

    def flush(self) -> SSEEvent | None:
        """The event pending at end of stream, if it has data."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        if not self._data or self._data == [""]:
            # An empty data buffer (no ``data`` line, or only ``data:`` with nothing
            # after it) is not dispatched, and its event type is dropped with it
            # (WHATWG "dispatch the event", step 2): not an event, so no adapter can
            # take it for a corrupt payload and retry the request (issue 29).
            self._event = ""
            self._data = []
            return None
        event = SSEEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self.last_event_id,
            retry=self._retry,
        )
        self._event = ""
        self._data = []
        return event


def iter_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Events of an already-split stream (tests, recorded transcripts)."""
    decoder = SSEDecoder()
    for line in lines:
        event = decoder.decode(line.rstrip("\r\n"))
        if event is not None:
            yield event
    tail = decoder.flush()
    if tail is not None:
        yield tail


class LineSplitter:
    """Bytes of a stream -> its lines, split where the event-stream rules split them.

    Lines end at CRLF, LF or CR -- and nowhere else: a U+2028 inside a JSON
    string is data (``str.splitlines``, which httpx's ``aiter_lines`` uses, cut
    such an event in two). A CR at the end of a chunk waits for the next one,
    which may begin with its LF. Text is decoded incrementally (a character
    may straddle chunks), bad bytes replaced, as ``aiter_text`` did.

    Linear in the stream's length: each chunk's text is searched once, and a line
    that spans chunks is kept as its pieces, joined once when it ends (joining the
    pending line to every new chunk and splitting it again cost O(line^2): an 8 MB
    line with no end took ~25 s). A line longer than ``limit`` characters is refused
    (:class:`EventTooLarge`) when it gets there, before it is joined."""

    __slots__ = ("_held", "_limit", "_pending", "_size", "_text")

    def __init__(self, encoding: str = "utf-8", limit: int | None = None) -> None:
        self._text = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._pending: list[str] = []
        """The line under way, in pieces (empty: none)."""
        self._size = 0
        """What :attr:`_pending` holds, counted as :data:`MAX_EVENT` says."""
        self._held = ""
        """A CR that ended the last chunk (its LF may begin the next)."""
        self._limit = MAX_EVENT if limit is None else limit

    def feed(self, chunk: bytes) -> list[str]:
        text = self._text.decode(chunk)
        if self._held:
            text, self._held = self._held + text, ""
        if text.endswith("\r"):
            text, self._held = text[:-1], "\r"
        lines = _LINE_END.split(text)
        rest = lines.pop()
        pending = self._pending
        if pending:
            if lines:  # the line under way ends in this chunk
                if self._size + len(lines[0]) + PIECE > self._limit:
                    raise self._too_long()
                lines[0] = "".join(pending) + lines[0]
                pending.clear()
                self._size = 0
            elif not rest:
                return lines
        if rest:
            size = self._size + len(rest) + PIECE
            if size > self._limit:
                raise self._too_long()
            pending.append(rest)
            self._size = size
        return lines

    def _too_long(self) -> EventTooLarge:
        return EventTooLarge(f"an event-stream line of more than {self._limit:,} bytes; refused")

    def close(self) -> list[str]:
        """The last line, if the stream did not end it."""
        rest = "".join(self._pending) + self._held + self._text.decode(b"", final=True)
        self._pending.clear()
        self._size = 0
        self._held = ""
        lines = _LINE_END.split(rest) if rest else []
        if lines and not lines[-1]:
            lines.pop()
        return lines


_LINE_END = re.compile("\r\n|\r|\n")


class StreamedResponse(Protocol):
    """The parts of a response a stream is read from: ``httpx.Response`` has them, and so
    has the provider adapters' own HTTP/1.1 response (``providers/_wire.py``)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def default_encoding(self) -> object: ...

    @property
    def encoding(self) -> str | None: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


def _encoding(response: StreamedResponse) -> str:
    """The charset httpx would decode the stream's text with (its ``encoding``).

    Streams declare UTF-8 or nothing (then the client's default applies,
    UTF-8 unless it was given another); only another charset or default needs
    httpx's header parsing (~25 us a response)."""
    kind = response.headers.get("content-type", "").lower()
    if response.default_encoding == "utf-8" and (
        "charset" not in kind or kind.replace(" ", "").endswith("charset=utf-8")
    ):
        return "utf-8"
    return response.encoding or "utf-8"


async def aiter_sse(
    response: StreamedResponse, provider: str = "provider"
) -> AsyncGenerator[SSEEvent, None]:
    """Events of a streaming response, as they arrive.

    Reads the response's (decompressed) bytes and splits them itself: a chunk
    usually holds one event, and going through httpx's text and line layers
    cost more per chunk than decoding the event (bench/serve_load.py)."""
    import httpx

    decoder = SSEDecoder()
    lines = LineSplitter(_encoding(response))
    try:
        try:
            async for chunk in response.aiter_bytes():
                for line in lines.feed(chunk):
                    event = decoder.decode(line)
                    if event is not None:
                        yield event
        except httpx.TimeoutException as exc:
            raise ProviderError(
                f"{provider}: the stream stalled (read timeout)", retryable=True, code="timeout"
            ) from exc
        except httpx.TransportError as exc:
            raise ProviderError(
                f"{provider}: the connection dropped mid-stream ({type(exc).__name__}: {exc})",
                retryable=True,
                code="stream_interrupted",
            ) from exc
        for line in lines.close():
            event = decoder.decode(line)
            if event is not None:
                yield event
    except EventTooLarge as exc:
        raise ProviderError(
            f"{provider}: {exc} (whatever answers at the provider's address never ends it?)",
            retryable=False,
            code="response_too_large",
        ) from exc
    tail = decoder.flush()
    if tail is not None:
        yield tail
