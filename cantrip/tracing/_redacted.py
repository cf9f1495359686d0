"""Spans that pass everything they carry through the secret redactor first (issue 28.1).

A span's name, attributes, status description and events leave the process with
the OTLP exporter; any of them can hold text a provider or a gate produced (an
error that quotes the API key). :class:`RedactedSpan` wraps an OpenTelemetry span
so the :class:`~cantrip.tracing._sink.TraceSink` cannot set any of these without
redaction: the value is redacted *whole*, and only then cut to length, so a cut
can never leave part of a key the redactor would no longer recognise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cantrip._redact import redact

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Status

STATUS_MAX = 200
"""Characters of a status description kept (after redaction)."""


def clean_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attribute values with every string (also inside sequences) redacted."""
    return {key: clean_value(value) for key, value in (attributes or {}).items()}


def clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return [redact(v) if isinstance(v, str) else v for v in value]
    return value


def clean_status(description: str | None) -> str | None:
    """A status description redacted, then cut to :data:`STATUS_MAX` characters."""
    return None if description is None else redact(description)[:STATUS_MAX]


class RedactedSpan:
    """The span methods the trace sink uses, each redacting what it is given."""

    __slots__ = ("inner",)

    def __init__(self, inner: Span) -> None:
        self.inner = inner
        """The OpenTelemetry span itself (for contexts: a child's parent)."""

    def set_attribute(self, key: str, value: Any) -> None:
        self.inner.set_attribute(key, clean_value(value))

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.inner.set_attributes(clean_attributes(attributes))

    def update_name(self, name: str) -> None:
        self.inner.update_name(redact(name))

    def set_status(self, status: Status) -> None:
        from opentelemetry.trace import Status

        self.inner.set_status(Status(status.status_code, clean_status(status.description)))

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self.inner.add_event(redact(name), clean_attributes(attributes))

    def record_exception(self, exception: BaseException) -> None:
        """An ``exception`` event with the message redacted (never the raw traceback)."""
        self.inner.add_event(
            "exception",
            {
                "exception.type": type(exception).__name__,
                "exception.message": redact(str(exception)),
            },
        )

    def end(self) -> None:
        self.inner.end()


__all__ = ["STATUS_MAX", "RedactedSpan", "clean_attributes", "clean_status"]
