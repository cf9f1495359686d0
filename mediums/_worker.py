"""A sandbox worker process seen from the trio host: start, talk JSON lines, kill.

The worker runs in its own session (process group), with a scrubbed
environment and an empty working directory; killing it kills everything it
started. Its stderr goes to a temporary file that is read only when the
worker dies, so a chatty or crashing worker can never block the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import trio
import trio.lowlevel


class WorkerDied(Exception):
    """The worker exited or closed its pipe; ``reason`` says how, in plain words."""

    def __init__(self, reason: str, returncode: int | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.returncode = returncode


class WorkerProcess:
    def __init__(
        self, process: trio.Process, stderr: Any, workdir: tempfile.TemporaryDirectory[str]
    ) -> None:
        self._process = process
        self._stderr = stderr
        self._workdir = workdir
        self._buffer = bytearray()

    @classmethod
    async def start(cls, script: str, args: Sequence[str]) -> WorkerProcess:
        """Run ``script`` (a file path) in isolated mode (-I: no env vars, no user site)."""
        workdir = tempfile.TemporaryDirectory(prefix="cantrip-sandbox-")
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in kill()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        process = await trio.lowlevel.open_process(
            [sys.executable, "-I", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=workdir.name,
            env=env,
            start_new_session=True,
        )
        return cls(process, stderr, workdir)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        data = json.dumps(message, default=str).encode() + b"\n"
        try:
            await self._process.stdin.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise await self._died() from None

    async def receive(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                try:
                    message: dict[str, Any] = json.loads(line)
                except (ValueError, RecursionError) as exc:  # the worker runs hostile code
                    raise WorkerDied(
                        f"the sandbox sent a message the host cannot read ({type(exc).__name__})",
                        None,
                    ) from None
                if not isinstance(message, dict):
                    raise WorkerDied("the sandbox sent a message that is not an object", None)
                return message
            try:
                chunk = await self._process.stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                raise await self._died()
            self._buffer.extend(chunk)

    async def _died(self) -> WorkerDied:
        with trio.CancelScope(shield=True):
            returncode = await self._process.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        if returncode == -signal.SIGALRM:
            reason = "time limit exceeded"
        elif returncode in (-signal.SIGKILL, -signal.SIGSEGV) or "MemoryError" in tail:
            reason = (
                f"the sandbox was killed (signal {-returncode})"
                if returncode < 0
                else "out of memory"
            )
        else:
            last = tail.splitlines()[-1] if tail else ""
            reason = f"the sandbox exited with status {returncode}" + (f": {last}" if last else "")
        return WorkerDied(reason, returncode)

    async def kill(self) -> None:
        """Kill the worker and everything in its process group, and reap it."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await self._process.wait()
        self._stderr.close()
        self._workdir.cleanup()
