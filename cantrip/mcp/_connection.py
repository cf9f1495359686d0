"""One MCP server's session, held open: the client side's connection, on the official SDK.

Apart from the provider (:mod:`._client`), which turns a server's tools into gates
and a call's failures into ``is_error`` records, because holding a session is a job
of its own: a task in the entity's nursery that starts an ``mcp.Client`` (the SDK
runs on anyio, so on our trio loop) for the spec's transport -- a stdio process under
cantrip's supervision (:mod:`._stdio`) or streamable HTTP with the spec's headers --
lists its tools within ``startup_timeout_s``, keeps the server's stderr for error
messages, notes how the server ended, and closes the session (cut off after a grace
period). A start that fails is reported as :class:`ProviderStartError`; what a call
does with a connection that ended is the provider's.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

import trio

from cantrip._providers import ProviderStartError
from cantrip._redact import get_logger, redact
from cantrip.mcp._asking import Asker, Question
from cantrip.mcp._stdio import stdio_transport
from cantrip.mcp._tasks import tasks_extension

if TYPE_CHECKING:
    import mcp_types


class MCPServer(Protocol):
    """What the client reads of a server's description (``cantrip.mcp._provider.MCPServer``
    satisfies it; declared here so the description's module can import the client
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


class Connection:
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
