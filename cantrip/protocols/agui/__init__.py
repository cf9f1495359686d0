"""AG-UI 1.0 over ``POST /agui`` (SPEC.md "AG-UI")."""
