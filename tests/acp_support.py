"""What the tests driving ``cantrip acp`` with the official ``agent-client-protocol``
client share: a text block (1.0 dropped the ``text_block`` helper) and the client's
protocol as our test doubles implement it."""

from __future__ import annotations

from typing import Any, cast

from acp import Client, schema


def text_block(text: str) -> schema.TextContentBlock:
    """A prompt's text, as the client's models build it."""
    return schema.TextContentBlock(type="text", text=text)


def as_client(double: Any) -> Client:
    """A test double implements the part of the Client protocol the agent uses."""
    return cast(Client, double)
