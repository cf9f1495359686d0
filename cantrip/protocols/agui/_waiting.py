"""Where a run left a prompt that waits on a sub-agent's pause in place (SPEC AGUI-6).

A ``call_agent`` child waits for its answer inside its parent's delegation call, so its
prompt goes on while the AG-UI run ends with the interrupt. The run that resumes that
interrupt must follow the same prompt from the pause on, with the sub-agents in flight
announced again as they were: this module remembers that, keyed by session and pause,
in this process (the waiting prompt lives here: only the in-process server tells
sub-agents, AGUI-9), bounded (:data:`MAX_WAITING`)."""

from __future__ import annotations

import attrs

from cantrip._approval import Pause
from cantrip.protocols.agui._translate import Suspension
from cantrip.protocols.sessions import EventId


@attrs.frozen
class Waiting:
    """A run ended at pauses its prompt waits on in place (a sub-agent's): the prompt
    goes on, and the run that resumes one of them follows it from here."""

    pauses: tuple[Pause, ...]
    prompt_id: str
    after: EventId
    """The pause's event in the prompt's stream: the resume tells what comes after."""
    told: frozenset[str]
    """The turns (and pauses) the prompt's runs told up to here."""
    suspension: Suspension = attrs.field(factory=Suspension)
    """The sub-agents in flight, to be announced again as they were."""


MAX_WAITING = 1000
"""Interrupts of pauses a prompt waits on in place that this process remembers (the
oldest go first; one resumed, or found closed, is forgotten at once)."""

_WAITING: dict[str, Waiting] = {}
"""``<session>/<pause id>`` -> where the run that ended at it left its prompt."""


def remember(session_id: str, waiting: Waiting) -> None:
    """``waiting`` is what a resume of any of its pauses follows (told before the
    interrupt goes out: a client may resume it at once)."""
    for pause in waiting.pauses:
        key = f"{session_id}/{pause.pause_id}"
        _WAITING.pop(key, None)  # a run told again remembers it anew: newest last
        _WAITING[key] = waiting
    while len(_WAITING) > MAX_WAITING:
        del _WAITING[next(iter(_WAITING))]


def take(session_id: str, pause_id: str) -> Waiting | None:
    """What a resume of ``pause_id`` follows, forgotten as it is taken (a pause is
    answered once); None if no run of this process ended at it."""
    return _WAITING.pop(f"{session_id}/{pause_id}", None)
