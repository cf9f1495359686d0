"""How a run ended: the state and outcome a work item records, and what stopped a run.

One place for the JSON a finished cast leaves in ``cantrip_work`` (the same shape
every front end reports) and for telling the ends of a run apart: a result (done,
paused, cancelled), a failure of the cast's own, or a stop that is no failure -- a
lease lost, a cast suspended at a turn boundary -- which another claim resumes.
"""

from __future__ import annotations

from typing import Any

from cantrip._errors import CastSuspended
from cantrip._outcome import CastResult, result_dict
from cantrip.distributed._outage import describe
from cantrip.distributed._work import INTERRUPTED, PAUSED
from cantrip.loom._fence import LeaseLostError


def outcome_of(result: CastResult) -> dict[str, Any]:
    """What ``cantrip_work`` stores for a cast that ended: the one JSON shape every front
    end reports (:func:`cantrip._outcome.result_dict`, redacted; its cost the whole
    tree's, as every result reports it)."""
    return result_dict(result)


def failure_outcome(entity_id: str, exc: BaseException) -> dict[str, Any]:
    """The recorded outcome of a cast that failed: its error in one redacted line."""
    return {"error": describe(exc), "entity_id": entity_id}


def lease_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or any exception grouped in it) is a refused write: lease lost."""
    return _holds(exc, LeaseLostError)


def suspended(exc: BaseException) -> bool:
    """Whether ``exc`` (or any exception grouped in it) is a cast stopped between turns."""
    return _holds(exc, CastSuspended)


def _holds(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_holds(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def state_of(result: CastResult) -> str:
    """The work item's end state for a cast's result (``paused``: waits for an answer)."""
    if result.reason in ("cancelled", INTERRUPTED):
        return "cancelled"
    return PAUSED if result.pending else "done"
