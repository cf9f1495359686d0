"""Checks an expectation delegates: an LLM's queries, usage, the error, a thread's steps.

Each takes the values to check and where they are (for the message), and
raises :class:`~cantrip.conformance._matchers.Mismatch` when they do not hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from cantrip.conformance._matchers import Mismatch, check_value, require_keys
from cantrip.llm._contract import Message, Query
from cantrip.loom._model import Turn
from cantrip.loom._view import logical_turns

# -- an LLM's queries -----------------------------------------------------------


def _message_text(message: Message) -> str:
    return message.text()


def check_query(query: Query, expected: Mapping[str, Any], where: str) -> None:
    messages = list(query.messages)
    require_keys(
        expected,
        (
            "messages",
            "message_count",
            "first_message",
            "messages_include",
            "messages_exclude",
            "message_count_includes",
            "message_count_excludes",
        ),
        where,
    )
    if "messages" in expected:
        wanted = expected["messages"]
        if len(wanted) != len(messages):
            raise Mismatch(f"{where}.messages: expected {len(wanted)}, got {len(messages)}")
        for index, (message, spec) in enumerate(zip(messages, wanted, strict=True)):
            _check_message(message, spec, f"{where}.messages[{index}]")
    if "message_count" in expected:
        check_value(len(messages), expected["message_count"], f"{where}.message_count")
    if "first_message" in expected:
        if not messages:
            raise Mismatch(f"{where}.first_message: no messages")
        _check_message(messages[0], expected["first_message"], f"{where}.first_message")
    if "messages_include" in expected:
        wanted_text = str(expected["messages_include"])
        if not any(wanted_text in _message_text(m) for m in messages):
            raise Mismatch(f"{where}.messages_include: no message contains {wanted_text!r}")
    if "messages_exclude" in expected:
        wanted_text = str(expected["messages_exclude"])
        if any(wanted_text in _message_text(m) for m in messages):
            raise Mismatch(f"{where}.messages_exclude: a message contains {wanted_text!r}")
    for key, default in (("message_count_includes", "at_least(1)"), ("message_count_excludes", 0)):
        if key in expected:
            _check_message_count(messages, expected[key], default, f"{where}.{key}")


def _check_message_count(messages: Sequence[Message], spec: Any, default: Any, where: str) -> None:
    """How many messages contain a text: ``"X"`` (at least one for ``_includes``,
    none for ``_excludes``) or ``{text: "X", count: n}`` (exactly that many, or any
    matcher such as ``at_least(2)``)."""
    if isinstance(spec, Mapping):
        require_keys(spec, ("text", "count"), where)
        if "text" not in spec or "count" not in spec:
            raise Mismatch(f"{where}: the mapping form needs both text and count")
        text, wanted = str(spec["text"]), spec["count"]
    else:
        text, wanted = str(spec), default
    count = sum(1 for m in messages if text in _message_text(m))
    check_value(count, wanted, f"{where} (messages containing {text!r})")


def _check_message(message: Message, spec: Mapping[str, Any], where: str) -> None:
    require_keys(spec, ("role", "content"), where)
    for field, wanted in spec.items():
        check_value(getattr(message, field), wanted, f"{where}.{field}")


def check_stateless(queries: Sequence[Query], where: str) -> None:
    """An LLM without memory must be sent the whole context every time (LLM-1)."""
    if len(queries) < 2:
        raise Mismatch(
            f"{where}: the llm is declared stateless, but with {len(queries)} queries "
            "there is no resent context to check"
        )
    for index in range(1, len(queries)):
        before, now = list(queries[index - 1].messages), list(queries[index].messages)
        if len(now) <= len(before) or now[: len(before)] != before:
            raise Mismatch(f"{where}[{index}]: the query did not resend the full prior context")


# -- usage ----------------------------------------------------------------------


def check_usage(usage: Mapping[str, int], value: Any, where: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise Mismatch(f"{where} takes a mapping of usage fields, not {value!r}")
    for field, expected in value.items():
        if field not in usage:
            raise Mismatch(f"{where}: unknown usage field {field!r}")
        check_value(usage[field], expected, f"{where}.{field}")


# -- errors ---------------------------------------------------------------------


def check_error(error: BaseException | None, spec: Any) -> None:
    """``error:`` -- the case's action raised a :class:`CantripError`.

    The string form names a phrase the message must contain as whole words
    (case-insensitive): ``"intent"`` matches "intent is required" but not
    "intents". The mapping form ``{kind, message}`` also pins the error's kind,
    the exact class name (``IntentError``, ``ConstructionError``, ...), so a
    different failure that happens to mention the same words fails the case.
    """
    if isinstance(spec, Mapping):
        require_keys(spec, ("kind", "message"), "error")
        if "kind" not in spec and "message" not in spec:
            raise Mismatch("error: the mapping form needs kind, message or both")
        kind, phrase = spec.get("kind"), spec.get("message")
    else:
        kind, phrase = None, spec
    described = f"kind {kind!r}" if kind is not None else ""
    if phrase is not None:
        described += (" and " if described else "") + f"a message containing {str(phrase)!r}"
    if error is None:
        raise Mismatch(f"expected an error ({described}), but none was raised")
    got = f"{type(error).__name__}: {error}"
    if kind is not None and type(error).__name__ != str(kind):
        raise Mismatch(f"error: expected kind {kind!r}, got {got}")
    if phrase is not None and not _contains_phrase(str(error), str(phrase)):
        raise Mismatch(f"error: expected a message containing {str(phrase)!r}, got {got}")


def _contains_phrase(text: str, phrase: str) -> bool:
    """``phrase`` occurs in ``text`` as whole words (case-insensitive)."""
    if not phrase.strip():
        return False
    pattern = r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


# -- threads as steps -----------------------------------------------------------

_STEP_KEYS = ("role", "content", "content_contains", "gate_calls", "is_error")


def rendered_steps(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """A thread as the alternating steps it is made of, read from the recorded turns.

    Each logical turn (delegation pieces merged) contributes an ``entity`` step
    when the entity said anything (text, tool calls or code) and a ``circle``
    step when the circle answered (an observation, gate calls, or the verdict
    that ended the thread). A turn missing either shows as two steps of the same
    role in a row.
    """
    steps: list[dict[str, Any]] = []
    for turn in logical_turns(turns):
        if turn.utterance or turn.tool_calls or turn.content:
            steps.append(
                {
                    "role": "entity",
                    "content": turn.utterance,
                    "gate_calls": [r.gate for r in turn.gate_calls],
                }
            )
        if turn.observation or turn.gate_calls or turn.terminated or turn.truncated:
            steps.append(
                {
                    "role": "circle",
                    "content": turn.observation,
                    "gate_calls": [r.gate for r in turn.gate_calls],
                    "is_error": turn.is_error,
                }
            )
    return steps


def check_thread_steps(steps: Sequence[Mapping[str, Any]], expected: list[Any], where: str) -> None:
    """The list form of ``thread:``: the steps must alternate, there must be exactly
    as many as listed, and every key given for a step must match it."""
    for index in range(1, len(steps)):
        if steps[index]["role"] == steps[index - 1]["role"]:
            raise Mismatch(f"{where}: two {steps[index]['role']} steps in a row at step {index}")
    if len(expected) != len(steps):
        roles = [s["role"] for s in steps]
        raise Mismatch(f"{where}: expected {len(expected)} steps, the thread has {roles}")
    for index, (step, wanted) in enumerate(zip(steps, expected, strict=True)):
        at = f"{where}[{index}]"
        if not isinstance(wanted, Mapping):
            raise Mismatch(f"{at}: a step is a mapping such as {{role: entity}}, not {wanted!r}")
        require_keys(wanted, _STEP_KEYS, at)
        for field, value in wanted.items():
            if field == "content_contains":
                if str(value) not in step["content"]:
                    raise Mismatch(f"{at}.content_contains: {value!r} not in {step['content']!r}")
            elif field not in step:
                raise Mismatch(f"{at}.{field}: a {step['role']} step has no {field}")
            else:
                check_value(step[field], value, f"{at}.{field}")
