"""Gates a front end runs itself (an AG-UI client's tools): the model may call them,
and the call waits for the front end's result.

Such a gate never runs here. A call pauses like an ``ask_user`` question (the same
checkpoint in the loom, see :mod:`cantrip._approval`); the front end runs the tool
and answers the pause with the tool's result, which becomes the call's observation.
A queued cast carries the definitions under :data:`CLIENT_TOOLS_KEY` of its spell,
so the worker that runs it offers the same gates (:meth:`Entity.offer`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic

from cantrip._errors import ConstructionError
from cantrip._gate import Gate, GateError

CLIENT_TOOLS_KEY = "client_tools"
"""Where a queued spell carries the client's tool definitions."""

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A client tool's name: what every provider takes as a tool name."""


class _Passed(pydantic.BaseModel):
    """The arguments go to the client as the model wrote them: the tool's JSON Schema
    is the client's to enforce, as an MCP tool's is its server's."""

    model_config = pydantic.ConfigDict(extra="allow")


async def _runs_at_the_client(**_: Any) -> str:
    raise GateError("this tool runs at the client; its result comes with the client's answer")


def client_gate(name: str, description: str, parameters: Any) -> Gate:
    """One tool the client runs, as a gate whose call waits for the client's result."""
    if not TOOL_NAME.fullmatch(name):
        raise ConstructionError(
            f"tool name {name[:80]!r} is not 1 to 64 letters, digits, '_' or '-'"
        )
    schema = dict(parameters) if isinstance(parameters, Mapping) else {}
    return Gate(
        name=name,
        fn=_runs_at_the_client,
        description=description,
        args_model=_Passed,
        parameters={"type": "object", **schema},
        asks_user=True,
    )


def client_gates(tools: Iterable[Mapping[str, Any]]) -> tuple[Gate, ...]:
    """Tool definitions (``name``, ``description``, ``parameters``) as gates; a name
    given twice is refused."""
    gates: dict[str, Gate] = {}  # by name: a repeat is found in one look, not a scan
    for tool in tools:
        gate = client_gate(
            str(tool.get("name", "")), str(tool.get("description", "")), tool.get("parameters")
        )
        if gate.name in gates:
            raise ConstructionError(f"tool {gate.name!r} is listed twice")
        gates[gate.name] = gate
    return tuple(gates.values())
