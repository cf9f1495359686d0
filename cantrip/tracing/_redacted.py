"""Spans that pass everything they carry through the secret redactor first (issue 28.1).

A span's name, attributes, status description and events leave the process with
the OTLP exporter; any of them can hold text a provider or a gate produced (an
error that quotes the API key). :class:`RedactedSpan` wraps an OpenTelemetry span
so the :class:`~cantrip.tracing._sink.TraceSink` cannot set any of these without
redaction: the value is redacted *whole*, and only then cut to length, so a cut
can never leave part of a key the redactor would no longer recognise.

Redaction is paid once per value, not once per span (issue 39.24): most of what a
span carries recurs every turn, so everything here is redacted through one
process-wide :class:`~cantrip._redact.RedactionMemo`, which checks the environment
once per call and remembers the redactor's answer for each short text until the
environment's secrets change. Nothing skips the redactor -- a remembered answer is
its answer. The loops below look texts up inline, without a call per value: a
traced turn sets fourteen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cantrip._redact import RedactionMemo

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, Tracer

STATUS_MAX = 200
"""Characters of a status description kept (after redaction)."""

_MEMO = RedactionMemo()
"""Shared by every span of the process: the values repeat across casts too."""


def clean_attributes(
    attributes: Mapping[str, Any] | None, known: dict[str, str] | None = None
) -> dict[str, Any]:
    """Attribute values with every string (also inside sequences) redacted (``known``:
    what :meth:`~cantrip._redact.RedactionMemo.known` gave the caller a moment ago).

    Each value is sorted by its exact type, looked up once: a chain of ``isinstance``
    tests cost a number (most of a chat span's values) three of them (issue 39.24).
    Anything else -- a subclass of ``str``, another kind of sequence -- goes the long
    way, and is redacted all the same."""
    if known is None:
        known = _MEMO.known()
    cleaned: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        kind = type(value)
        if kind is str:
            text = known.get(value)
            cleaned[key] = _MEMO.learn(value) if text is None else text
        elif kind is int or kind is float or kind is bool:
            cleaned[key] = value
        elif kind is list or kind is tuple:
            cleaned[key] = _clean_items(value, known)
        else:
            cleaned[key] = _clean_other(value, known)
    return cleaned


def _clean_other(value: Any, known: dict[str, str]) -> Any:
    """A value that is not exactly a string or a number: a sequence's strings redacted,
    a subclass of ``str`` redacted as one."""
    if isinstance(value, str):
        text = known.get(value)
        return _MEMO.learn(value) if text is None else text
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return _clean_items(value, known)
    return value


def _clean_items(value: Sequence[Any], known: dict[str, str]) -> list[Any]:
    """A sequence's items as a list, its strings redacted."""
    items = []
    for item in value:  # a loop: no comprehension frame and no call per item
        if isinstance(item, str):
            text = known.get(item)
            item = _MEMO.learn(item) if text is None else text
        items.append(item)
    return items


def clean_status(description: str | None) -> str | None:
    """A status description redacted, then cut to :data:`STATUS_MAX` characters."""
    return None if description is None else _MEMO.redact(description)[:STATUS_MAX]


_new = object.__new__


class RedactedSpan:
    """The span methods the trace sink uses, each redacting what it is given."""

    __slots__ = ("inner",)

    def __init__(self, inner: Span) -> None:
        self.inner = inner
        """The OpenTelemetry span itself (for contexts: a child's parent)."""

    @classmethod
    def start(
        cls,
        tracer: Tracer,
        name: str,
        context: Context | None,
        kind: SpanKind,
        attributes: Mapping[str, Any] | None = None,
        start_time: int | None = None,
    ) -> RedactedSpan:
        """A new span, its name and attributes redacted (one look at the environment).
        Every argument is named, none forwarded through ``**options``: the sink starts
        two spans a turn, and packing and unpacking keywords twice cost more than the
        redaction."""
        known = _MEMO.known()
        text = known.get(name)
        span = _new(cls)  # no __init__ frame: two spans a turn
        span.inner = tracer.start_span(
            _MEMO.learn(name) if text is None else text,
            context,
            kind,
            None if attributes is None else clean_attributes(attributes, known),
            start_time=start_time,
        )
        return span

    def set_attribute(self, key: str, value: Any) -> None:
        self.inner.set_attributes(clean_attributes({key: value}))

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.inner.set_attributes(clean_attributes(attributes))

    def update_name(self, name: str) -> None:
        self.inner.update_name(_MEMO.redact(name))

    def set_status(self, status: Status) -> None:
        from opentelemetry.trace import Status

        self.inner.set_status(Status(status.status_code, clean_status(status.description)))

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        self.inner.add_event(_MEMO.redact(name), clean_attributes(attributes), timestamp)

    def record_exception(self, exception: BaseException) -> None:
        """An ``exception`` event with the message redacted (never the raw traceback)."""
        self.inner.add_event(
            "exception",
            {
                "exception.type": type(exception).__name__,
                "exception.message": _MEMO.redact(str(exception)),
            },
        )

    def end(self) -> None:
        self.inner.end()


__all__ = ["STATUS_MAX", "RedactedSpan", "clean_attributes", "clean_status"]
