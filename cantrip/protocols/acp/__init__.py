"""ACP over stdio (``cantrip acp``)."""
