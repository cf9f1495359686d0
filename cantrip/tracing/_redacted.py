"""Spans that pass everything they carry through the secret redactor first (issue 28.1).

A span's name, attributes, status description and events leave the process with
the OTLP exporter; any of them can hold text a provider or a gate produced (an
error that quotes the API key). :class:`RedactedSpan` wraps an OpenTelemetry span
so the :class:`~cantrip.tracing._sink.TraceSink` cannot set any of these without
redaction: the value is redacted *whole*, and only then cut to length, so a cut
can never leave part of a key the redactor would no longer recognise.

Redaction is paid once per value, not once per span (issue 39.24): most of what a
span carries recurs every turn, so every call here redacts through one process-wide
:class:`~cantrip._redact.RedactionMemo`, which checks the environment once per call
and remembers the redactor's answer for each short text until the environment's
secrets change. Nothing skips the redactor -- a remembered answer is its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cantrip._redact import RedactionMemo

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Status, Tracer

STATUS_MAX = 200
"""Characters of a status description kept (after redaction)."""

_MEMO = RedactionMemo()
"""Shared by every span of the process: the values repeat across casts too."""


def clean_attributes(
    attributes: Mapping[str, Any] | None, redact: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """Attribute values with every string (also inside sequences) redacted."""
    redact = redact or _MEMO.redactor()
    return {key: _clean(value, redact) for key, value in (attributes or {}).items()}


def _clean(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return [redact(v) if isinstance(v, str) else v for v in value]
    return value


def clean_status(description: str | None, redact: Callable[[str], str] | None = None) -> str | None:
    """A status description redacted, then cut to :data:`STATUS_MAX` characters."""
    if description is None:
        return None
    return (redact or _MEMO.redactor())(description)[:STATUS_MAX]


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
        context: Context | None = None,
        attributes: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> RedactedSpan:
        """A new span, its name and attributes redacted (one environment check for both)."""
        redact = _MEMO.redactor()
        if attributes is not None:
            options["attributes"] = clean_attributes(attributes, redact)
        return cls(tracer.start_span(redact(name), context=context, **options))

    def set_attribute(self, key: str, value: Any) -> None:
        self.inner.set_attribute(key, _clean(value, _MEMO.redactor()))

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.inner.set_attributes(clean_attributes(attributes))

    def update_name(self, name: str) -> None:
        self.inner.update_name(_MEMO.redactor()(name))

    def set_status(self, status: Status) -> None:
        from opentelemetry.trace import Status

        self.inner.set_status(Status(status.status_code, clean_status(status.description)))

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        redact = _MEMO.redactor()
        self.inner.add_event(redact(name), clean_attributes(attributes, redact))

    def record_exception(self, exception: BaseException) -> None:
        """An ``exception`` event with the message redacted (never the raw traceback)."""
        self.inner.add_event(
            "exception",
            {
                "exception.type": type(exception).__name__,
                "exception.message": _MEMO.redactor()(str(exception)),
            },
        )

    def end(self) -> None:
        self.inner.end()


__all__ = ["STATUS_MAX", "RedactedSpan", "clean_attributes", "clean_status"]
