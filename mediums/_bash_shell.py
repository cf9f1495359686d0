"""The bash medium's shell process: one live ``bash`` with its control pipes.

Apart from :mod:`mediums.bash` because this is the process plumbing -- starting a
scrubbed shell (optionally under bubblewrap), the sentinel protocol that finds the
end of a code call, the NUL-separated gate-request pipe, the capped output and the
process-group kill -- while ``bash.py`` keeps what the medium means: its tool,
its notes to the model, and how a code call's gate requests become recorded gate
calls. Nothing here knows about turns or gates beyond their names.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio
import trio.lowlevel

from mediums._bwrap import bwrap_command

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
START_TIMEOUT_S = 10.0
_RESERVED = """
if then else elif fi case esac for select while until do done in function time coproc
alias bg bind break builtin caller cd command compgen complete compopt continue declare dirs
disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let
local logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt source
suspend test times trap true type typeset ulimit umask unalias unset wait
"""
_SHELL_WORDS = frozenset(_RESERVED.split())
"""bash keywords and builtins: a gate of such a name is reached through cantrip_gate."""
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_INIT = r"""
exec {__CANTRIP_REQ}>&%(req)d {__CANTRIP_REP}<&%(rep)d %(req)d>&- %(rep)d<&-
readonly __CANTRIP_REQ __CANTRIP_REP
__cantrip_stop=
__cantrip_trap() {
  if [[ -n $__cantrip_stop ]] && (( ${#FUNCNAME[@]} > 1 )); then return 2; fi
  return 0
}
__cantrip_halt() {
  __cantrip_stop=1
  builtin shopt -s extdebug
  builtin trap __cantrip_trap DEBUG
}
cantrip_gate() {
  local __mode=args __status= __value=
  if [[ ${1-} == --json ]]; then __mode=json; shift; fi
  if (( $# < 1 )); then
    builtin printf '%%s\n' 'usage: cantrip_gate NAME [ARG...] | cantrip_gate --json NAME JSON' >&2
    return 2
  fi
  builtin printf '%%s\0' "$__mode" "$#" "$@" >&"$__CANTRIP_REQ" || return 3
  IFS= builtin read -r -d '' __status <&"$__CANTRIP_REP" || {
    builtin printf '%%s\n' 'cantrip_gate: no reply from the host' >&2
    return 3
  }
  IFS= builtin read -r -d '' __value <&"$__CANTRIP_REP"
  case $__status in
    ok) builtin printf '%%s\n' "$__value" ;;
    stop) __cantrip_halt ;;
    skip) builtin printf '%%s\n' "$__value" >&2; __cantrip_halt; return 1 ;;
    *) builtin printf '%%s\n' "$__value" >&2; return 1 ;;
  esac
}
%(functions)s
"""


def gate_commands(names: Sequence[str]) -> list[str]:
    """The gate names that can be shell functions without hiding anything."""
    path = os.environ.get("PATH") or DEFAULT_PATH
    return [
        n
        for n in names
        if _SHELL_NAME.match(n)
        and n not in _SHELL_WORDS
        and not n.startswith("__cantrip")
        and n != "cantrip_gate"
        and shutil.which(n, path=path) is None
    ]


@attrs.frozen
class Sandbox:
    """How to wrap a shell in bubblewrap: the program, and whether it has network."""

    bwrap: str
    network: bool

    def command(self, workdir: Path, control: Path, argv: list[str]) -> list[str]:
        return [*bwrap_command(self.bwrap, workdir, control, network=self.network), "--", *argv]


class ShellDied(Exception):
    """The shell could not be started."""


class Output:
    """A code call's merged output: the head and the tail, with a count of the rest."""

    def __init__(self, limit_chars: int) -> None:
        self._head_limit = max(limit_chars - limit_chars // 4, 0) * 4
        self._tail_limit = (limit_chars // 4) * 4
        self._limit_chars = limit_chars
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self._tail_limit:
            self.tail += data
            del self.tail[: max(len(self.tail) - self._tail_limit, 0)]

    def lines(self, block_path: str) -> list[str]:
        """The output as console lines, cut to the limit with a note when too long."""
        head = self.head.decode(errors="replace").replace(block_path, "bash")
        tail = self.tail.decode(errors="replace").replace(block_path, "bash")
        dropped = self.total > len(self.head) + len(self.tail)
        first = head if dropped else head + tail
        last = tail if dropped else first
        if not dropped and len(first) <= self._limit_chars:
            return _split(first)
        tail_chars = self._limit_chars // 4
        head_chars = self._limit_chars - tail_chars
        shown_tail = last[-tail_chars:] if tail_chars else ""
        note = (
            f"[output truncated: {self.total} bytes in all; only the first {head_chars} and the "
            f"last {len(shown_tail)} characters are shown -- redirect long output to a file "
            "and inspect it with head, tail, grep or sed]"
        )
        return [*first[:head_chars].split("\n"), note, *_split(shown_tail)]


def _split(text: str) -> list[str]:
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n") if text else []


class Shell:
    """One live ``bash`` process with its control pipes."""

    def __init__(
        self,
        process: trio.Process,
        requests: trio.lowlevel.FdStream,
        replies: trio.lowlevel.FdStream,
        control: Path,
        token: str,
    ) -> None:
        self.process = process
        self.requests = requests
        self.replies = replies
        self.control = control
        self.token = token.encode()
        self.stdout_buffer = bytearray()
        self.request_buffer = bytearray()
        self.blocks = 0

    @classmethod
    async def start(
        cls, workdir: Path, gate_names: Sequence[str], sandbox: Sandbox | None = None
    ) -> Shell:
        control = Path(tempfile.mkdtemp(prefix="cantrip-bash-control-"))
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = {
            "PATH": os.environ.get("PATH") or DEFAULT_PATH,
            "HOME": str(workdir),
            "LANG": "C.UTF-8",
        }
        try:
            functions = "\n".join(
                f'{n}() {{ cantrip_gate {n} "$@"; }}' for n in gate_commands(gate_names)
            )
            init = _INIT % {"req": req_w, "rep": rep_r, "functions": functions}
            (control / "init.sh").write_text(init, encoding="utf-8")
            argv = [shutil.which("bash", path=env["PATH"]) or "/bin/bash", "--noprofile", "--norc"]
            if sandbox is not None:
                argv = sandbox.command(workdir, control, argv)
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=str(workdir),
                env=env,
                start_new_session=True,
                pass_fds=(req_w, rep_r),
            )
        except BaseException:
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
            shutil.rmtree(control, ignore_errors=True)
            raise
        os.close(req_w)
        os.close(rep_r)
        shell = cls(
            process,
            trio.lowlevel.FdStream(req_r),
            trio.lowlevel.FdStream(rep_w),
            control,
            "__CANTRIP_END_" + secrets.token_hex(12) + "__",
        )
        try:
            with trio.fail_after(START_TIMEOUT_S):
                await shell.send_line(f". {shlex.quote(str(control / 'init.sh'))}; " + shell.tail)
                status, output = await shell.read_to_sentinel()
            if status != 0 or output.strip():
                raise ShellDied(f"bash failed to start: {output.decode(errors='replace')!r}")
        except BaseException:
            await shell.kill()
            raise
        return shell

    @property
    def tail(self) -> str:
        """The shell code that follows every code call: reset the stop trap, print the end."""
        return (
            "__cantrip_status=$?; if [[ -n $__cantrip_stop ]]; then builtin trap - DEBUG; "
            "builtin shopt -u extdebug; __cantrip_stop=; fi; "
            f"builtin printf '\\n%s %d\\n' {self.token.decode()} "
            '"$__cantrip_status"'
        )

    async def send_line(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    async def read_to_sentinel(self, sink: Output | None = None) -> tuple[int | None, bytes]:
        """Read stdout up to the sentinel line; ``(status, output)``, or ``None`` at EOF."""
        assert self.process.stdout is not None
        marker = b"\n" + self.token + b" "
        collected = bytearray()
        buffer = self.stdout_buffer
        while True:
            at = buffer.find(marker)
            if at >= 0:
                end = buffer.find(b"\n", at + len(marker))
                if end >= 0:
                    status = int(buffer[at + len(marker) : end] or b"0")
                    self._emit(bytes(buffer[:at]), sink, collected)
                    del buffer[: end + 1]
                    return status, bytes(collected)
            else:
                keep = len(marker) + 16
                if len(buffer) > keep:
                    self._emit(bytes(buffer[:-keep]), sink, collected)
                    del buffer[:-keep]
            try:
                chunk = await self.process.stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                self._emit(bytes(buffer), sink, collected)
                buffer.clear()
                return None, bytes(collected)
            buffer += chunk

    @staticmethod
    def _emit(data: bytes, sink: Output | None, collected: bytearray) -> None:
        if not data:
            return
        if sink is not None:
            sink.add(data)
        else:
            collected += data

    async def next_request(self) -> tuple[str, list[str]] | None:
        """The next gate request from the shell: ``(mode, [name, *args])``; ``None`` at EOF."""
        buffer = self.request_buffer
        while True:
            fields = buffer.split(b"\0")
            if len(fields) >= 3:
                try:
                    count = int(fields[1])
                except ValueError:
                    count = 0
                if len(fields) > 2 + count:
                    raw = fields[: 2 + count]
                    del buffer[: sum(len(f) + 1 for f in raw)]
                    # bytes that are not UTF-8 become lone surrogates: carried exactly
                    values = [f.decode(errors="surrogateescape") for f in raw]
                    return values[0], values[2:]
            chunk = await self.requests.receive_some(65536)
            if not chunk:
                return None
            buffer += chunk

    async def reply(self, status: str, value: str) -> None:
        data = status.encode() + b"\0" + shell_bytes(value.replace("\0", "")) + b"\0"
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.replies.send_all(data)

    async def kill(self) -> None:
        """Kill the shell's whole process group, reap it, close the pipes."""
        # Even when the shell itself has exited, its background jobs may live on in
        # its group (the group id outlives the leader while members remain).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await self.process.wait()
            for stream in (self.requests, self.replies, self.process.stdin, self.process.stdout):
                if stream is not None:
                    await stream.aclose()
        shutil.rmtree(self.control, ignore_errors=True)


def shell_bytes(text: str) -> bytes:
    """Text for the shell: the bytes it came from (surrogate escapes), else UTF-8 with
    any other lone surrogate replaced -- a shell has no way to hold one."""
    try:
        return text.encode(errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode(errors="replace")
