"""Sessions: the seam every front end is to speak to (:class:`SessionBackend`) and its
backends, in process (:class:`ProcessBackend`, over ``SessionHub``) and on PostgreSQL
(:class:`PostgresBackend`, over ``DbSessions``).

Issue 41, phase 1 (this package and ``tests/test_session_backend_contract.py``): the
seam, its two adapters and the contract every backend keeps (AG-UI and A2A are written
over it, phase 2 steps 3 and 4).
:mod:`._backend`'s docstring lists the operations and the places the two modes
drifted, each ``test_drift_*`` test asserting the pair of answers as it is (phase 2
turns them into contract tests one by one).

Phase 2, in this order (each step keeps every existing test green in both modes):

1. *Remove the drifts in the backends*, each ``test_drift_*`` turned into a contract
   test as it goes (done: drifts 1 to 7, 11 and 12 and the split of
   ``SessionHub.prompt``, see :mod:`._backend`; left: 10): ``DbSessions.cancel`` cuts
   off the work it names only
   (``cancel_on(..., work_id=...)``: drift 1, a bug); ``SessionHub`` keeps a bounded
   record of ended prompt ids (``ended``, drift 4), gives an answer's continuation a
   :class:`~cantrip.protocols.sessions._hub.Prompt` (drift 5), checks a pause before
   ``busy`` (drift 6), serves waiters in order (a per-session FIFO, drift 3), and one
   rule for a cancel of the next prompt (drift 7: record nothing, as PostgreSQL
   does -- the cut-off intent must not reach a later prompt's model); one name for a
   prompt waiting its turn (``queued``, drift 2); a message to a queued prompt shown
   after its intent (drift 10). Split ``SessionHub.prompt`` into admitting (every
   refusal, no checkpoint) and running, so :class:`ProcessBackend` stops relying on
   ``nursery.start``'s scheduling. Move ``overloaded``/``shutting_down`` and the 503
   for a lost database to the lifecycle middleware (drifts 11, 12).
2. *HTTP* onto the seam (done): one :class:`~cantrip.protocols.http._app.HttpApp`
   over a ``SessionBackend`` for both modes (prompt result, prompt stream from
   ``follow(prompt_id=...)``, ``/events`` from ``follow`` with ``Last-Event-ID``);
   ``_shell.py``'s hooks, ``_db_app.py`` and ``_replica.py`` deleted; drifts 11 and 12
   removed; ``SessionHub.prompt`` split into ``admit`` and ``run``.
3. *AG-UI* (done): ``agui/_hub.py`` and ``agui/_db.py`` became one run over the
   seam, ``agui/_run.py``; the seam's ``submit`` grew the client's tools (offered by
   the hub as a prompt starts in process, ``CLIENT_TOOLS_KEY`` in the queued spell on
   PostgreSQL), in the contract.
4. *A2A* (done): ``a2a/_tasks.py`` and ``a2a/_db.py`` became one handler over the seam
   (``a2a/_handler.py``; a task is a prompt id plus its messages: the seam's
   ``submit_task``, ``task``, ``tasks``, ``answer_task``, ``cancel_waiting_task`` and
   ``follow(until=...)``; the task rows moved into the PostgreSQL backend,
   ``_task_rows.py``, the in-memory map into the process one); push stays behind
   ``capabilities.a2a_push``.
5. *The viewer's API* reads through the backend (its loom), fork behind
   ``capabilities.viewer_fork``; then *ACP* (one process, the in-process backend) and
   the *MCP server* (``_mcp.py`` summons entities from the cantrip itself today: a
   third session model, moved onto the in-process backend).
6. *The layout*, Starlette-like, no file named for a mode: ``protocols/asgi/``
   (``_asgi``, ``_request``, ``_body``, ``_ids``, the OpenAPI document of ``_api``),
   ``protocols/middleware/`` (``_guard``, ``_limits``, ``_lifecycle``,
   ``_client_faults``, ``_public_ip``, ``_hypercorn``), ``protocols/sessions/`` (this
   package, with ``_sessions``, ``_idempotency`` and ``_steering`` under the process
   backend, ``_db_sessions``, ``_db_follow`` and ``_db_notify`` under the PostgreSQL
   one), then one package per protocol: ``http/``, ``agui/``, ``a2a/`` (``_a2a``,
   ``_a2a_push``), ``acp/``, ``mcp_server/`` (``_mcp``, ``_mcp_tasks``,
   ``_mcp_pauses``, ``_mcp_result``), ``viewer/`` (its assets, ``_viewer``,
   ``_viewer_api``), ``terminal/`` (``_terminal``, ``_human``). Deleted then:
   ``_db_http.py``, ``_db_agui.py``, ``_db_replica.py``, ``_agui_hub.py``,
   ``_a2a_session.py``, the handler half of ``_a2a_db.py`` and ``_shell.py``'s hooks;
   the docs' table of what each mode offers generated from :class:`Capabilities`.
"""

from typing import TYPE_CHECKING, Any

from cantrip.protocols.sessions._backend import (
    BUSY_POLICIES,
    ENTITY_PREFIX,
    MAX_TASKS,
    SESSION_PREFIX,
    BusyPolicy,
    Cancelled,
    Capabilities,
    Health,
    PromptOutcome,
    SessionBackend,
    SessionError,
    SessionEvent,
    SessionInfo,
    Submitted,
    TaskRecord,
    TaskState,
    capabilities_table,
)

if TYPE_CHECKING:
    from cantrip.protocols.sessions._hub import SessionError
    from cantrip.protocols.sessions._postgres import PostgresBackend
    from cantrip.protocols.sessions._process import ProcessBackend


MODES_PAGE = "docs/how-to/postgres.md"
"""The docs page holding the table of modes (between :data:`MODES_MARKERS`)."""
MODES_MARKERS = (
    "<!-- table of modes: generated by cantrip.protocols.sessions.modes_table() -->",
    "<!-- end of the table of modes -->",
)


def modes_table() -> str:
    """The docs' table of what each ``cantrip serve`` mode offers, from the backends'
    :class:`Capabilities` (``tests/test_docs.py`` checks :data:`MODES_PAGE` holds it)."""
    from cantrip.protocols.sessions._postgres import CAPABILITIES as DB
    from cantrip.protocols.sessions._process import CAPABILITIES as PROCESS

    return capabilities_table([("`cantrip serve`", PROCESS), ("`cantrip serve --db`", DB)])


def __getattr__(name: str) -> Any:
    """The backends load on first use: the hub and the rows below them import this
    package's modules, and a backend imports what runs sessions (a package face that
    imported them eagerly would make every import of ``sessions._hub`` a circle)."""
    if name == "ProcessBackend":
        from cantrip.protocols.sessions._process import ProcessBackend

        return ProcessBackend
    if name == "PostgresBackend":
        from cantrip.protocols.sessions._postgres import PostgresBackend

        return PostgresBackend
    if name == "SessionError":  # the seam's one error (kinds: SessionBackend's docstring)
        from cantrip.protocols.sessions._hub import SessionError

        return SessionError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUSY_POLICIES",
    "ENTITY_PREFIX",
    "MAX_TASKS",
    "SESSION_PREFIX",
    "BusyPolicy",
    "Cancelled",
    "Capabilities",
    "Health",
    "PostgresBackend",
    "ProcessBackend",
    "PromptOutcome",
    "SessionBackend",
    "SessionError",
    "SessionEvent",
    "SessionInfo",
    "Submitted",
    "TaskRecord",
    "TaskState",
    "capabilities_table",
    "modes_table",
]
