"""Secret redaction for everything a person or a file sees (PROD-8).

Two sources of knowledge: the *shapes* of common credentials (OpenAI,
Anthropic, Google, GitHub, AWS, Slack keys, bearer tokens, ``api_key=...``
pairs) and the *actual values* of the environment variables configured to
hold provider keys (and of variables whose names say they hold a secret).
Log records of cantrip's loggers, every byte the front ends emit (CLI, ACP,
HTTP bodies and events) and loom exports pass through :func:`redact`. Every
record a loom store writes first loses the secret *values* the environment
holds (:func:`scrub_known`), so a loom file never keeps a key that a later
process, with other variables set, could not recognise (PROD-8).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

_SHAPES = (
    r"\bsk-(?:ant-|proj-|or-v1-)?[A-Za-z0-9_\-]{8,}",  # OpenAI, Anthropic, OpenRouter
    r"\bAIza[0-9A-Za-z_\-]{20,}",  # Google API keys
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"(?i:\bbearer\s+[A-Za-z0-9._~+/=\-]{12,})",
    r"(?i:\b(?:api[_-]?key|secret|token|password|passwd|aws_secret_access_key)"
    r"\s*[=:]\s*['\"]?[^\s'\",;\\]{6,})",
)
_PATTERN = re.compile("|".join(f"(?:{shape})" for shape in _SHAPES))
"""Every credential shape in one alternation: one scan of the text, not one per shape
(the loom scans every turn before it is recorded). A value stops at a backslash, so
redacting serialised JSON can never eat an escape."""

_ANCHORS = (
    *("sk-", "aiza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "akia", "asia"),
    *("xox", "bearer", "api", "secret", "token", "passw"),
)
"""The literal part of every shape, lower-cased: a match of :data:`_PATTERN` holds one."""
_ANCHOR = re.compile("|".join(re.escape(anchor) for anchor in _ANCHORS))
"""Any of :data:`_ANCHORS`, searched in lower-cased text: one C scan (which skips every
position no anchor starts with) instead of sixteen substring searches from a Python loop
-- half the instructions on the short text a span carries (issue 39.24). Without
``IGNORECASE``, which would make the scan try every position."""
_SHORTEST = 11
"""Characters of the shortest text :data:`_PATTERN` matches (``sk-`` and eight more):
shorter text holds no shape, and is not even lower-cased. Case-insensitive matching
equates one character with one, so the bound holds for any text (a test derives it from
the pattern). Most ids a span carries (a tool call's, ``call_12``) are this short."""
_FOLDS_TO_ASCII = "\u0130\u0131\u017f\u212a"
"""The non-ASCII letters that case-insensitive matching takes for an ASCII one (dotted
capital I, dotless i, long s, Kelvin sign): a text holding one is scanned in full."""


def _may_hold_shape(text: str) -> bool:
    """False only if ``text`` holds no credential shape: too short for one, or no shape's
    literal part in it, in any case. The pattern's scan tries every alternative at every
    position (0.7 s for a 1 MiB tool result, on every export and every answer that
    carries it); this check is a lower-casing and one literal search (a few ms)."""
    if len(text) < _SHORTEST:
        return False
    if not text.isascii() and any(letter in text for letter in _FOLDS_TO_ASCII):
        return True
    return _ANCHOR.search(text.lower()) is not None


KEY_ENV_VARS: set[str] = {
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "OPENROUTER_API_KEY",
    "CANTRIP_TOKEN",
}
"""Variables whose values are secrets; providers add the ones they read, and every
provider config loaded adds the variable it names (``api_key_env``)."""

_SECRET_NAME = re.compile(r"(?i)(?:API_?KEY|_KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$")
"""Names that say "this variable holds a secret" (``MY_PROVIDER_KEY``, ``GITHUB_TOKEN``):
their values are redacted even when no loaded config names them, so a process that
never saw the spec (a later ``cantrip loom export``) still catches them."""
_MIN_GUESSED = 8
"""A value found only by its variable's name must be this long (no redacting ``1``)."""


def register_secret_env(*names: str) -> None:
    KEY_ENV_VARS.update(names)


_ENVIRON = os.environ
_ENVIRON_DATA: Any = getattr(_ENVIRON, "_data", None)
"""The process's environment and the dict behind it (CPython keeps one for the process's
life, and every write to ``os.environ`` lands in it), found once: looking it up at every
check cost a ``getattr`` and an ``isinstance`` a span (issue 39.24)."""
if not isinstance(_ENVIRON_DATA, dict):  # pragma: no cover - not CPython's os.environ
    _ENVIRON_DATA = None

_cache_env: dict[Any, Any] = {}
_cache_set: set[str] = set()
_cache_len = -1
_cache_values: list[str] = []


def _env_secrets() -> list[str]:
    """The secret values, cached against a copy of the environment: the loom asks before
    every turn it records and a span's every redaction asks, and decoding every variable
    each time would cost more than the turn. The check is one dict comparison in C
    (keys and values, so a value replaced in place is seen); it used to build a tuple of
    every variable first, which cost three times as much (issue 39.24).

    The same list object is returned while nothing changed, so a caller may remember
    what it redacted against it (:class:`RedactionMemo`)."""
    global _cache_env, _cache_set, _cache_len, _cache_values
    environ = os.environ
    data: Any = _ENVIRON_DATA if environ is _ENVIRON else None
    if data is None:  # another mapping in its place (a test's patch), or not CPython's
        data = getattr(environ, "_data", None)
        if not isinstance(data, dict):
            data = dict(environ)
    if _cache_env == data and _cache_set is KEY_ENV_VARS and _cache_len == len(KEY_ENV_VARS):
        return _cache_values
    found: set[str] = set()
    for name, value in os.environ.items():
        value = value.strip()
        if not value:
            continue
        if name in KEY_ENV_VARS:
            if len(value) >= 6:
                found.add(value)
        elif len(value) >= _MIN_GUESSED and _SECRET_NAME.search(name):
            found.add(value)
    # Longest first, so a secret that contains another is replaced whole.
    _cache_values = sorted(found, key=len, reverse=True)
    _cache_env, _cache_set, _cache_len = dict(data), KEY_ENV_VARS, len(KEY_ENV_VARS)
    return _cache_values


def secret_values() -> list[str]:
    """The secret values the environment holds right now (see :data:`KEY_ENV_VARS`)."""
    return _env_secrets()


def redact(text: str) -> str:
    """``text`` with every recognisable secret replaced by ``[REDACTED]``."""
    return _redact_with(text, _env_secrets())


def _redact_with(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    if len(text) < _SHORTEST:  # the bound checked here too: no call for a short id
        return text
    return _PATTERN.sub(REDACTED, text) if _may_hold_shape(text) else text


class RedactionMemo:
    """:func:`redact` for text that repeats: each distinct short text is redacted once
    against the environment's secrets as they stand, and its answer remembered until
    they change.

    A trace's span names and most attribute values recur every turn (``chat``, the model,
    the provider, a gate's name and status): redacting each afresh cost every traced turn
    fourteen environment checks and shape pre-checks (issue 39.24). What is remembered is
    the redactor's own answer for exactly that text, so nothing is let through that
    :func:`redact` would change: :meth:`known` checks the environment first, and any
    change (a variable set or removed, a value replaced in place, a secret variable
    registered) forgets everything remembered before the next text is looked up."""

    LIMIT = 4096
    """Texts remembered; when full, the memo starts over (values that are new every turn,
    tool call ids, would otherwise crowd out the ones that repeat)."""
    LONGEST = 256
    """Longer text (captured content, an error message) is redacted each time, never kept."""

    def __init__(self) -> None:
        self._secrets: list[str] = []
        self._known: dict[str, str] = {}
        self.known()

    def known(self) -> dict[str, str]:
        """What is remembered, as text -> redacted text, for the environment as it is now:
        checked once here, for all the texts of one call (a span's name and attributes).
        A text not in it goes to :meth:`learn`. (A dict, not a function: looking a text up
        is no Python call, and a trace looks up fourteen a turn.)"""
        secrets = _env_secrets()
        if secrets is not self._secrets:
            self._secrets, self._known = secrets, {}
        return self._known

    def learn(self, text: str) -> str:
        """``text`` redacted against the secrets :meth:`known` last saw, and remembered
        if it is short."""
        cleaned = _redact_with(text, self._secrets)
        if len(text) <= self.LONGEST:
            known = self._known
            if len(known) >= self.LIMIT:
                known.clear()
            known[text] = cleaned
        return cleaned

    def redact(self, text: str) -> str:
        """One text: :func:`redact`'s answer, from the memo when it holds one."""
        cleaned = self.known().get(text)
        return self.learn(text) if cleaned is None else cleaned


def scrub_known(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON-like data) with every string's known secret values replaced.

    What the loom applies before it records anything: the *values* the
    environment holds (exact, cheap, no false positives), not the shapes --
    those are redacted on the way out (exports, front ends), where a false
    positive costs a display, not the record."""
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: scrub_known(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_known(v, secrets) for v in value]
    return value


def redact_value(value: Any) -> Any:
    """Redact every string inside JSON-like data.

    The environment's secrets are looked up once for the whole value, not per
    string (a turn's record holds dozens; each lookup snapshots the environment)."""
    return _redact_tree(value, _env_secrets())


def _redact_tree(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return _redact_with(value, secrets)
    if isinstance(value, dict):
        return {k: _redact_tree(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_tree(v, secrets) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Rewrites a record with secrets redacted before any handler sees it: the
    message, and the traceback and stack text a formatter would append."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            # Formatters reuse exc_text when it is set, so the raw traceback is never shown.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def get_logger(name: str) -> logging.Logger:
    """A cantrip logger whose records are redacted at the source."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
    return logger
