"""What counts as an intent: it says something (INTENT-1), and it is text (issue 20).

An intent (a CLI argument, stdin, an ACP or HTTP prompt) is recorded in the
loom, whose stores hold UTF-8. Text that cannot be encoded as UTF-8 -- lone
surrogates, which Python uses for undecodable bytes (``surrogateescape``) and
JSON allows as ``"\\ud800"`` escapes -- is refused with one line naming where
the first bad character is; nothing is guessed or silently replaced, so what
the loom records is what the user sent.
"""

from __future__ import annotations

from cantrip._errors import IntentError


class TextError(ValueError):
    """Input that is not valid Unicode text; the message is one line for a user."""


def check_text(text: str, what: str = "the intent") -> str:
    """``text`` unchanged if it is valid Unicode (encodable as UTF-8), else :class:`TextError`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TextError(
            f"{what} is not valid UTF-8 text (an undecodable byte or lone surrogate at "
            f"character {exc.start}); send UTF-8"
        ) from None
    return text


EMPTY_INTENT = (
    'the intent is empty: give it after the spec file (cantrip cast SPEC "what to do") '
    'or on stdin (echo "what to do" | cantrip cast SPEC)'
)
"""What the command line says when there is nothing to cast: how to give an intent."""


def require_intent(intent: object) -> str:
    """The intent, or :class:`IntentError` (INTENT-1): every cast, child and queued
    spell needs one."""
    if not isinstance(intent, str) or not intent.strip():
        raise IntentError("intent is required: a cantrip cannot be cast without one (INTENT-1)")
    return intent


def require_cli_intent(text: str) -> str:
    """``text`` if it says something, else :class:`TextError` saying how to give one
    on the command line."""
    if not text.strip():
        raise TextError(EMPTY_INTENT)
    return text


def decode_input(data: bytes, what: str = "the intent") -> str:
    """Bytes a user piped in, decoded as UTF-8 (a leading BOM is dropped), or :class:`TextError`."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TextError(
            f"{what} is not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); convert it first, e.g. with iconv"
        ) from None
