"""What every code medium shares: presentation, argument mapping, the viewport, and
the limits of a sandbox (the ``max_eval_ms`` and ``max_memory_mb`` ward kinds).

A code medium shows the LLM exactly one tool (its language), whose
description documents the circle's gates as host functions; ``tool_choice``
is ``required``. Inside the sandbox a gate is an ordinary synchronous
function. Positional arguments map onto the gate's parameters in order; a
single object whose keys are all parameter names is taken as keyword
arguments (``call_agent({intent: ...})``).

Results are shown viewport-style (spec 4.6): short values verbatim, long ones
as size, type and a preview, so the entity works with data through code
instead of reading dumps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from cantrip.medium import (
    Gate,
    GateCallRecord,
    Message,
    Response,
    ToolCall,
    ToolDefinition,
    Turn,
    WardKind,
    WardSet,
    history_view,
    register_ward_kind,
    render_code_observation,
    running_entity,
    to_loom_value,
)
from cantrip.medium import preview as value_preview
from mediums.base import Execution, GateHost, cut_off, visible_result

log = logging.getLogger("cantrip.medium")

PROSE_IN_CODE = (
    "the code medium received prose, not code: it ends the cast as the answer, unrun. "
    "Code runs when the LLM calls the code tool -- in a scripted LLM, write it as "
    'code = "..." (not content = "...")'
)
"""Said when a code medium's LLM answers in text: a spec whose script puts code under
``content`` would otherwise return the code, silently, as the answer."""

VIEWPORT_CHARS = 500
PREVIEW_CHARS = 150

MAX_EVAL_MS = register_ward_kind(
    WardKind("max_eval_ms", "min", doc="milliseconds one code call may run (code mediums)")
)
MAX_MEMORY_MB = register_ward_kind(
    WardKind("max_memory_mb", "min", doc="heap megabytes of a code sandbox (code mediums)")
)


def ward_limit(own: int, wards: WardSet, kind: str) -> int:
    """A medium's limit, or the circle's ward of ``kind`` where that is lower (wards of
    the ``min`` kinds only tighten; an absent or zero ward leaves the medium's)."""
    return int(min(own, wards.get(kind) or own))


@attrs.frozen
class SandboxMedium:
    """The limits of a sandboxed code medium (JavaScript, Python): the time one code
    call may run and the sandbox's heap, each tightened by the circle's wards.

    A subclass's own fields follow these two, so its positional order is
    ``max_eval_ms, max_memory_mb, ...``."""

    max_eval_ms: int = 5000
    max_memory_mb: int = 64

    def ward_kinds(self) -> Sequence[WardKind]:
        return (MAX_EVAL_MS, MAX_MEMORY_MB)

    def limits(self, wards: WardSet) -> tuple[int, int]:
        """(milliseconds a code call may run, heap megabytes) of a session under ``wards``."""
        return (
            ward_limit(self.max_eval_ms, wards, "max_eval_ms"),
            ward_limit(self.max_memory_mb, wards, "max_memory_mb"),
        )

    def render_observation(self, turn: Turn) -> list[Message]:
        return render_code_observation(turn)


def code_tool(language: str, tool_name: str, gates: Sequence[Gate], notes: str) -> ToolDefinition:
    """The single tool of a code medium, documenting the host functions."""
    lines = [
        f"Run {language} code in a persistent sandbox. Variables and functions you define "
        "persist between calls. The last expression's value, console output and every host "
        "function call are returned to you; long values are summarised.",
        "",
        "Host functions (synchronous; a failure raises an error you can catch):",
    ]
    for g in gates:
        params = ", ".join((g.parameters.get("properties") or {}).keys())
        names = " / ".join((g.name, *g.aliases))
        summary = g.description.splitlines()[0] if g.description else ""
        lines.append(f"- {names}({params}): {summary}")
    if notes:
        lines += ["", notes]
    return ToolDefinition(
        name=tool_name,
        description="\n".join(lines),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": f"{language} source"}},
            "required": ["code"],
        },
    )


def map_arguments(gate: Gate, args: Sequence[Any]) -> dict[str, Any]:
    """Positional host-call arguments as the gate's keyword arguments."""
    names = list((gate.parameters.get("properties") or {}).keys())
    if len(args) == 1 and isinstance(args[0], Mapping) and len(names) > 1:
        keys = set(args[0])
        if keys and keys <= set(names):
            return dict(args[0])
    if len(args) > len(names):
        extra = len(args) - len(names)
        raise TypeError(
            f"{gate.name}() takes {len(names)} argument(s) ({', '.join(names)}); "
            f"{extra} too many given"
        )
    return dict(zip(names, args, strict=False))


def boundary_arguments(gate: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A gate call's arguments from the sandbox in the loom's value model (the value
    boundary, :mod:`cantrip._values`); :class:`ValueBoundaryError` names the argument."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        kind = type(value)
        if (kind is str or kind is int or kind is bool or value is None) and type(key) is str:
            out[key] = value  # the common case, on every gate call: nothing to convert
        else:
            out[str(key)] = to_loom_value(value, f"{gate}() argument {str(key)!r}")
    return out


def refused_arguments(args: Any) -> dict[str, Any]:
    """What a gate-call record keeps of arguments the boundary refused: a bounded preview."""
    return {"refused": value_preview(args)}


def viewport(kind: str, value: Any) -> str:
    """A value as the entity sees it: verbatim when short, summarised when long."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, RecursionError):  # what sandboxed code built: anything
            text = value_preview(value)
    if len(text) <= VIEWPORT_CHARS:
        return text if kind != "string" else json.dumps(text, ensure_ascii=False)
    preview = text[:PREVIEW_CHARS].replace("\n", "\\n")
    size = f"{len(value)} items, " if isinstance(value, list | dict) else ""
    return f"[Result: {kind}, {size}{len(text)} chars] {preview!r}..."


def call_line(record: GateCallRecord) -> str:
    args = record.arguments
    if len(args) > VIEWPORT_CHARS:  # the entity wrote them; echo a preview, not a dump
        args = f"[{len(args)} chars] {args[:PREVIEW_CHARS]!r}..."
    status = "" if record.status == "ok" else f" [{record.status}]"
    return f"{record.gate}({args}) -> {viewport('value', visible_result(record))}{status}"


def observation_text(
    *,
    records: Sequence[GateCallRecord],
    console: Sequence[str],
    console_truncated: bool | int = False,
    kind: str = "undefined",
    value: Any = None,
    error: str | None = None,
    notice: str | None = None,
) -> str:
    """The composite observation of one code execution."""
    parts: list[str] = []
    if notice:
        parts.append(notice)
    if console:
        parts.append("console:\n" + "\n".join(console) + _console_marker(console_truncated))
    if records:
        parts.append("host calls:\n" + "\n".join(call_line(r) for r in records))
    if error:
        parts.append(f"error: {error}")
    elif kind != "undefined":
        parts.append(f"result: {viewport(kind, value)}")
    return "\n".join(parts) if parts else "(no output)"


def _console_marker(cut: bool | int) -> str:
    """What says that console output was cut, and how much when the medium knows."""
    if cut is True:
        return "\n[output truncated]"
    if cut:
        return f"\n[output truncated: {cut} more characters not shown]"
    return ""


SKIPPED_AFTER_DONE = "skipped: done was already called"


@attrs.frozen
class CodeRun:
    """What one code call did, as a medium reports it to :func:`execute_code_calls`."""

    text: str
    records: tuple[GateCallRecord, ...] = ()
    terminated: bool = False
    value: Any = None
    error: str | None = None


async def execute_code_calls(
    response: Response,
    host: GateHost,
    run: Callable[[ToolCall, GateHost], Awaitable[CodeRun]],
    *,
    lost_state: Callable[[], bool] | None = None,
) -> Execution:
    """One utterance of a code medium: its code calls in order, through ``run``.

    After a call ends with ``done`` the remaining calls are completed as
    ``skipped`` (LOOP-3). With ``lost_state`` (mediums that replay, LOOM-13) the
    extras also record how many gate calls each code call made and after which
    calls the sandbox was lost.
    """
    if not response.tool_calls:
        if (response.content or "").strip():
            log.warning(PROSE_IN_CODE)
        return Execution(text_only=True)
    records: list[GateCallRecord] = []
    observations: list[str] = []
    errors: list[str] = []
    counts: list[int] = []
    resets: list[int] = []
    terminated = False
    result: Any = None
    for index, call in enumerate(response.tool_calls):
        if terminated:
            records.append(
                host.unexecuted(call.name, call.arguments, call.id, "skipped", SKIPPED_AFTER_DONE)
            )
            observations.append(SKIPPED_AFTER_DONE)
            counts.append(1)
            continue
        if call.cut_off:
            message = cut_off(call)
            records.append(host.unexecuted(call.name, call.arguments, call.id, "error", message))
            observations.append(message)
            errors.append(message)
            counts.append(1)
            continue
        outcome = await run(call, host)
        records.extend(outcome.records)
        observations.append(outcome.text)
        counts.append(len(outcome.records))
        if lost_state is not None and lost_state():
            resets.append(index)
        if outcome.error:
            errors.append(outcome.error)
        if outcome.terminated:
            terminated, result = True, outcome.value
    if lost_state is None:
        counts, resets = [], []
    return Execution(
        gate_calls=tuple(records),
        terminated=terminated,
        result=result,
        observation="\n\n".join(observations),
        extras=code_extras(observations, errors, host_calls=counts, resets=resets),
    )


def code_extras(
    observations: Sequence[str],
    errors: Sequence[str],
    *,
    host_calls: Sequence[int] = (),
    resets: Sequence[int] = (),
) -> dict[str, Any]:
    """Per-call observation texts, and the code's own errors: they make the turn
    an error turn (``Turn.is_error``) even when no gate failed.

    For replay (LOOM-4/13): ``host_calls`` is how many of the turn's gate-call
    records each code call produced, ``resets`` the indexes of code calls after
    which the sandbox was discarded (time limit, a killed worker) -- replay
    resets the sandbox there instead of running that code again.
    """
    extras: dict[str, Any] = {"observations": list(observations)}
    if errors:
        extras["error"] = "; ".join(errors)
    if host_calls:
        extras["host_calls"] = list(host_calls)
    if resets:
        extras["sandbox_resets"] = list(resets)
    return extras


LOOM_NAME = "loom"
"""The name of the read-only loom object inside a code sandbox (LOOM-11)."""

LOOM_DOC = (
    "A read-only `loom` object holds your own history: loom.turns (also "
    "loom.thread()) lists your earlier turns, oldest first, each with sequence, intent, "
    "utterance, observation, gate_calls (gate, args, result, is_error, status), terminated, "
    "truncated, reason, result and reward; loom.turn(n) is the turn with sequence n. Use it "
    "to look back at work that has left your context."
)

HistorySource = Callable[[], list[dict[str, Any]]]


def history_source(host: GateHost) -> HistorySource:
    """Where a code call's ``loom`` object reads from, fixed when the call starts.

    A replaying host supplies the history as it stood when the replayed code
    first ran; otherwise it is the thread of the entity whose turn is running
    (its lineage up to its latest recorded turn), read lazily and redacted.
    Resolved on the trio side, so the returned function may run in a thread.
    """
    own = getattr(host, "history", None)
    if callable(own):
        source: HistorySource = own
        return source
    entity = running_entity()
    if entity is None:
        return list
    loom, leaf, entity_id = entity.loom, entity.leaf, entity.id

    def read() -> list[dict[str, Any]]:
        if leaf is None or leaf == loom.entity(entity_id).spawned_from:
            return []  # a child before its first turn: its parent's turns are not its own
        return history_view(loom.lineage(leaf), loom.reward)

    return read
