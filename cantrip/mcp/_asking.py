"""The calling entity behind an MCP tool call: asks the server's questions as pauses.

Why its own module: while a call is in flight the server may ask (``elicitation/create``)
-- the SDK calls back from its own task, so the question is handed to the call's task
(an :class:`Asker` per call in flight) and asked there as the entity's pause, in the
call's cancel scope; a call that ends first cancels what it still had open. The
connection (:mod:`._client`) only routes questions to the newest call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from cantrip._approval import Decision
from cantrip._elicit import AnswerError, check_form, form_content
from cantrip._redact import get_logger

log = get_logger("cantrip.mcp")


class Question:
    """One elicitation waiting for its answer (settled once: by the answer, or by
    ``cancel`` when the call that it belongs to ended first)."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.result: Any = None
        self.done = trio.Event()

    def settle(self, result: Any) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()


class Asker:
    """The entity behind one call in flight: asks the server's questions as pauses."""

    def __init__(self, entity: Any, gate: str, origin: str) -> None:
        self.entity, self.gate, self.origin = entity, gate, origin
        self._send, self._receive = trio.open_memory_channel[Question](math.inf)
        self._open: set[Question] = set()

    def ask(self, question: Question) -> bool:
        """Hand ``question`` to the call's task; False when the call has ended."""
        try:
            self._send.send_nowait(question)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        self._open.add(question)
        return True

    async def serve(self) -> None:
        async with self._receive, trio.open_nursery() as nursery:
            async for question in self._receive:
                nursery.start_soon(self._answer, question)

    async def _answer(self, question: Question) -> None:
        from mcp_types import ElicitResult

        params = question.params
        url = getattr(params, "url", None)
        schema = None if url is not None else dict(getattr(params, "requested_schema", {}) or {})
        if schema is not None:
            try:
                check_form(schema)
            except AnswerError as exc:  # never asked: declined, and said why in the log
                log.warning("MCP %s: a question declined unasked: %s", self.origin, exc)
                question.settle(ElicitResult(action="decline"))
                return
        decision = await self.entity.ask_during_call(
            self.gate, params.message, origin=self.origin, schema=schema, url=url
        )
        question.settle(elicit_result(decision, schema))

    def close(self) -> None:
        """The call ended: questions still open are cancelled (the MCP ``cancel`` action)."""
        self._send.close()
        from mcp_types import ElicitResult

        for question in self._open:
            question.settle(ElicitResult(action="cancel"))
        self._open.clear()


def elicit_result(decision: Decision, schema: Mapping[str, Any] | None) -> Any:
    """A pause's decision as MCP's ``ElicitResult``: an answer accepts (a form's answer
    is the object it fills in; a URL's is consent), a refusal declines."""
    from mcp_types import ElicitResult

    if decision.kind == "deny":
        return ElicitResult(action="decline")
    if schema is None:
        return ElicitResult(action="accept")
    return ElicitResult(action="accept", content=form_content(schema, decision.text or ""))
