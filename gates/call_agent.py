"""``call_agent`` / ``call_agent_batch``: delegate to child entities (chapter 5).

Canonical names per D-002; ``call_entity`` / ``call_entity_batch`` are
accepted aliases. Both are ordinary gates: their failures are observations,
and at ``max_depth`` 0 the circle removes them (COMP-6). The work is done by
:mod:`cantrip.delegation`.
"""

from __future__ import annotations

from typing import Any

from cantrip import GateResult, gate
from cantrip.delegation import delegate, delegate_batch_outcome


@gate(delegates=True, aliases=("call_entity",))
async def call_agent(
    intent: str,
    context: Any = None,
    gates: list[str] | None = None,
    wards: list[dict[str, Any]] | None = None,
    llm: str | None = None,
    identity: Any = None,
    medium: str | None = None,
) -> Any:
    """Delegate a sub-task to a child entity and wait for its answer.

    Only intent is required. gates: names for the child's circle; wards:
    e.g. [{"max_turns": 5}] (they can only tighten yours); llm / medium: by
    name; identity: a system prompt or an identity object.
    """
    request = {
        key: value
        for key, value in (
            ("intent", intent),
            ("context", context),
            ("gates", gates),
            ("wards", wards),
            ("llm", llm),
            ("identity", identity),
            ("medium", medium),
        )
        if value is not None
    }
    outcome = await delegate(request)
    if outcome.truncated:
        # Not a failure (SPEC.md "Resolutions of ambiguous test vectors"): the
        # summary is the result; the record says truncated.
        detail = {"truncated": True, "reason": outcome.reason, "child": outcome.entity_id}
        return GateResult(outcome.value, detail)
    return GateResult(outcome.value, {"child": outcome.entity_id})


@gate(delegates=True, aliases=("call_entity_batch",))
async def call_agent_batch(requests: list[dict[str, Any]]) -> Any:
    """Delegate several sub-tasks at once; children run concurrently.

    Each request has the fields of call_agent. Results come back in request
    order; a failed child's entry is {"error": message}.
    """
    outcome = await delegate_batch_outcome(requests)
    # The record names each child (as call_agent's does its one), in request order.
    return GateResult(list(outcome.values), outcome.detail)


DELEGATION_GATES = (call_agent, call_agent_batch)
