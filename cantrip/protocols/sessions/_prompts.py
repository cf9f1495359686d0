"""A prompt's text, read from the variants clients send (PROD-6): a string, text content
blocks (ACP's and the HTTP API's ACP-shaped body), or a text resource. One reading for
every front end; each says a refusal its own way (HTTP 400, ACP ``INVALID_PARAMS``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip._text import TextError, check_text


class PromptError(ValueError):
    """A prompt with no usable text (the message says why)."""


def read_prompt(params: Mapping[str, Any]) -> str:
    """The intent of a prompt, from the variants clients send (PROD-6)."""
    raw = params.get("prompt", params.get("content"))
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, list):
        parts = []
        for block in raw:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type", "text") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") == "resource":
                resource = block.get("resource") or {}
                if isinstance(resource, Mapping) and "text" in resource:
                    parts.append(str(resource["text"]))
        text = "\n".join(p for p in parts if p)
    elif isinstance(raw, Mapping) and "text" in raw:
        text = str(raw["text"])
    else:
        raise PromptError("the prompt needs text: a string or text content blocks")
    if not text.strip():
        raise PromptError("the prompt is empty")
    try:
        return check_text(text, "the prompt")
    except TextError as exc:
        raise PromptError(str(exc)) from None
