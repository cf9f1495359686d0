"""``--otlp URL``: OpenTelemetry set up for users who did not set it up themselves.

Installs an SDK tracer provider that ships spans to an OTLP/HTTP endpoint
(Jaeger, Phoenix, Logfire, Langfuse, an OpenTelemetry Collector) and returns
the function that flushes and stops it when the command ends. The SDK's batch
processor exports from its own worker, off the event loop, so a slow collector
never holds a turn up. Needs the ``otel`` extra (``pip install 'cantrip-runtime[otel]'``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from cantrip._errors import ConstructionError
from cantrip._install import require_extra

EXPORT_TIMEOUT_S = 3.0
"""How long one export (with the exporter's own retries) may take: a collector on
this machine or network answers in far less; one that is not there would hold the
end of every command for the SDK's default 10 s."""
_FAILURE_WORDS = ("export", "transient error", "failed to", "max retries")


class _SayOnce(logging.Handler):
    """Prints the first export failure as one cantrip line and drops the repeats
    (the SDK logs each retry of each batch: a screenful when no collector runs).
    Anything else the SDK says is printed as it is."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(logging.WARNING)
        self.endpoint = endpoint
        self.said = False

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if not any(word in text.lower() for word in _FAILURE_WORDS):
            print(text, file=sys.stderr)
            return
        if self.said:
            return
        self.said = True
        reason = "connection refused" if "refused" in text.lower() else text.split("\n")[0][:160]
        print(
            f"cantrip: cannot send traces to {self.endpoint} ({reason}); the spans of this "
            "run are dropped -- is the collector running? (said once)",
            file=sys.stderr,
        )


def configure_otlp(endpoint: str, *, service_name: str = "cantrip") -> Callable[[], None]:
    """Send every span to ``endpoint`` (e.g. ``http://127.0.0.1:4318/v1/traces``)."""
    if not endpoint.startswith(("http://", "https://")):
        raise ConstructionError(f"--otlp wants an http(s) URL, not {endpoint!r}")
    require_extra("otel", "--otlp")
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    sdk_log = logging.getLogger("opentelemetry")
    handler = _SayOnce(endpoint)
    sdk_log.addHandler(handler)
    propagate, sdk_log.propagate = sdk_log.propagate, False

    def shutdown() -> None:
        try:
            provider.shutdown()
        finally:
            sdk_log.removeHandler(handler)
            sdk_log.propagate = propagate

    return shutdown
