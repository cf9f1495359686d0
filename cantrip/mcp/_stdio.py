"""The stdio transport for MCP servers: a server process we supervise, not just a pipe.

The SDK's ``stdio_client`` notices that a server ended only when its stdout
ends, and kills the server's process group only when the server outlives the
shutdown grace. Both fail on a server with children of its own (issue 28,
item 8): a child that inherited the server's stdout keeps the pipe open after
the server crashed, so every later call waits out its timeout and the server is
never started again; and a server that exits politely on end of input leaves
its children running after the cast.

So cantrip spawns the server itself (same command, arguments, environment and
working directory rules as the SDK) and:

* starts it in a session of its own (``start_new_session``), so the server and
  everything it starts share one process group we can signal at once;
* watches the process itself (``Process.wait``, which waits on the pid, not on
  the pipes): when the server exits while the session is open, the group is
  ended, the read stream is closed (calls in flight get the SDK's
  ``CONNECTION_CLOSED``) and ``on_exit`` is told the exit status;
* on shutdown closes stdin, gives the server the SDK's grace to exit, then ends
  the whole group (SIGTERM, then SIGKILL) -- always, even when the server
  itself has exited, since its children may not have.

The streams it yields are the SDK's transport streams, so ``mcp.Client`` runs
over it as over ``stdio_client``. POSIX only (process groups); cantrip does not
run MCP servers on Windows.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import IO, Any

import anyio
import trio

from cantrip._redact import get_logger

log = get_logger("cantrip.mcp")

_EXIT_GRACE_S = 2.0
"""How long a server may take to exit on its own once its stdin is closed (the SDK's
``PROCESS_TERMINATION_TIMEOUT``; the MCP lifecycle's shutdown sequence)."""
_TERM_GRACE_S = 2.0
"""How long the group has between SIGTERM and SIGKILL."""
_FLUSH_S = 0.5
"""On shutdown: how long messages already accepted may take to reach stdin."""
_POLL_S = 0.02
_DRAIN_S = 0.5
"""After the server died: how long its last output may take to be read."""
_READ_CHUNK = 1 << 16
_BIG_LINE = 1 << 20
"""Lines longer than this are parsed off the event loop (a 30 MB result must not stall it)."""
_PARSE_LIMIT = trio.CapacityLimiter(2)


@asynccontextmanager
async def stdio_transport(
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    errlog: IO[str],
    on_exit: Callable[[int], None],
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn the server and yield ``(read_stream, write_stream)`` for ``mcp.Client``.

    Raises ``OSError`` when the command cannot be started. ``on_exit(status)`` is
    called as soon as the server exits before the block ends (a crash, from our
    side), before the calls in flight are told the connection closed."""
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await trio.lowlevel.open_process(
        [command, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errlog,
        env=get_default_environment() | dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    supervisor = _Supervisor(process, read_send, write_recv, on_exit)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.read)
            nursery.start_soon(supervisor.write)
            nursery.start_soon(supervisor.watch)
            try:
                yield read_recv, write_send
            finally:
                with trio.CancelScope(shield=True):
                    await supervisor.stop(write_send, read_recv)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await supervisor.end_group()


class _Supervisor:
    """The tasks around one server process: its stdout, its stdin, and its life."""

    def __init__(
        self,
        process: trio.Process,
        read_send: Any,
        write_recv: Any,
        on_exit: Callable[[int], None],
    ) -> None:
        self.process = process
        self.pgid = process.pid
        """The server leads its own session, so its pid names its group (even after
        it was reaped, when ``getpgid`` no longer can)."""
        self.read_send = read_send
        self.write_recv = write_recv
        self.on_exit = on_exit
        self.closing = False
        self.reader_done = trio.Event()
        self.writer_done = trio.Event()
        self.reader_scope = trio.CancelScope()

    async def read(self) -> None:
        """stdout, one JSON-RPC message per line, into the session's read stream; once
        nobody listens any more, read on and drop it (a server blocked on a full
        pipe could not see its stdin close, and would not exit)."""
        stdout = self.process.stdout
        assert stdout is not None
        pending: list[bytes] = []
        listening = True
        try:
            with self.reader_scope:
                async with self.read_send:
                    while chunk := await _receive(stdout):
                        if not listening:
                            continue
                        *lines, rest = chunk.split(b"\n")
                        if not lines:
                            pending.append(rest)
                            continue
                        lines[0] = b"".join([*pending, lines[0]])
                        pending = [rest] if rest else []
                        for line in lines:
                            if not line.strip():
                                continue
                            try:
                                await self.read_send.send(await _parse(line))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                listening, pending = False, []
                                break
        finally:
            self.reader_done.set()

    async def write(self) -> None:
        """The session's messages onto the server's stdin, one line each."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            async with self.write_recv:
                async for message in self.write_recv:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send_all((line + "\n").encode("utf-8", "surrogatepass"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # The server stopped reading (it died or closed stdin): end the session's
            # read side too, so no request waits for an answer that cannot come.
            await self.read_send.aclose()
        finally:
            self.writer_done.set()

    async def watch(self) -> None:
        """Wait on the process itself; a server that exits while in use has crashed."""
        status = await self.process.wait()
        if self.closing:
            return
        log.warning("MCP server process %d exited with status %d", self.pgid, status)
        self.on_exit(status)
        # Its children may hold stdout open: end them, let the last output be read,
        # then close the read side so every call in flight gets CONNECTION_CLOSED.
        self._signal_group(signal.SIGTERM)
        with trio.move_on_after(_DRAIN_S):
            await self.reader_done.wait()
        self.reader_scope.cancel()
        await self.read_send.aclose()
        await self.end_group()

    async def stop(self, write_send: Any, read_recv: Any) -> None:
        """The MCP shutdown sequence: what was sent is flushed, stdin closed, a grace
        to exit, then the whole group ended."""
        self.closing = True
        await read_recv.aclose()
        await write_send.aclose()
        with trio.move_on_after(_FLUSH_S):
            await self.writer_done.wait()
        stdin = self.process.stdin
        assert stdin is not None
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stdin.aclose()
        with trio.move_on_after(_EXIT_GRACE_S):
            await self.process.wait()
        await self.end_group()

    async def end_group(self) -> None:
        """SIGTERM the server's whole group, SIGKILL what is left after the grace."""
        if self._signal_group(signal.SIGTERM):
            with trio.move_on_after(_TERM_GRACE_S) as grace:
                while self._group_alive():
                    await trio.sleep(_POLL_S)
            if grace.cancelled_caught:
                self._signal_group(signal.SIGKILL)
        with trio.move_on_after(_TERM_GRACE_S):
            await self.process.wait()
        if self.process.returncode is None:
            log.warning("MCP server process %d survived SIGKILL; abandoned", self.pgid)

    def _signal_group(self, signum: signal.Signals) -> bool:
        """Signal every process of the group; False when none is left."""
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # some member we may not signal (setuid); the rest got it
        return True

    def _group_alive(self) -> bool:
        """Whether any process of the group still runs. Zombies do not count where
        ``/proc`` tells them apart: an orphan's zombie waits for whoever adopted it
        to reap it, which we cannot hurry (and some init processes never do)."""
        self.process.poll()  # reap the leader if it has exited
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        members = _live_members(self.pgid)
        return True if members is None else members > 0


async def _receive(stdout: trio.abc.ReceiveStream) -> bytes:
    try:
        return bytes(await stdout.receive_some(_READ_CHUNK))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


async def _parse(line: bytes) -> Any:
    """One stdout line as a session message, or the parse error as a value (the
    session reports it). Big lines are parsed on a worker thread."""
    if len(line) > _BIG_LINE:
        return await trio.to_thread.run_sync(_parse_sync, line, limiter=_PARSE_LIMIT)
    return _parse_sync(line)


def _parse_sync(line: bytes) -> Any:
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        log.warning("MCP server sent a line that is not a JSON-RPC message: %s", exc)
        return exc
    return SessionMessage(message)


def _live_members(pgid: int) -> int | None:
    """How many processes of group ``pgid`` are alive and not zombies, from
    ``/proc/PID/stat`` (after the command: state, ppid, pgrp); None without ``/proc``."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    count = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            count += 1
    return count
