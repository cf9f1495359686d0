"""MCP servers as gate providers: the client side, on the official SDK.

Each open server is one :class:`_Connection`: a task in the entity's nursery
that holds an ``mcp.Client`` (the SDK runs on anyio, so on our trio loop) from
start-up until it is told to stop. Gate calls from any task of the entity go
through that client; the SDK multiplexes them over the one session.

Failures are sorted by when they happen:

* at start-up (the command cannot be spawned, the server exits, the handshake
  or the tool listing does not finish within ``startup_timeout_s``, an allow-list
  names a tool the server does not offer) -- :class:`ProviderStartError`, raised
  before the cast's first turn;
* during a call (a tool result with ``isError``, no answer within ``timeout_s``,
  a malformed result, the server dying mid-call) -- an ``is_error`` gate record;
  the loop goes on. A server that died is started again on the next call.

Cancelling a call (the cast is cancelled, or cut off by a ward) makes the SDK
send ``notifications/cancelled`` for the request before the call unwinds.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

import pydantic
import trio

from cantrip._checkpoint import CURRENT as CURRENT_CHECKPOINT
from cantrip._core import CURRENT_ENTITY
from cantrip._events import GateProgress
from cantrip._gate import Gate, GateError, GateResult
from cantrip._providers import ProviderStartError
from cantrip._redact import get_logger, redact
from cantrip.mcp._asking import Asker, Question
from cantrip.mcp._names import gate_names
from cantrip.mcp._stdio import stdio_transport
from cantrip.mcp._tasks import CURRENT_NOTE, TaskNote, resume_task, tasks_extension

if TYPE_CHECKING:
    import mcp_types


class MCPServer(Protocol):
    """What this module reads of a server's description (``cantrip.mcp._provider.MCPServer``
    satisfies it; declared here so the description's module can import this one
    without an import circle)."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def tools(self) -> tuple[str, ...] | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def startup_timeout_s(self) -> float: ...
    @property
    def elicitation(self) -> bool: ...
    @property
    def gate_prefix(self) -> str: ...
    def describe(self) -> dict[str, Any]: ...


log = get_logger("cantrip.mcp")

_STOP_GRACE_S = 10.0
"""How long closing waits for the SDK's own (bounded) shutdown before cutting it off."""
_EXIT_NOTE_S = 1.0
"""How long a call cut by a closed connection waits to learn the server's exit status."""
_STDERR_TAIL = 2000
_LIST_PAGES = 100


class _Arguments(pydantic.BaseModel):
    """Arguments pass through to the server as given: the tool's JSON Schema is the
    server's to enforce (its refusal comes back as an ``isError`` result)."""

    model_config = pydantic.ConfigDict(extra="allow")


async def open_server(spec: MCPServer, nursery: trio.Nursery) -> MCPProvider:
    """Start (or connect to) ``spec``'s server in ``nursery``; its tools as gates."""
    provider = MCPProvider(spec, nursery)
    await provider.start()
    return provider


class MCPProvider:
    """One MCP server opened for one entity: its gates, its connection, reconnects."""

    def __init__(self, spec: MCPServer, nursery: trio.Nursery) -> None:
        self.spec = spec
        self.nursery = nursery
        self.gates: tuple[Gate, ...] = ()
        self.starts = 0
        """How many connections were made (1 + reconnects)."""
        self.renamed: dict[str, str] = {}
        """``gate name -> tool name`` for the tools whose names providers would refuse
        (:mod:`cantrip.mcp._names`); ``cantrip cast --check`` shows them."""
        self._connection: _Connection | None = None
        self._lock = trio.Lock()
        self._closed = False

    async def start(self) -> None:
        connection = await self._connect()
        offered = connection.tools
        wanted = self.spec.tools
        if wanted is not None:
            missing = [t for t in wanted if t not in offered]
            if missing:
                await connection.aclose()
                raise ProviderStartError(
                    f"MCP server {self.spec.name!r} does not offer {missing} "
                    f"(it offers: {sorted(offered)})"
                )
        names = [t for t in offered if wanted is None or t in wanted]
        try:
            mapped = gate_names(self.spec.gate_prefix, names)
        except ValueError as exc:
            await connection.aclose()
            raise ProviderStartError(f"MCP server {self.spec.name!r}: {exc}") from None
        self.renamed = {
            gate: tool for tool, gate in mapped.items() if gate != self.spec.gate_prefix + tool
        }
        for gate, tool in self.renamed.items():
            log.info("MCP server %r: tool %r is the gate %r", self.spec.name, tool, gate)
        self.gates = tuple(self._gate(offered[t], mapped[t]) for t in names)
        self._connection = connection

    async def aclose(self) -> None:
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.aclose()

    async def _connect(self) -> _Connection:
        connection = _Connection(self.spec)
        await connection.start(self.nursery)
        self.starts += 1
        return connection

    async def _live(self) -> _Connection:
        """The connection, started again if the server died since the last call."""
        async with self._lock:
            connection = self._connection
            if connection is not None and connection.alive:
                return connection
            if self._closed:
                raise GateError(f"MCP server {self.spec.name!r} is closed")
            if connection is not None:
                await connection.aclose()
            log.info("MCP server %r is not running; starting it again", self.spec.name)
            try:
                self._connection = await self._connect()
            except ProviderStartError as exc:
                raise GateError(
                    f"MCP server {self.spec.name!r} could not be restarted: {exc}"
                ) from None
            return self._connection

    def _gate(self, tool: mcp_types.Tool, gate_name: str) -> Gate:
        name = tool.name

        async def call(**arguments: Any) -> GateResult:
            return await self.call(gate_name, name, arguments)

        return Gate(
            name=gate_name,
            fn=call,
            description=(tool.description or tool.title or "").strip(),
            args_model=_Arguments,
            parameters=dict(tool.input_schema),
        )

    async def call(self, gate_name: str, tool: str, arguments: Mapping[str, Any]) -> GateResult:
        """One ``tools/call``; every failure of the server comes back as ``is_error``."""
        detail: dict[str, Any] = {"via": f"mcp:{self.spec.name}", "mcp_tool": tool}
        note = TaskNote()

        def described() -> dict[str, Any]:
            """The record's detail; a call that ran as a task says which task."""
            if note.task_id is None:
                return detail
            return {**detail, "mcp_task": note.to_dict()}

        def failed(message: str) -> GateResult:
            return GateResult(scrub(self.spec, message), described(), is_error=True)

        try:
            connection = await self._live()
        except GateError as exc:
            return failed(str(exc))
        client = connection.client
        if tool not in connection.tools or client is None:
            return failed(f"MCP server {self.spec.name!r} no longer offers tool {tool!r}")
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        token = CURRENT_NOTE.set(note)
        try:
            result = await self._call_tool(connection, gate_name, tool, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                how = await connection.ended()
                connection.lost()
                return failed(
                    f"MCP server {self.spec.name!r} closed the connection during the call "
                    f"({how}); it will be started again for the next call"
                    + connection.stderr_note()
                )
            if exc.code == REQUEST_TIMEOUT:
                return failed(
                    f"MCP server {self.spec.name!r} did not answer {tool!r} within "
                    f"{self.spec.timeout_s:g}s (the request was cancelled)"
                )
            return failed(f"MCP server {self.spec.name!r} error {exc.code}: {exc.message}")
        except pydantic.ValidationError as exc:
            return failed(
                f"MCP server {self.spec.name!r} sent a malformed result for {tool!r}: "
                f"{exc.error_count()} problem(s), first: {exc.errors()[0]['msg']}"
            )
        except RuntimeError as exc:  # the SDK's output-schema check
            return failed(f"MCP server {self.spec.name!r}: {exc}")
        finally:
            CURRENT_NOTE.reset(token)
        value = tool_result_value(result)
        usage = reported_usage(result.structured_content)
        if usage is not None and not result.is_error:
            detail["usage"] = usage  # a sub-cast's tokens count toward the tree's budget
        return GateResult(value, described(), is_error=bool(result.is_error))

    async def _call_tool(
        self, connection: _Connection, gate_name: str, tool: str, arguments: Mapping[str, Any]
    ) -> mcp_types.CallToolResult:
        """``tools/call``; with elicitation on, the server's questions during the call
        are asked by the calling entity (in this task's cancel scope: cancelling the
        cast cancels the questions, and the server is told ``cancel``)."""
        progress = _progress_sink(gate_name)
        note = CURRENT_NOTE.get()
        if note is not None:
            note.on_progress = progress
        checkpoint = CURRENT_CHECKPOINT.get()
        started = (checkpoint.saved or {}).get("mcp_task") if checkpoint is not None else None
        call: Awaitable[mcp_types.CallToolResult]
        if isinstance(started, str):  # begun before a crash: follow it, never call again
            ask = connection.on_elicit if self.spec.elicitation else None
            call = resume_task(connection.client.session, started, ask, self.spec.timeout_s)
        else:
            call = connection.client.call_tool(
                tool,
                dict(arguments),
                read_timeout_seconds=self.spec.timeout_s,
                progress_callback=progress,
            )
        entity = CURRENT_ENTITY.get(None)
        if not self.spec.elicitation or entity is None:
            result: mcp_types.CallToolResult = await call
            return result
        asker = Asker(entity, gate_name, f"mcp:{self.spec.name}")
        connection.askers.append(asker)
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(asker.serve)
                try:
                    result = await call
                except Exception as exc:  # noqa: BLE001 -- re-raised as it is, outside the nursery
                    failure = exc  # (which would wrap it in a group the caller never sees)
                nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure
            return result
        finally:
            connection.askers.remove(asker)
            asker.close()


def _progress_sink(gate_name: str) -> Any:
    """A progress callback that turns notifications into :class:`GateProgress` events
    for the entity calling the gate (captured now: the SDK calls back from its own task)."""
    entity = CURRENT_ENTITY.get(None)
    sink = entity.on_event if entity is not None else None
    if entity is None or sink is None:
        return None
    entity_id = entity.id

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        sink(
            GateProgress(
                entity_id=entity_id,
                gate=gate_name,
                progress=progress,
                total=total,
                message=message,
            )
        )

    return on_progress


def reported_usage(structured: Any) -> dict[str, int] | None:
    """The tokens a tool reports it spent -- a cantrip served by ``cantrip mcp``
    answers a cast with its ``usage`` ({prompt_tokens, completion_tokens, ...}) -- so
    the calling entity's tree budget counts that sub-cast (cantrip._core._budget);
    ``None`` when the result says nothing usable (most tools)."""
    usage = structured.get("usage") if isinstance(structured, dict) else None
    if not isinstance(usage, dict):
        return None
    counts = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()):
        return None
    return {k: int(n) for k, n in counts.items() if isinstance(n, int)}


def tool_result_value(result: mcp_types.CallToolResult) -> Any:
    """What the entity sees of a tool result: the structured content when the tool
    gives one (a code medium gets a dict back), else its content blocks as text."""
    if result.structured_content is not None and not result.is_error:
        return result.structured_content
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            size = len(getattr(block, "data", "")) * 3 // 4
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '?')}, {size} bytes]")
        elif kind == "resource":
            resource = block.resource  # type: ignore[union-attr]
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '?')}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    return "\n".join(parts)


class _Connection:
    """One running session with a server, held open by a task in the entity's nursery."""

    def __init__(self, spec: MCPServer) -> None:
        self.spec = spec
        self.client: Any = None
        self.tools: dict[str, mcp_types.Tool] = {}
        self.alive = False
        self._stop = trio.Event()
        self._done = trio.Event()
        self._scope = trio.CancelScope()
        self._stderr: IO[str] | None = None
        self._last_stderr = ""
        self.exit_status: int | None = None
        """The server process's exit status, once it exited on its own (stdio)."""
        self._exited = trio.Event()
        self.askers: list[Asker] = []
        """Calls in flight whose entity asks this server's questions (newest last)."""

    async def on_elicit(self, context: Any, params: Any) -> Any:
        """The SDK's elicitation callback (a server's ``elicitation/create``, or one of
        the input requests of a 2026-07-28 ``InputRequiredResult``): the question goes
        to the call in flight -- the newest, when several are -- and waits for it."""
        from mcp_types import INVALID_REQUEST, ElicitResult, ErrorData

        if not self.askers:
            return ErrorData(
                code=INVALID_REQUEST, message="no call of this server is in flight to ask for"
            )
        question = Question(params)
        if not self.askers[-1].ask(question):
            return ElicitResult(action="cancel")
        await question.done.wait()
        return question.result

    async def start(self, nursery: trio.Nursery) -> None:
        failure: str | None = await nursery.start(self._run)
        if failure is not None:
            raise ProviderStartError(scrub(self.spec, failure))

    def _on_exit(self, status: int) -> None:
        """The server process exited while in use: no call may wait on it any more."""
        self.exit_status = status
        self.alive = False
        self._exited.set()

    async def ended(self) -> str:
        """How the connection ended, for the message of a call it cut: a stdio server's
        exit is noticed by its process (waited for briefly: the end of its output
        and its exit arrive together, in either order)."""
        if self.spec.command is not None:
            with trio.move_on_after(_EXIT_NOTE_S):
                await self._exited.wait()
        status = self.exit_status
        if status is None:
            return "it died?"
        if status < 0:
            return f"its process was killed by signal {-status}"
        return f"its process exited with status {status}"

    def lost(self) -> None:
        """The server went away: stop holding the session (the task cleans up)."""
        self.alive = False
        self._stop.set()

    async def aclose(self) -> None:
        self.alive = False
        self._stop.set()
        with trio.move_on_after(_STOP_GRACE_S):
            await self._done.wait()
        if not self._done.is_set():
            log.warning("MCP server %r did not shut down in time; cut off", self.spec.name)
            self._scope.cancel()
            await self._done.wait()

    def stderr_note(self) -> str:
        tail = _tail(self._stderr) if self._stderr is not None else self._last_stderr
        return f"; its stderr ends: {tail}" if tail else ""

    async def _run(self, task_status: trio.TaskStatus[str | None]) -> None:
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
            self._stderr = stderr
            try:
                await self._hold(task_status)
            finally:
                self._last_stderr = _tail(stderr)
                self._stderr = None
                self.alive = False
                self.client = None
                self._done.set()

    async def _hold(self, task_status: trio.TaskStatus[str | None]) -> None:
        """Start the session, report how that went, then hold it until told to stop."""
        spec = self.spec
        assert self._stderr is not None
        started = False
        try:
            with self._scope:
                startup = trio.CancelScope(deadline=trio.current_time() + spec.startup_timeout_s)
                with startup:
                    ask = self.on_elicit if spec.elicitation else None
                    async with _client(spec, self._stderr, self._on_exit, ask) as client:
                        tools = await _list_tools(client)
                        startup.deadline = math.inf
                        self.client, self.tools, self.alive = client, tools, True
                        started = True
                        task_status.started(None)
                        await self._stop.wait()
                if startup.cancelled_caught and not started:
                    task_status.started(
                        f"MCP server {spec.name!r} ({_where(spec)}) did not finish starting "
                        f"(handshake and tool listing) within {spec.startup_timeout_s:g}s"
                        + self.stderr_note()
                    )
        except Exception as exc:  # noqa: BLE001 -- the external-server boundary
            if not started:
                task_status.started(
                    f"MCP server {spec.name!r} ({_where(spec)}) failed to start: "
                    f"{_describe(exc)}" + self.stderr_note()
                )
            else:
                log.warning("MCP server %r: session ended with %s", spec.name, _describe(exc))


def _client(
    spec: MCPServer,
    stderr: IO[str],
    on_exit: Callable[[int], None],
    on_elicit: Callable[..., Awaitable[Any]] | None = None,
) -> Any:
    """An ``mcp.Client`` for the spec's transport (an async context manager); a
    stdio server runs under cantrip's own supervision (:mod:`cantrip.mcp._stdio`).
    With ``on_elicit`` the client declares the elicitation capability (form and URL).
    It always declares the tasks extension (:mod:`cantrip.mcp._tasks`): a server that
    offers it runs a call as a task, one that does not answers as ever."""
    from mcp import Client, Implementation

    info = Implementation(name="cantrip", version=_version())
    if spec.command is not None:
        transport = stdio_transport(spec.command, spec.args, spec.env, spec.cwd, stderr, on_exit)
        return Client(
            transport,
            client_info=info,
            cache=None,
            elicitation_callback=on_elicit,  # type: ignore[arg-type]
            extensions=[tasks_extension(on_elicit, spec.timeout_s)],
        )
    return _HttpClient(spec, info, on_elicit)


MCP_TIMEOUT = 30.0
"""Seconds an MCP request may take to connect, write or wait for a free connection."""
MCP_READ_TIMEOUT = 300.0
"""Seconds between two reads of an MCP response: a server may hold a stream open."""


def http_client(headers: dict[str, str]) -> Any:
    """The HTTP client of a streamable-HTTP MCP server: the spec's headers, the MCP SDK's
    default timeouts (30 s, 300 s between reads of a held-open stream).

    Built as the SDK documents (``streamable_http_client(http_client=...)`` takes an
    ``httpx2.AsyncClient`` one configures), not by the SDK's private
    ``mcp.shared._httpx_utils``, which any release may move; the SDK follows
    redirects within the endpoint's origin itself, whatever the client says."""
    import httpx2

    return httpx2.AsyncClient(
        headers=headers or None,
        timeout=httpx2.Timeout(MCP_TIMEOUT, read=MCP_READ_TIMEOUT),
    )


class _HttpClient:
    """``mcp.Client`` over streamable HTTP with the spec's headers; closes its HTTP client."""

    def __init__(self, spec: MCPServer, info: Any, on_elicit: Any = None) -> None:
        self.spec, self.info, self.on_elicit = spec, info, on_elicit
        self._http: Any = None
        self._client: Any = None

    async def __aenter__(self) -> Any:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self._http = http_client(dict(self.spec.headers))
        await self._http.__aenter__()
        try:
            transport = streamable_http_client(self.spec.url or "", http_client=self._http)
            self._client = Client(
                transport,
                client_info=self.info,
                cache=None,
                elicitation_callback=self.on_elicit,
                extensions=[tasks_extension(self.on_elicit, self.spec.timeout_s)],
            )
            return await self._client.__aenter__()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._client.__aexit__(*exc)
        finally:
            with trio.CancelScope(shield=True):
                await self._http.__aexit__(None, None, None)


async def _list_tools(client: Any) -> dict[str, mcp_types.Tool]:
    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    for _ in range(_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            tools[tool.name] = tool
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def scrub(spec: MCPServer, text: str) -> str:
    """``text`` without the spec's env and header values (they may be credentials)."""
    for value in (*spec.env.values(), *spec.headers.values()):
        if len(value) >= 4:
            text = text.replace(value, "[REDACTED]")
    return redact(text)


def _where(spec: MCPServer) -> str:
    described = spec.describe()
    return f"{described['transport']}: {described['target']}"


def _describe(exc: BaseException) -> str:
    """An exception (or the first leaf of a group) in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return redact(f"{type(exc).__name__}: {text}" if str(exc) else text)


def _tail(file: IO[str] | None) -> str:
    if file is None or file.closed:
        return ""
    try:
        file.flush()
        size = file.seek(0, 2)
        file.seek(max(0, size - _STDERR_TAIL))
        text = file.read().strip()
    except (OSError, ValueError):
        return ""
    return redact(" | ".join(line for line in text.splitlines()[-5:] if line.strip()))


def _version() -> str:
    from cantrip._version import __version__

    return __version__
