"""Guardrails at the gate-call boundary: ``call`` before a gate runs (and before a
human is asked to approve it), ``result`` before the model sees what it returned.

The turn host (:mod:`cantrip._core._host`) calls these only when the circle has
guardrails. A trip does not raise through the medium -- a code medium would turn an
exception into an observation and go on -- it is remembered on the host
(``host.tripped``): the call is recorded ``cancelled`` with the reason, every later
call of the same utterance is not run, and the loop ends the cast with reason
``guardrail`` when the utterance is done. A check that fails is remembered the same
way (``host.failed``) and raised by the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs

from cantrip._circle import Circle
from cantrip.guardrails._model import GuardrailError
from cantrip.guardrails._run import Guard, Tripped
from cantrip.llm._contract import plain_json
from cantrip.loom._model import GateCallRecord


class TurnHost(Protocol):
    """What these hooks use of the turn host (:class:`cantrip._core._host.TurnHost`,
    which imports this module)."""

    circle: Circle
    tripped: Tripped | None
    failed: GuardrailError | None


Go = Callable[[str, Mapping[str, Any], "str | None"], Awaitable[GateCallRecord]]


def stopped(
    host: TurnHost, name: str, args: Mapping[str, Any], call_id: str | None
) -> GateCallRecord:
    """A call after a trip (or a failed check) in the same utterance: not run."""
    if host.failed is not None:
        why = f"not run: {host.failed}"
    else:
        assert host.tripped is not None
        why = f"not run: guardrail {host.tripped.check!r} tripped earlier in this utterance"
    return host.circle.unexecuted(name, args, call_id, "cancelled", why)


async def guarded_call(
    host: TurnHost,
    guard: Guard,
    name: str,
    args: Mapping[str, Any],
    call_id: str | None,
    go: Go,
) -> GateCallRecord:
    """Check a call's arguments, then make it through ``go`` (the gatekeeper that may
    ask a human, or the gate itself)."""
    if host.tripped is not None or host.failed is not None:
        return stopped(host, name, args, call_id)
    gate = host.circle.gate(name)
    gate_name = gate.name if gate is not None else name
    try:
        checked = await guard.check("call", args, gate=gate_name)
    except GuardrailError as exc:
        host.failed = exc
        return stopped(host, name, args, call_id)
    if checked.tripped is not None:
        host.tripped = checked.tripped
        record = host.circle.unexecuted(
            name,
            args,
            call_id,
            "cancelled",
            f"blocked by guardrail {checked.tripped.check!r}: {checked.tripped.why}",
        )
        return attrs.evolve(record, detail={"guardrail": checked.tripped.note()})
    if checked.rewrote:
        rewritten: Any = checked.value  # a check may answer anything: checked here
        if not isinstance(rewritten, Mapping):
            host.failed = GuardrailError(
                checked.rewrote[-1], "call", "a call's arguments must be rewritten as an object"
            )
            return stopped(host, name, args, call_id)
        record = await go(name, rewritten, call_id)
        return attrs.evolve(record, detail={**record.detail, "rewritten_by": list(checked.rewrote)})
    return await go(name, args, call_id)


async def guarded_result(host: TurnHost, guard: Guard, record: GateCallRecord) -> GateCallRecord:
    """Check what a gate returned before the model sees it."""
    if record.status not in ("ok", "error"):
        return record
    try:
        checked = await guard.check("result", record.result, gate=record.gate)
    except GuardrailError as exc:
        host.failed = exc
        return attrs.evolve(record, result=f"withheld: {exc}", is_error=True, status="error")
    if checked.tripped is not None:
        host.tripped = checked.tripped
        note = {**checked.tripped.note(), "withheld": plain_json(record.result)}
        return attrs.evolve(
            record,
            result=f"withheld by guardrail {checked.tripped.check!r}: {checked.tripped.why}",
            is_error=True,
            status="error",
            detail={**record.detail, "guardrail": note},
        )
    if checked.rewrote:
        return attrs.evolve(
            record,
            result=checked.value,
            detail={**record.detail, "rewritten_by": list(checked.rewrote)},
        )
    return record


def host_trip(host: TurnHost | None) -> Tripped | None:
    return host.tripped if host is not None else None
