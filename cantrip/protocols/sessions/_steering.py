"""How much steering one running cast takes: the policy both session stores enforce
(SPEC.md "Steering and double-texting", docs/how-to/serve.md).

A message sent to a running prompt (``POST /sessions/{id}/messages``) joins the cast's
next turn and stays in its context for every later request of that cast. Unbounded, a
client could queue 400 messages of 100 KB each, all accepted (202), all joining the
next request to the model -- 40 MB the provider refuses, billed or not. So one cast
takes at most :data:`MAX_MESSAGES` messages and :data:`MAX_BYTES` bytes of them (UTF-8,
counted over every message sent to it, whether it has joined a turn yet or not: what
has joined stays in the context); beyond either, the message is refused with 429 and
``Retry-After``, and nothing is queued. The next prompt starts with a fresh budget.

The numbers live here only. The in-process store counts on the running prompt (one
trio thread: the check and the append cannot interleave); ``serve --db`` counts the
work item's rows in ``cantrip_messages`` under the work row's lock, in the transaction
that adds the message, so replicas steering the same cast at once cannot exceed it.
"""

from __future__ import annotations

MAX_MESSAGES = 64
"""The most steering messages one cast takes."""
MAX_BYTES = 256 * 1024
"""The most bytes (UTF-8) of steering messages one cast takes, all of them together."""

FULL = "steering_full"
"""The refusal's code (HTTP 429 with ``Retry-After``)."""


def size_of(text: str) -> int:
    """A message's size as the policy counts it: its UTF-8 bytes (what PostgreSQL's
    ``octet_length`` counts, so both stores agree)."""
    return len(text.encode("utf-8"))


def refusal(sent: int, sent_bytes: int, text: str) -> str | None:
    """Why a cast that has taken ``sent`` messages of ``sent_bytes`` bytes cannot take
    ``text`` too (one line for the client), or None if it can."""
    if sent + 1 > MAX_MESSAGES:
        return (
            f"the running prompt has taken {sent} steering messages, the most one cast takes "
            f"({MAX_MESSAGES}); send it as a prompt once this one ends"
        )
    size = size_of(text)
    if sent_bytes + size > MAX_BYTES:
        return (
            f"the running prompt has taken {sent_bytes} bytes of steering messages and this "
            f"one has {size}: one cast takes at most {MAX_BYTES}; send it as a prompt once "
            "this one ends"
        )
    return None
