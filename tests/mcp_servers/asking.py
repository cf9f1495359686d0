"""An MCP server that asks the user during its calls (elicitation), written with the
official SDK. Run as ``python asking.py`` (stdio) or ``python asking.py --legacy``.

The SDK picks the way to ask from the protocol version the client negotiated: at
2026-07-28 a call answers ``InputRequiredResult`` and the client retries it with the
answers (multi round-trip requests); up to 2025-11-25 the server sends
``elicitation/create`` to the client in the middle of the call. ``--legacy`` takes
away ``server/discover``, so a client falls back to the initialize handshake
(2025-11-25) and the second way is the one used. Each outcome is appended to
``$ASKING_MARKS`` so a test sees what the server received.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    DeclinedElicitation,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from pydantic import BaseModel, create_model

server = MCPServer("asking", version="1.0", log_level="WARNING")
MARKS = Path(os.environ.get("ASKING_MARKS", os.devnull))


def _mark(line: str) -> None:
    if str(MARKS) != os.devnull:
        with MARKS.open("a") as f:
            f.write(line + "\n")


class Seats(BaseModel):
    seats: int


def ask_seats(city: str) -> Elicit[Seats]:
    return Elicit(f"How many seats in {city}?", Seats)


@server.tool()
async def book(
    city: str,
    seats: Annotated[ElicitationResult[Seats], Resolve(ask_seats)],
    ctx: Context,
) -> str:
    """Book seats in a city; asks the user how many."""
    _mark(f"version {ctx.protocol_version}")
    if isinstance(seats, AcceptedElicitation):
        _mark(f"accept {seats.data.seats}")
        return f"booked {seats.data.seats} seats in {city}"
    action = "decline" if isinstance(seats, DeclinedElicitation) else "cancel"
    _mark(action)
    return f"no booking in {city} ({action})"


class ConfirmForm(BaseModel):
    ok: bool


def ask_confirm(what: str) -> Elicit[ConfirmForm]:
    return Elicit(f"Really {what}?", ConfirmForm)


@server.tool()
async def confirm(
    what: str, answer: Annotated[ElicitationResult[ConfirmForm], Resolve(ask_confirm)]
) -> str:
    """Asks for a yes/no confirmation."""
    if isinstance(answer, AcceptedElicitation):
        _mark(f"confirm {answer.data.ok}")
        return f"{what}: {'yes' if answer.data.ok else 'no'}"
    action = "decline" if isinstance(answer, DeclinedElicitation) else "cancel"
    _mark(f"confirm {action}")
    return f"{what}: {action}"


Huge = create_model("Huge", **{f"field_{i:04d}": (bool, ...) for i in range(2500)})


def ask_huge() -> Elicit[BaseModel]:
    return Elicit("Fill in this very long form", Huge)


@server.tool()
async def survey(answer: Annotated[ElicitationResult[BaseModel], Resolve(ask_huge)]) -> str:
    """Asks a form far too large to be one."""
    action = (
        "accept"
        if isinstance(answer, AcceptedElicitation)
        else "decline"
        if isinstance(answer, DeclinedElicitation)
        else "cancel"
    )
    _mark(f"survey {action}")
    return action


if __name__ == "__main__":
    if "--legacy" in sys.argv[1:]:
        # A server of the 2025-11-25 era: no request opens a 2026-07-28 connection, so
        # a client's server/discover probe fails and it falls back to initialize.
        from mcp.server import runner

        runner._has_modern_envelope = lambda params: False
    server.run()
