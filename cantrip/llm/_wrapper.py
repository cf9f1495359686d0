"""What every LLM wrapper shares: it looks like the LLM it wraps.

Retry, telemetry and rate-limit layers each wrap one ``inner`` LLM; they
pass through its name, its context window (the folding trigger) and its
``aclose``, and call it streaming or not as their caller asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cantrip.llm._contract import LLM, Message, Response, ToolChoice, ToolDefinition, can_stream


class Delegating:
    """Mixin: ``query`` and ``stream`` are one method, ``_call``, with or without a sink."""

    __slots__ = ()

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        return await self._call(messages, tools, tool_choice, extra, None)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
        *,
        on_event: Callable[[Any], None],
    ) -> Response:
        return await self._call(messages, tools, tool_choice, extra, on_event)

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any] | None,
        on_event: Callable[[Any], None] | None,
    ) -> Response:
        raise NotImplementedError


class Wrapper(Delegating):
    """Mixin for wrappers with an ``inner`` LLM attribute."""

    __slots__ = ()
    inner: LLM

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def context_window(self) -> int | None:
        """The wrapped model's window, for the folding trigger (PROD-4)."""
        value = getattr(self.inner, "context_window", None)
        return value if isinstance(value, int) else None

    async def aclose(self) -> None:
        closer = getattr(self.inner, "aclose", None)
        if closer is not None:
            await closer()


async def call(
    llm: LLM,
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition],
    tool_choice: ToolChoice | None,
    extra: Mapping[str, Any] | None,
    on_event: Callable[[Any], None] | None,
) -> Response:
    """Query ``llm``, streaming when there is a sink and it can stream."""
    if on_event is not None and can_stream(llm):
        return await llm.stream(messages, tools, tool_choice, extra, on_event=on_event)
    return await llm.query(messages, tools, tool_choice, extra)
