"""OpenRouter: the OpenAI Chat Completions wire format, with OpenRouter's extras.

Differences handled here: usage accounting is requested so every answer
reports its cost (``usage.cost`` -> ``Response.metadata["cost"]``), reasoning
arrives as ``reasoning``, and keep-alive comments (``: OPENROUTER PROCESSING``)
and mid-stream errors (an ``error`` object with ``finish_reason: "error"``)
are part of its streams -- both handled by the shared SSE and chat parsers.
Attribution headers (``HTTP-Referer``, ``X-Title``) come from the config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cantrip.llm._contract import Message, ToolChoice, ToolDefinition
from cantrip.llm.providers.openai import OpenAIAdapter


class OpenRouterAdapter(OpenAIAdapter):
    reports_cost = True  # usage accounting is asked for in every request (below)

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        url, body = super().build_request(messages, tools, tool_choice, extra, stream)
        body.setdefault("usage", {"include": True})
        return url, body


ADAPTER = OpenRouterAdapter
