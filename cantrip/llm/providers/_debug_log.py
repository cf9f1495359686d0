"""The transcript debug log: what the renderer did to a request, for a request gone wrong.

Why apart from the adapter: it is an optional diagnosis beside the request,
never part of it -- a refused request, or every request when asked, reported
to the ``cantrip.llm.transcript`` logger (seed 001, section 10) -- and it may
cost a second render, which the request's own path must never pay.

* at WARNING when the provider refuses a request as a client error (400, 409,
  413, 422, ...: not auth, not a missing model, nothing retryable): the
  transcript is the likely culprit;
* at DEBUG for every request when the adapter was made with ``debug=True``
  or ``CANTRIP_DEBUG_TRANSCRIPT=1`` was set.

The report holds ids, names and counts, never content.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from cantrip._errors import ProviderError
from cantrip._redact import get_logger
from cantrip.llm._contract import Message
from cantrip.llm._transcript import render_transcript
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_model import ProviderFormat

transcript_log = get_logger("cantrip.llm.transcript")
DEBUG_TRANSCRIPT_ENV = "CANTRIP_DEBUG_TRANSCRIPT"
"""Set to ``1`` to log every request's transcript diagnostics at DEBUG."""
_NOT_THE_TRANSCRIPT = frozenset({401, 403, 404})
"""Client errors a transcript cannot cause: credentials, permissions, an unknown model."""


def debug_from_environment() -> bool:
    """Whether ``CANTRIP_DEBUG_TRANSCRIPT`` asks for every request's diagnostics."""
    return os.environ.get(DEBUG_TRANSCRIPT_ENV, "").strip().lower() in ("1", "true", "yes")


def may_be_the_transcript(error: ProviderError) -> bool:
    """Whether the provider refused a request for something the transcript may have caused:
    a client error that is not about credentials, permissions or the model, and no retry."""
    return (
        error.status is not None
        and 400 <= error.status < 500
        and error.status not in _NOT_THE_TRANSCRIPT
        and not error.retryable
    )


def log_transcript(
    level: int,
    adapter: str,
    messages: Sequence[Message],
    sent: Sequence[Message],
    error: ProviderError | None,
    *,
    family: ProviderFormat,
    keep_thinking: bool,
    reasoning_format: str | None,
) -> None:
    """The renderer's diagnostics of one request of ``adapter`` (seed 001, section 10).

    The diagnostics come from rendering ``messages`` again (pure, so equal to
    what was sent; this costs O(messages), only here). ``render_problems`` is
    :func:`validate_transcript` of what was sent: non-empty means a renderer
    fault, empty with a refused request points at the adapter's wire shape or
    at something other than the transcript. The report is also the record's
    ``transcript`` attribute; it holds ids, names and counts, never content.
    """
    if not transcript_log.isEnabledFor(level):
        return
    again = render_transcript(
        messages,
        family,
        keep_thinking=keep_thinking,
        reasoning_format=reasoning_format,
    )
    report: dict[str, Any] = {
        "adapter": adapter,
        **again.diagnostics.to_dict(),
        "render_problems": validate_transcript(sent, family, reasoning_format=reasoning_format),
    }
    if error is None:
        transcript_log.log(
            level, "%s: transcript sent: %s", adapter, report, extra={"transcript": report}
        )
        return
    report["status"] = error.status
    report["code"] = error.code
    transcript_log.log(
        level,
        "%s: the provider refused the request (%s); transcript diagnostics: %s",
        adapter,
        error,
        report,
        extra={"transcript": report},
    )
