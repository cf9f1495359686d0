"""The terminal: live progress of casts, the ``invoke`` prompt, answering pauses."""
