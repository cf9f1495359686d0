"""The HTTP API of ``cantrip serve`` (SPEC.md "HTTP")."""
