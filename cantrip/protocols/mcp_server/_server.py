"""``cantrip mcp SPEC.toml``: a cantrip served as an MCP server (official SDK).

The server side of MCP (the client side, MCP servers as a circle's gates, is
:mod:`cantrip.mcp`); the command line that starts it is :mod:`cantrip.cli._mcp`.

One tool, ``cast``: its input is an intent, its result the cast's answer as
text plus structured content ``{result, terminated, truncated, reason, turns,
usage, entity_id}`` (:mod:`cantrip.protocols.mcp_server._result`). A call is a session of
the in-process session backend its lifespan opens (:mod:`._calls`: the intent a prompt,
its pauses answered through the backend). Every recorded turn is reported as a progress
notification (when the client asked for progress). A client that cancels the request
cancels the cast: the SDK cancels the tool's task, which cancels its prompt through the
backend, and the entity records the cut-off turn as ``cancelled`` as any cancellation.

When the cast pauses (an approval, an ``ask_user`` question, a question one of
the circle's MCP servers asked) and the client declared elicitation, the client is
asked (:mod:`cantrip.protocols.mcp_server._pauses`): at 2026-07-28 the call answers
``InputRequiredResult`` and the retry's answer continues the cast through the backend;
before it the server sends ``elicitation/create`` and the call goes on with the answer.
A client that declares the tasks extension gets a task instead of waiting
(:mod:`cantrip.protocols.mcp_server._tasks`).

When the spec has a loom file (``[loom] path``), each entity's thread is an MCP
resource, ``cantrip://threads/<entity_id>`` (JSON; secrets redacted).

Transports: stdio (the default) and streamable HTTP (``--http``), served by
hypercorn's trio worker on 127.0.0.1, behind the request guard every cantrip HTTP
server has (:mod:`cantrip.protocols.middleware._guard`: Host and Origin checked on every bind,
a bearer token -- ``--token`` or ``CANTRIP_MCP_TOKEN`` -- required beyond loopback
and checked whenever one is set).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any

import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._cantrip import Cantrip
from cantrip._elicit import AnswerError
from cantrip._errors import CantripError
from cantrip._install import require_extra
from cantrip._redact import get_logger
from cantrip._text import require_intent
from cantrip.loom._model import Turn
from cantrip.protocols.mcp_server._calls import Ask, Driven, drive, failure_text
from cantrip.protocols.mcp_server._held import INPUT_TTL_S, HeldPauses
from cantrip.protocols.mcp_server._pauses import can_elicit, decision_from, elicitation_params
from cantrip.protocols.mcp_server._result import (
    CastOutput,
    cast_tool_result,
    failed_tool_result,
    progress_message,
)
from cantrip.protocols.mcp_server._tasks import TaskBoard, tasks_extension
from cantrip.protocols.middleware._client_faults import demote_client_faults
from cantrip.protocols.middleware._guard import Guard, guard_refusals_as_jsonrpc
from cantrip.protocols.sessions import ProcessBackend, SessionBackend, SessionError, turn_dict

if TYPE_CHECKING:
    from mcp.server import MCPServer as SDKServer
    from mcp_types import InputRequiredResult

log = get_logger("cantrip.mcp.serve")

THREAD_SCHEME = "cantrip://threads/"
_MAX_LISTED = 500
"""Resources listed at most (newest entities first); any thread is readable by URI."""


CAST_DESCRIPTION = (
    "Cast the cantrip on an intent: an entity works on it turn by turn until it calls "
    "done or a ward stops it. Returns the result; the structured content says whether "
    "it terminated or was truncated, after how many turns, at what token cost. "
    "Progress is reported once per turn."
)


def build_server(spell: Cantrip, *, input_ttl_s: float = INPUT_TTL_S) -> SDKServer:
    """The MCP server for ``spell``: the ``cast`` tool, and loom threads as resources.
    Its casts are prompts of the in-process session backend the server's lifespan
    opens (:mod:`._calls`); a pause left for a 2026-07-28 client's next request is held
    ``input_ttl_s`` (:mod:`._held`)."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context
    from mcp_types import CallToolResult

    persistent = getattr(spell.loom.store, "path", None) is not None

    class CantripMCP(MCPServer):
        async def list_resources(self) -> Any:
            listed = list(await super().list_resources())
            if persistent:
                listed.extend(_thread_resources(spell))
            return listed

    board = TaskBoard()
    held = HeldPauses(input_ttl_s)

    @asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[dict[str, Any]]:
        """The server's life: the session backend its casts run in, and the nursery its
        tasks are driven in (at its end every cast is cut off, recorded as cancelled)."""
        backend = ProcessBackend.serving(spell)
        async with backend.running(), trio.open_nursery() as nursery:
            board.backend, board.nursery = backend, nursery
            nursery.start_soon(held.expire, backend)
            try:
                yield {}
            finally:
                board.backend, board.nursery = None, None
                nursery.cancel_scope.cancel()

    server = CantripMCP(
        "cantrip",
        lifespan=lifespan,
        extensions=[tasks_extension(board)],
        instructions=(
            "Call the `cast` tool with an intent; a cantrip entity works on it "
            "(a model in a loop with its gates) and answers with the result."
        ),
        version=_version(),
        log_level="WARNING",
    )
    max_turns = spell.circle.resolved.max_turns

    async def cast(intent: str, ctx: Context) -> CallToolResult | InputRequiredResult:
        send, receive = trio.open_memory_channel[Turn](math.inf)

        async def report() -> None:
            # Progress counts the turns this call recorded (1, 2, ...): a turn's sequence
            # also counts the checkpoints pauses make, and would outrun max_turns.
            done = 0
            async for turn in receive:
                done += 1
                await ctx.report_progress(
                    float(done),
                    float(max_turns) if max_turns is not None else None,
                    progress_message(done, turn.utterance),
                )

        backend = board.backend
        if backend is None:
            return failed_tool_result("the server is not serving")  # type: ignore[no-any-return]
        driven = None
        failure: str | None = None
        form, url_mode = can_elicit(ctx.client_capabilities)
        rounds = form and _rounds(ctx.protocol_version)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report)
            try:
                driven = await _run(
                    backend, held, intent, ctx, send.send_nowait, form, url_mode, rounds
                )
            except CantripError as exc:  # a refused intent: the tool fails
                failure = f"{type(exc).__name__}: {exc}"
            except SessionError as exc:  # an LLM that gave up, a pause not waiting
                failure = failure_text(exc)
            finally:
                send.close()
        if failure is not None or driven is None:
            return failed_tool_result(failure or "no result")  # type: ignore[no-any-return]
        if driven.left is not None:
            asked = _input_required(driven, url_mode)
            if asked is not None:
                held.hold(driven.session_id, driven.prompt_id)
                return asked
        if driven.cast is None:
            return failed_tool_result("the cast was cut off before it began")  # type: ignore[no-any-return]
        return cast_tool_result(driven.cast)  # type: ignore[no-any-return]

    # The SDK reads the signature for the schemas; with postponed annotations and
    # the SDK imported here, hand it the evaluated ones (output: CastOutput).
    cast.__annotations__ = {
        "intent": str,
        "ctx": Context,
        "return": Annotated[CallToolResult, CastOutput],  # or InputRequiredResult
    }
    server.tool(name="cast", description=CAST_DESCRIPTION)(cast)

    if persistent:

        @server.resource(
            THREAD_SCHEME + "{entity_id}",
            name="thread",
            description="An entity's thread in the loom: its turns, root to latest (JSON).",
            mime_type="application/json",
        )
        def thread(entity_id: str) -> str:
            return _thread_json(spell, entity_id)

    return server


async def _run(
    backend: SessionBackend,
    held: HeldPauses,
    intent: str,
    ctx: Any,
    on_turn: Callable[[Turn], None],
    form: bool,
    url_mode: bool,
    rounds: bool,
) -> Driven:
    """Run the cast for one ``tools/call``, or go on with the one it paused.

    A client that takes elicitations is asked when the cast pauses: at 2026-07-28
    (``rounds``) the call answers ``InputRequiredResult`` at the pause (the session
    holds it) and the client's retry carries the answer, which continues the cast
    through the backend. Before 2026-07-28 the client is sent ``elicitation/create``
    and the call goes on with its answer. A client that takes none gets today's
    answer: the cast returns ``paused``."""
    if rounds and ctx.request_state is not None:
        return await _answered(backend, held, ctx, on_turn)
    require_intent(intent)
    ask: Ask | None = None
    if rounds:
        ask = _between_requests
    elif form:

        async def ask_client(pause: Pause) -> Decision:
            return await _ask_in_place(ctx, pause, url_mode)

        ask = ask_client
    info, _ = await backend.create()  # the call's one read of its session: handed down
    submitted = await backend.submit(info, intent)
    return await drive(backend, info, submitted.prompt_id, after=0, on_turn=on_turn, ask=ask)


async def _ask_in_place(ctx: Any, pause: Pause, url_mode: bool) -> Decision:
    """Ask the client with a server-sent ``elicitation/create`` (2025-11-25 and before)."""
    params = elicitation_params(pause, url_mode=url_mode)
    if params is None:
        return Decision.deny("the MCP client cannot open pages (no URL-mode elicitation)")
    session, related = ctx.session, ctx.request_id
    if pause.url is not None:
        result = await session.elicit_url(params.message, params.url, pause.pause_id, related)
    else:
        result = await session.elicit_form(params.message, params.requested_schema, related)
    try:
        return decision_from(pause, result)
    except AnswerError as exc:
        return Decision.deny(f"the MCP client's answer did not fill the form: {exc}")


def _input_required(driven: Driven, url_mode: bool) -> InputRequiredResult | None:
    """The ``InputRequiredResult`` that asks the pause left open (keyed by its pause
    id; the state names the session, the prompt and the pause, sealed by the SDK); None
    if it cannot be asked."""
    from mcp_types import ElicitRequest, InputRequiredResult

    pause = driven.left
    assert pause is not None
    params = elicitation_params(pause, url_mode=url_mode)
    if params is None:
        return None
    state = json.dumps(
        {
            "session_id": driven.session_id,
            "entity_id": pause.entity_id,
            "pause_id": pause.pause_id,
            "prompt_id": driven.prompt_id,
        }
    )
    return InputRequiredResult(
        input_requests={pause.pause_id: ElicitRequest(params=params)}, request_state=state
    )


async def _answered(
    backend: SessionBackend, held: HeldPauses, ctx: Any, on_turn: Callable[[Turn], None]
) -> Driven:
    """A retry that carries the answer to a pause: the cast goes on from it (a pause
    that ended it: a continued prompt; one during a call: the prompt that waits). An
    answer that cannot be taken is a :class:`~cantrip.PauseError` (the tool's error;
    the pause stays pending). ``requestState`` itself is sealed by the SDK, which
    refuses one it did not make before this runs."""
    state = json.loads(ctx.request_state)
    held.take(str(state["session_id"]))  # answered: no longer to be let go of
    entity_id, pause_id = str(state["entity_id"]), str(state["pause_id"])
    response = (ctx.input_responses or {}).get(pause_id)
    if response is None:
        raise PauseError(f"inputResponses holds no answer for {pause_id!r}")
    session_id = str(state["session_id"])
    try:
        info = await backend.find(session_id)
    except SessionError:
        raise PauseError(f"no entity {entity_id!r} in this server's loom") from None
    pause = next((p for p in await backend.pauses(session_id) if p.pause_id == pause_id), None)
    if pause is None:
        raise PauseError(f"pause {pause_id!r} is not pending (already answered?)")
    try:
        decision = decision_from(pause, response)
    except AnswerError as exc:
        raise PauseError(f"the answer to {pause_id} does not fill the form: {exc}") from None
    continued = await backend.answer(session_id, pause_id, decision)
    prompt_id = continued.prompt_id if continued is not None else str(state["prompt_id"])

    return await drive(
        backend, info, prompt_id, after=info.turns, on_turn=on_turn, ask=_between_requests
    )


async def _between_requests(pause: Pause) -> Decision | None:
    """At 2026-07-28 the client is reachable only between requests: every pause is left
    for the next one (the call answers ``InputRequiredResult``). One that ended the cast
    is held by the loom; one that waits in place -- a child's, or a question asked during
    a call -- by its running prompt, which the session keeps until the retry answers."""
    return None


def _rounds(version: str | None) -> bool:
    """Whether the negotiated revision asks through ``InputRequiredResult`` (2026-07-28+)."""
    from mcp_types.version import is_version_at_least

    return version is not None and is_version_at_least(version, "2026-07-28")


def _version() -> str:
    from cantrip._version import __version__

    return __version__


def _thread_resources(spell: Cantrip) -> Iterable[Any]:
    from mcp_types import Resource

    records = list(spell.loom.entities.values())[-_MAX_LISTED:]
    for record in reversed(records):
        yield Resource(
            uri=THREAD_SCHEME + record.entity_id,
            name=record.entity_id,
            description=(
                f"thread of {record.entity_id}"
                + (f" (child of {record.parent_entity_id})" if record.parent_entity_id else "")
            ),
            mime_type="application/json",
        )


def _thread_json(spell: Cantrip, entity_id: str) -> str:
    loom = spell.loom
    if entity_id not in loom.entities:
        raise ValueError(f"no entity {entity_id!r} in the loom")
    last = loom.last_turn(entity_id)
    turns = loom.thread(last.id) if last is not None else []
    return json.dumps({"entity_id": entity_id, "turns": [turn_dict(t) for t in turns]}, default=str)


# -- transports ---------------------------------------------------------------------------


async def serve_stdio(spell: Cantrip, *, input_ttl_s: float = INPUT_TTL_S) -> None:
    """Serve on this process's stdin/stdout until the client closes stdin."""
    require_extra("mcp", "cantrip mcp")
    server = build_server(spell, input_ttl_s=input_ttl_s)
    await server.run_stdio_async()


def http_guard(host: str, token: str | None) -> Guard:
    """The guard of ``cantrip mcp --http`` (:class:`~cantrip.protocols.middleware._guard.BindError`
    if a bind beyond loopback has no token)."""
    guard = Guard(
        bind_host=host,
        token=token,
        server="cantrip mcp --http",
        token_hint="pass --token or set CANTRIP_MCP_TOKEN",
    )
    guard.check_bind()
    return guard


def http_app(spell: Cantrip, guard: Guard, *, input_ttl_s: float = INPUT_TTL_S) -> Any:
    """The streamable HTTP ASGI app (at ``/mcp``) behind ``guard``. The SDK's own
    DNS-rebinding check is off: it covered only some binds, the guard covers every one.
    A body the guard refuses (not JSON, too large, too slow) is answered as a JSON-RPC
    error, as the SDK answers a bad message: 4xx with ``-32700`` / ``-32600``, id null."""
    from mcp.server.transport_security import TransportSecuritySettings

    server = build_server(spell, input_ttl_s=input_ttl_s)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app: Any = server.streamable_http_app(host=guard.bind_host, transport_security=security)
    demote_client_faults(_SDK_SESSION_LOGGERS, "mcp", _sdk_client_fault)
    return guard_refusals_as_jsonrpc(guard.wrap(app), "/mcp")


_SDK_SESSION_LOGGERS = ("mcp.server.streamable_http_manager",)
"""The SDK's logger that writes an INFO line, quoting it, for every unknown session id."""


def _sdk_client_fault(record: logging.LogRecord) -> str | None:
    """What the MCP SDK's record says a client did wrong: a request naming a session the
    server does not hold is the client's fault -- one DEBUG line, not the id it sent (a
    client repeating it could fill the log; an expired id was once a real session's)."""
    if record.getMessage().startswith("Rejected request with unknown or expired session ID"):
        return "unknown or expired session id"
    return None


async def serve_http(
    spell: Cantrip,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    token: str | None = None,
    input_ttl_s: float = INPUT_TTL_S,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve streamable HTTP with hypercorn's trio worker; ``task_status`` gets the URLs."""
    require_extra("mcp", "cantrip mcp")
    from hypercorn.config import Config
    from hypercorn.trio import serve

    app = http_app(spell, http_guard(host, token), input_ttl_s=input_ttl_s)
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 2.0
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
