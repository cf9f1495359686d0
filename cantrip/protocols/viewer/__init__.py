"""The browser viewer: its read model, routes and static assets."""
