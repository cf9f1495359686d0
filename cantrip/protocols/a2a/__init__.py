"""The A2A server side: tasks and push notifications (SPEC.md "A2A")."""
