"""Why a provider stopped, normalized once for every adapter (issue 22).

Each provider names its finish/stop reasons in its own words. An adapter
declares a table from every reason its API documents to one :class:`Finish`
and calls :func:`resolve_finish` with the reason it received; that single
function decides what the loop sees:

* a usable answer: ``end_turn``, ``tool_use`` or ``stop_sequence``;
* an answer cut off by the output-token limit: ``max_tokens`` -- never a final
  answer; the entity continues it or ends the cast as truncated, and a tool
  call whose arguments may be incomplete is marked ``cut_off`` (see
  :func:`mark_cut_off`) so the medium returns an ``is_error`` observation
  instead of running it;
* a refusal (content filter, safety, recitation, ...): a
  :class:`~cantrip.ProviderError` with code ``refusal`` naming the provider's
  reason, never retried;
* a fault a new attempt may not repeat (a malformed function call, a request
  the server aborted): a retryable ``ProviderError``, so the retry layer asks
  again inside the turn;
* anything else, including a reason no table lists: a ``ProviderError``
  (logged at WARNING when the reason is unknown), never ``end_turn``.

A missing reason (``None``: scripted payloads, lenient local servers that
leave it out) is not an unknown one: the answer is taken as complete, a tool
use if it carries calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from cantrip._errors import ProviderError
from cantrip._redact import get_logger
from cantrip.llm._contract import StopReason, ToolCall

log = get_logger("cantrip.llm.finish")

FinishKind = Literal["answer", "token_limit", "refusal", "transient", "failure"]

REFUSAL_CODE = "refusal"
UNKNOWN_CODE = "unknown_finish_reason"


@attrs.frozen
class Finish:
    """What one provider finish reason means for the loop."""

    kind: FinishKind
    stop: StopReason | None = None
    """The normalized stop reason of a usable or cut-off answer."""
    why: str = ""
    """For errors: what happened, in words a user reads."""


def answer(stop: StopReason) -> Finish:
    """A complete answer (``end_turn``, ``tool_use``, ``stop_sequence``)."""
    return Finish("answer", stop)


TOKEN_LIMIT = Finish("token_limit", "max_tokens")
"""The output-token limit (or the context window) cut the answer off."""


def refusal(why: str) -> Finish:
    """Content filter, refusal, safety: the user sees it; never retried."""
    return Finish("refusal", why=why)


def transient(why: str) -> Finish:
    """Unusable this time, maybe not the next (a malformed function call, an
    aborted request): retried inside the turn like a dropped connection."""
    return Finish("transient", why=why)


def failure(why: str) -> Finish:
    """The provider stopped for a reason no retry can fix."""
    return Finish("failure", why=why)


def resolve_finish(
    provider: str,
    reason: str | None,
    table: Mapping[str, Finish],
    *,
    has_calls: bool,
    detail: str = "",
) -> StopReason:
    """The normalized stop reason for ``reason``, or the ``ProviderError`` it means.

    ``detail`` is whatever the provider said about it (a refusal text, the
    safety categories that fired); it is appended to the error message.
    """
    if reason is None or reason == "":
        return "tool_use" if has_calls else "end_turn"
    finish = table.get(reason)
    extra = f": {detail}" if detail else ""
    if finish is None:
        log.warning("%s: unknown finish reason %r; treated as an error", provider, reason)
        raise ProviderError(
            f"{provider}: the response ended with an unknown finish reason {reason!r}{extra}",
            retryable=False,
            code=UNKNOWN_CODE,
        )
    if finish.kind == "answer":
        stop = finish.stop or "end_turn"
        return "tool_use" if stop == "end_turn" and has_calls else stop
    if finish.kind == "token_limit":
        return "max_tokens"
    if finish.kind == "refusal":
        raise ProviderError(
            f"{provider}: the provider refused to answer ({reason}: {finish.why}){extra}",
            retryable=False,
            code=REFUSAL_CODE,
        )
    raise ProviderError(
        f"{provider}: the response ended with {reason} ({finish.why}){extra}",
        retryable=finish.kind == "transient",
        code=f"finish_{reason.lower()}",
    )


def mark_cut_off(
    calls: Sequence[ToolCall], stop: StopReason | None, *, arguments_as_text: bool
) -> tuple[ToolCall, ...]:
    """The calls of an answer, with those the token limit may have cut marked ``cut_off``.

    Only a ``max_tokens`` answer has cut calls. Where arguments arrive as JSON
    text (OpenAI-compatible APIs, Anthropic streams) a cut is visible: the text
    does not parse. Where they arrive as an object (Gemini, a whole Anthropic
    message) it is not, so the last call is taken as cut -- running a call with
    half its arguments is worse than asking the model to make it again.
    """
    if stop != "max_tokens" or not calls:
        return tuple(calls)
    out = []
    last = len(calls) - 1
    for index, call in enumerate(calls):
        unparsed = call.raw_arguments is not None and not call.arguments
        cut = unparsed or (index == last and not arguments_as_text)
        out.append(attrs.evolve(call, cut_off=True) if cut else call)
    return tuple(out)
