"""A provider response's head, read by h11's grammar and rules, without h11.

Why its own module: what a head may hold (h11's ABNF, its checks of
``Content-Length`` and ``Transfer-Encoding``, its handling of folded lines) is a
grammar with no I/O in it; :mod:`._wire` keeps the connection that reads the bytes
and hands a head here. ``tests/test_wire_fuzz.py`` holds h11 as the oracle.
"""

from __future__ import annotations

import re

import httpx

MAX_HEAD = 100 * 1024
"""Bytes a response head may take (httpcore's h11 ``max_incomplete_event_size``)."""

HEAD_END = re.compile(rb"\n\r?\n")
"""Where a head (or a trailer) ends, h11's blank line: the LF of its last line, then a
line end."""
# What h11 accepts, after its ABNF (h11/_abnf.py), on the text of a head (decoded as
# httpx decodes it: each of its bytes one character, or a UTF-8 sequence of bytes
# that are all obs-text): a field character is anything but NUL and whitespace
# (``[^\x00\s]`` on bytes: space, tab, CR, LF, VT, FF).
_STATUS = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ([^\x00\n\r\x0b\x0c]*))?")
"""A status line (its reason phrase: field characters, spaces and tabs)."""
_VALUE_RE = r"(?:[^\x00\t\n\x0b\x0c\r ]+(?:[ \t]+[^\x00\t\n\x0b\x0c\r ]+)*)?"
"""A field value (h11's ``field-value``): field characters, spaces and tabs between."""
_FIELD = re.compile(r"(?m)^([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*(" + _VALUE_RE + r")[ \t]*\r?\n")
"""One ``name: value`` line, its value without the whitespace around it."""
_FIELD_LINE = re.compile(r"([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*(" + _VALUE_RE + r")[ \t]*")
"""A whole field line (folded lines joined), as h11 validates it."""
_TEXT_LINE = re.compile(r"\r?\n")
_FOLD = re.compile(r"[ \t]+")
CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
"""A chunk's size line, up to its CRLF (h11's ``chunk-header``: extensions not parsed)."""
LENGTH, CHUNKED, TO_CLOSE = 0, 1, 2


class Headers(dict[str, str]):
    """A response's headers by lower-case name; repeated ones joined with ``", "``
    (what ``httpx.Headers.get`` answers). ``raw`` keeps every (name, value) pair."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[str, str]]) -> None:
        super().__init__([(name.lower(), value) for name, value in raw])
        self.raw = raw
        if len(self) < len(raw):  # a name repeated: join its values in order
            joined: dict[str, list[str]] = {}
            for name, value in raw:
                joined.setdefault(name.lower(), []).append(value)
            self.update((key, ", ".join(values)) for key, values in joined.items())

    def normalize(self, key: str, value: str) -> None:
        """``key`` (lower-case) has ``value`` alone, in its first place, as h11 keeps a
        field it reads into one value (``Content-Length: 5, 5`` twice is ``5``)."""
        raw = self.raw
        at = next(i for i, (name, _) in enumerate(raw) if name.lower() == key)
        raw[at:] = [(raw[at][0], value)] + [p for p in raw[at + 1 :] if p[0].lower() != key]
        self[key] = value


Head = tuple[int, Headers, int, int, bool]
"""A response head read: (status, headers, framing, length, keep-alive)."""


def read_head(head: bytes) -> Head | None:
    """The status, headers and body framing a response head gives (None for an
    informational 1xx one, which the reader skips)."""
    first, _, rest = head.partition(b"\n")
    status_line = _STATUS.fullmatch(first.removesuffix(b"\r"))
    if status_line is None:
        raise httpx.RemoteProtocolError(f"illegal status line: {first[:100]!r}")
    status = int(status_line.group(2))
    if status < 200:
        if status == 101:
            raise httpx.RemoteProtocolError("unexpected 101 Switching Protocols")
        framing(status, Headers(fields(rest)), status_line)  # checked as h11 checks it
        return None
    headers = Headers(fields(rest))
    return (status, headers, *framing(status, headers, status_line))


def fields(lines: bytes) -> list[tuple[str, str]]:
    """The (name, value) fields of a head's (or a trailer's) lines, as h11 reads them
    (each line ends with its LF: a CR before it is the line's end, one more is not)."""
    if not lines:
        return []
    # httpx decodes header bytes as ASCII, else UTF-8, else Latin-1.
    if lines.isascii():
        text = lines.decode("ascii")
    else:
        try:
            text = lines.decode("utf-8")
        except UnicodeDecodeError:
            text = lines.decode("iso-8859-1")
    raw: list[tuple[str, str]] = _FIELD.findall(text)
    if len(raw) != text.count("\n"):  # not every line a plain field: folded, or garbage
        raw = _fields_one_by_one(text)
    return raw


def framing(status: int, headers: Headers, status_line: re.Match[bytes]) -> tuple[int, int, bool]:
    """(framing, length, keep-alive) of a response's body, by h11's rules: its
    ``Content-Length`` and ``Transfer-Encoding`` are checked whatever the status
    (h11 checks every head's), then 204 and 304 have no body."""
    keep_alive = status_line.group(1) >= b"1.1" and (
        "connection" not in headers
        or "close" not in {token.strip().lower() for token in headers["connection"].split(",")}
    )
    chunked = "transfer-encoding" in headers
    if chunked and headers["transfer-encoding"] != "chunked":
        if headers["transfer-encoding"].lower() != "chunked":
            raise httpx.RemoteProtocolError("Only Transfer-Encoding: chunked is supported")
        headers.normalize("transfer-encoding", "chunked")
    length = -1
    if "content-length" in headers:
        given = headers["content-length"]
        lengths = {part.strip() for part in given.split(",")}
        value = lengths.pop()
        if lengths or not value.isdigit() or not value.isascii() or len(value) > 20:
            raise httpx.RemoteProtocolError("bad Content-Length")
        length = int(value)
        if given != value:  # repeated, or with spaces: one value, as h11 keeps it
            headers.normalize("content-length", value)
    if status in (204, 304):
        return LENGTH, 0, keep_alive
    if chunked:
        return CHUNKED, 0, keep_alive
    if length >= 0:
        return LENGTH, length, keep_alive
    return TO_CLOSE, 0, False


def _fields_one_by_one(text: str) -> list[tuple[str, str]]:
    """The fields of a head with folded lines (obs-fold) or a line that is no field:
    as h11, a continuation line's leading whitespace becomes one space of the line
    before, then each whole line must be a field."""
    joined: list[str] = []
    for line in _TEXT_LINE.split(text)[:-1]:
        fold = _FOLD.match(line)
        if fold is None:
            joined.append(line)
        elif not joined:
            raise httpx.RemoteProtocolError("continuation line at start of headers")
        else:
            joined[-1] += " " + line[fold.end() :]
    raw: list[tuple[str, str]] = []
    for line in joined:
        field = _FIELD_LINE.fullmatch(line)
        if field is None:
            raise httpx.RemoteProtocolError(f"illegal header line: {line[:100]!r}")
        raw.append((field.group(1), field.group(2)))
    return raw
