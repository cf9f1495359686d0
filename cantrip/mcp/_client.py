"""MCP servers as gate providers: the client side, on the official SDK.

Each open server is one :class:`~cantrip.mcp._connection.Connection`: a task in
the entity's nursery that holds an ``mcp.Client`` (the SDK runs on anyio, so on our
trio loop) from start-up until it is told to stop (:mod:`._connection`). Here its
tools become gates and a call's failures ``is_error`` records; gate calls from any
task of the entity go through that client, which multiplexes them over the one session.

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

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

import pydantic
import trio

from cantrip._checkpoint import CURRENT as CURRENT_CHECKPOINT
from cantrip._core import CURRENT_ENTITY
from cantrip._events import GateProgress
from cantrip._gate import Gate, GateError, GateResult
from cantrip._providers import ProviderStartError
from cantrip._redact import get_logger
from cantrip.mcp._asking import Asker
from cantrip.mcp._connection import Connection, MCPServer, scrub
from cantrip.mcp._names import gate_names
from cantrip.mcp._tasks import CURRENT_NOTE, TaskNote, resume_task

if TYPE_CHECKING:
    import mcp_types


log = get_logger("cantrip.mcp")


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
        self._connection: Connection | None = None
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

    async def _connect(self) -> Connection:
        connection = Connection(self.spec)
        await connection.start(self.nursery)
        self.starts += 1
        return connection

    async def _live(self) -> Connection:
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
        self, connection: Connection, gate_name: str, tool: str, arguments: Mapping[str, Any]
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
