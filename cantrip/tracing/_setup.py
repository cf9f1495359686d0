"""``--otlp URL``: OpenTelemetry set up for users who did not set it up themselves.

Installs an SDK tracer provider that ships spans to an OTLP/HTTP endpoint
(Jaeger, Phoenix, Logfire, Langfuse, an OpenTelemetry Collector) and returns
the function that flushes and stops it when the command ends. The SDK's batch
processor exports from its own worker, off the event loop, so a slow collector
never holds a turn up. Needs the ``otel`` extra (``pip install 'cantrip-runtime[otel]'``).
"""

from __future__ import annotations

from collections.abc import Callable

from cantrip._errors import ConstructionError
from cantrip._version import DISTRIBUTION


def configure_otlp(endpoint: str, *, service_name: str = "cantrip") -> Callable[[], None]:
    """Send every span to ``endpoint`` (e.g. ``http://127.0.0.1:4318/v1/traces``)."""
    if not endpoint.startswith(("http://", "https://")):
        raise ConstructionError(f"--otlp wants an http(s) URL, not {endpoint!r}")
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConstructionError(
            f"--otlp needs OpenTelemetry: pip install '{DISTRIBUTION}[otel]'"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    return provider.shutdown
