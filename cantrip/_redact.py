"""Secret redaction for everything a person or a file sees (PROD-8).

Two sources of knowledge: the *shapes* of common credentials (OpenAI,
Anthropic, Google, GitHub, AWS, Slack keys, bearer tokens, ``api_key=...``
pairs) and the *actual values* of the environment variables configured to
hold provider keys. Log records of cantrip's loggers, loom exports and the
CLI's output pass through :func:`redact` unless raw output is asked for
explicitly.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"\bsk-(?:ant-|proj-|or-v1-)?[A-Za-z0-9_\-]{8,}",  # OpenAI, Anthropic, OpenRouter
        r"\bAIza[0-9A-Za-z_\-]{20,}",  # Google API keys
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}",  # GitHub tokens
        r"\bgithub_pat_[A-Za-z0-9_]{20,}",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
        r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{12,}",
        r"(?i)\b(?:api[_-]?key|secret|token|password|passwd|aws_secret_access_key)"
        r"\s*[=:]\s*['\"]?[^\s'\",;]{6,}",
    )
)

KEY_ENV_VARS: set[str] = {
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "OPENROUTER_API_KEY",
}
"""Variables whose values are secrets; providers add the ones they read."""


def register_secret_env(*names: str) -> None:
    KEY_ENV_VARS.update(names)


def _env_secrets() -> Iterable[str]:
    for name in KEY_ENV_VARS:
        value = os.environ.get(name)
        if value and len(value) >= 6:
            yield value


def redact(text: str) -> str:
    """``text`` with every recognisable secret replaced by ``[REDACTED]``."""
    for secret in _env_secrets():
        text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact_value(value: Any) -> Any:
    """Redact every string inside JSON-like data."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
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
