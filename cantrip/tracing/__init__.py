"""OpenTelemetry traces: a view of the event stream, never calls inside the loop.

:mod:`._sink` builds GenAI spans live from an entity's events, :mod:`._otlp` builds the
same spans from a recorded loom (``cantrip loom FILE export --format otlp``),
:mod:`._genai` is the one mapping both use, and :mod:`._setup` wires ``--otlp URL``.
OpenTelemetry itself is imported only when a tracer is configured (the ``[otel]`` extra).
"""
