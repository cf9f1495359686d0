"""Sessions: the seam every front end speaks to (:class:`SessionBackend`) and its two
backends, in process (:class:`ProcessBackend`) and on PostgreSQL
(:class:`PostgresBackend`). Issue 41, phase 1: the seam and its contract, the
protocols not yet moved onto it (see :mod:`._backend` for the plan and the drifts)."""

from cantrip.protocols.sessions._backend import (
    BUSY_POLICIES,
    BusyPolicy,
    Cancelled,
    Capabilities,
    Health,
    PromptOutcome,
    SessionBackend,
    SessionEvent,
    SessionInfo,
    Submitted,
)
from cantrip.protocols.sessions._postgres import PostgresBackend
from cantrip.protocols.sessions._process import ProcessBackend

__all__ = [
    "BUSY_POLICIES",
    "BusyPolicy",
    "Cancelled",
    "Capabilities",
    "Health",
    "PostgresBackend",
    "ProcessBackend",
    "PromptOutcome",
    "SessionBackend",
    "SessionEvent",
    "SessionInfo",
    "Submitted",
]
