"""Guardrails: checks on what goes in and out of an entity (issue 43).

A circle's guardrails (``Circle(..., guardrails=[...])`` or ``[[circle.guardrails]]``)
check the intent and each steering message (``input``), the final answer
(``output``), a gate call's arguments before it runs or a human is asked
(``call``), and a gate's result before the model sees it (``result``). A check
passes, rewrites the value (:class:`Rewrite`) or trips (:class:`Trip`): a trip ends
the cast with reason ``guardrail`` and the loom records which check, on what, and
why. See docs/how-to/guardrails.md.
"""

from cantrip.guardrails._builtins import denylist, json_schema, length, regex, secrets
from cantrip.guardrails._classifier import classifier
from cantrip.guardrails._model import (
    CheckContext,
    Guardrail,
    GuardrailError,
    Rewrite,
    Trip,
    Where,
    guardrail,
)
from cantrip.guardrails._run import Guard, Tripped

__all__ = [
    "CheckContext",
    "Guard",
    "Guardrail",
    "GuardrailError",
    "Rewrite",
    "Trip",
    "Tripped",
    "Where",
    "classifier",
    "denylist",
    "guardrail",
    "json_schema",
    "length",
    "regex",
    "secrets",
]
