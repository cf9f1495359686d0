"""Cancelling a session's prompts: the running one at once, or one named before it
runs (by its id or Idempotency-Key), or the next to come (issue 29).

Apart from :mod:`cantrip.protocols.sessions._hub` because it is a job of its own:
deciding what a client's cancel targets -- running, waiting its turn, arriving,
ended, or armed for a key not seen yet -- reads and marks a session's state and
never starts, admits or runs a prompt. :class:`~cantrip.protocols.sessions._hub.SessionHub`
builds on it and sets the state declared here.
"""

from __future__ import annotations

from typing import Any

import trio

from cantrip.protocols.sessions._idempotency import key_index
from cantrip.protocols.sessions._session import MAX_ARMED_KEYS, Prompt, Session


class HubCancels:
    """The cancelling half of :class:`~cantrip.protocols.sessions._hub.SessionHub`."""

    sticky_cancel_s: float

    def cancel(self, session: Session, reason: str = "cancelled") -> bool:
        """Cancel the session's running prompt; returns whether one was running.

        The cast is cut off and recorded with ``reason``; the session stays."""
        if session.running is None:
            return False
        if not session.entity.cancel(reason):
            session.running.cancel()  # the cast had not started its loop yet
        return True

    def request_cancel(
        self,
        session: Session,
        *,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> dict[str, Any]:
        """A client's cancel; the answer says what it cut off (or will).

        Named (``prompt_id``, ``key``): that prompt, if it runs (``running``), waits its
        turn behind the running one (``queued``) or its request is arriving
        (``starting``): it ends as it would start, before its first LLM call, with
        nothing recorded (as on PostgreSQL: the client took it back). A key no
        prompt of this session has had yet is armed for
        ``sticky_cancel_s`` (``next``): the prompt that comes with that key is cut off
        -- a cancel may overtake its prompt. A named prompt that ended is cancelled no
        more (``ended``: the client reads its result; the session remembers its latest
        ``MAX_ENDED_PROMPTS`` ids and keys, and every key its loom records), an id this server
        does not know neither (``none``).

        Unnamed: the running (or arriving) prompt. With nothing running it cancels
        nothing (``none``) -- unless ``next_prompt``: then the next prompt to start
        within ``sticky_cancel_s`` is cut off (``Session.cancel_until``)."""
        named = prompt_id is not None or key is not None
        current = session.current
        hit = current is not None and (not named or current.matches(prompt_id, key))
        if hit and current is not None and self.cancel(session):
            return _cancelled("running", current)
        arriving = [p for p in session.arriving if not named or p.matches(prompt_id, key)]
        if arriving:
            for prompt in arriving:
                prompt.cancel_requested = True
            return _cancelled("queued" if arriving[0].waiting else "starting", arriving[0])
        if not named:
            if not next_prompt:
                return {"cancelled": False, "target": "none"}
            session.cancel_until = trio.current_time() + self.sticky_cancel_s
            return {"cancelled": False, "target": "next", "sticky_s": self.sticky_cancel_s}
        if (
            prompt_id is not None
            and prompt_id in session.ended
            and key in (None, session.ended[prompt_id])
        ):  # the answer tells what was named, as on --db
            named_key = {"idempotency_key": key} if key is not None else {}
            return {"cancelled": False, "target": "ended", "prompt_id": prompt_id, **named_key}
        if key is None:
            return {"cancelled": False, "target": "none", "prompt_id": prompt_id}
        if session.keys is None:
            session.keys = key_index(session.entity.turns)
        if key in session.keys or key in session.unstarted:  # its prompt ended
            return {"cancelled": False, "target": "ended", "idempotency_key": key}
        now = trio.current_time()
        armed = {k: t for k, t in session.armed_keys.items() if t >= now}
        armed[key] = now + self.sticky_cancel_s
        session.armed_keys = dict(list(armed.items())[-MAX_ARMED_KEYS:])
        return {
            "cancelled": False,
            "target": "next",
            "idempotency_key": key,
            "sticky_s": self.sticky_cancel_s,
        }


def _cancelled(target: str, prompt: Prompt) -> dict[str, Any]:
    return {
        "cancelled": True,
        "target": target,
        "prompt_id": prompt.id,
        "intent": prompt.intent or None,
        "idempotency_key": prompt.key,
    }
