"""The bash medium: a persistent ``bash`` process per entity (MEDIUM-2/3).

**This is NOT a sandbox, and it must never be a default medium.** The entity's
code runs as a real ``bash --noprofile --norc`` with the permissions of the
user running cantrip: it can read and write every file that user can (the
working directory is only where it *starts*), start any program, reach the
network, and leave background processes running until they are killed. Use it
only in circles whose author means to hand an LLM a real shell on this
machine (a container or VM is the place for untrusted work).

What the medium *does* give:

* **working directory** -- the shell starts in ``workdir`` (a constructor
  argument). Without one, each session gets a fresh temporary directory that
  is deleted when the session closes. A given ``workdir`` is shared by every
  entity of the circle (each still has its own shell) and is never deleted.
* **environment scrubbing** -- the shell sees only ``PATH``, ``HOME`` (the
  working directory) and ``LANG=C.UTF-8`` (plus what bash sets itself), so
  API keys and other secrets in the host's environment are not inherited.
  Nothing stops the code from reading them from files it can reach.
* **process-group kill** -- the shell is started in its own session
  (``start_new_session``); on timeout, cancellation and close the whole
  process group is killed with ``SIGKILL``, background jobs included. A
  process that leaves the group on purpose (``setsid``, a daemon) escapes,
  and if the host process itself is killed outright (no ``aclose``), the
  shell exits when its stdin closes but its background jobs live on.
* **time limit** -- the ``max_eval_ms`` ward (the kind the JavaScript medium
  registers; default 10000 here) bounds one code call, not counting time
  spent inside gates. On timeout the process group is killed, the
  observation says "timed out", and the next call starts a fresh shell whose
  observation says that the shell state was lost (files remain).
* **output cap** -- stdout and stderr (merged, in order) are kept up to
  ``max_output_chars`` (default 20000): the start and the end are shown with a
  note saying how much was left out.
* **error turns** -- a non-zero exit status, a timeout or the shell exiting
  is the code's own error (``extras["error"]``, so ``Turn.is_error``).

**State (MEDIUM-3, COMP-4).** Each entity's session has its own shell,
started on first use; every code call is written to a private control file
and sourced (``. file``) in that same shell, with stdin from ``/dev/null``,
so the current directory, variables, functions and ``set`` options persist
between turns. The end of a call is detected by a per-session random
sentinel line printed after it together with ``$?``. ``exit`` (or ``set -e``
tripping) ends the shell: the next call gets a fresh one and says so.

**Gates.** The circle's gates are shell commands: ``cantrip_gate NAME
[ARG...]`` calls any gate, mapping the string arguments onto its parameters
in order (``cantrip_gate --json NAME JSON`` passes a JSON object as keyword
arguments, or a JSON array as positional ones). Each gate name (and alias)
that is a valid shell name and not a bash keyword, builtin or program on
``PATH`` is also a function of its own (``submit_answer 42``, ``tally x``);
``done``, ``echo`` and ``read`` are keywords/builtins, so the done gate is
called as ``submit_answer ANSWER`` (or ``cantrip_gate done ANSWER``) and the
others through ``cantrip_gate``. The shell function writes a NUL-separated
request to a pipe (an inherited fd, see ``pass_fds``) and blocks reading
the reply from a second pipe; the trio host answers every request with
``await host.call(...)``, so each call is a recorded gate call, in order. A
result is printed on stdout (strings as-is, other values as JSON) so
``x=$(cantrip_gate echo hi)`` works; a failing gate prints its error on
stderr and returns status 1.

After a successful terminating gate (``submit_answer``/``done``) the rest of
the code call is skipped (LOOP-3): a DEBUG trap (``extdebug``) returns from
the sourced code. Limits: called inside a subshell (``$(...)``, a pipeline,
``( ... )``) only that subshell stops; the rest of the code runs on, but every
later gate call is recorded as ``skipped`` and stops the shell code at that
point. Gate calls from concurrent background jobs are not supported (their
requests could interleave). A gate reply cannot carry NUL bytes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio
import trio.lowlevel

from cantrip.medium import (
    ConstructionError,
    Gate,
    GateCallRecord,
    Message,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Turn,
    WardKind,
    WardSet,
    render_code_observation,
)
from mediums._bash_shell import Output, Sandbox, Shell, ShellDied, gate_commands
from mediums._bwrap import bwrap_path, bwrap_problem
from mediums._code import (
    MAX_EVAL_MS,
    CodeRun,
    boundary_arguments,
    code_tool,
    execute_code_calls,
    map_arguments,
    observation_text,
    ward_limit,
)
from mediums.base import Execution, GateHost

TOOL_NAME = "bash"
EXIT_GRACE_S = 0.2
"""After the shell exits, how long to wait for the rest of its output."""

_NOTES_TEMPLATE = """\
Run bash code in a persistent bash shell on the host machine (NOT a sandbox). The current \
directory, variables, functions and options persist between calls; the shell starts in its \
working directory. stdout and stderr are returned to you (long output is cut: write it to a \
file and inspect it with head/grep/sed), with the exit status when it is not 0. stdin is \
/dev/null, so do not run interactive programs. One call may run {seconds:g} s (less if the \
circle says so); a call that runs longer is killed together with its background jobs, and \
the shell restarts without its state. `exit` also ends the shell.

Gates are shell commands; `cantrip_gate NAME ARG...` calls any of them (string arguments, \
mapped onto the parameters in order; `cantrip_gate --json NAME '{{"param": value}}'` passes \
JSON). A result is printed on stdout (use x=$(...) to keep it); a failure prints on stderr \
and returns status 1.
{listing}

Finish with `submit_answer ANSWER` (the done gate; `done` itself is a bash keyword): the rest \
of the code after it does not run."""


@attrs.frozen
class BashMedium:
    """A real bash shell as the medium: A = M + G - W. Not a sandbox; never a default."""

    workdir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    max_eval_ms: int = 10000
    max_output_chars: int = 20000
    name: str = "bash"
    default_tool_choice: ToolChoice = "required"
    isolation: Literal["none", "bwrap"] = "none"
    """``"bwrap"``: run the shell under bubblewrap (see :mod:`mediums._bwrap`)."""
    network: bool = False
    """With ``isolation="bwrap"``: let the shell reach the network (off by default)."""

    def __attrs_post_init__(self) -> None:
        if self.isolation not in ("none", "bwrap"):
            raise ConstructionError(
                f"bash isolation must be 'none' or 'bwrap', not {self.isolation!r}"
            )
        if self.isolation == "bwrap":
            bwrap_path()  # a clear error now, not at the first code call

    def ward_kinds(self) -> Sequence[WardKind]:
        return (MAX_EVAL_MS,)

    def present(self, gates: Sequence[Gate]) -> tuple[ToolDefinition, ...]:
        lines = []
        for g in gates:
            params = " ".join(
                p.upper() for p in (g.parameters.get("properties") or {}) if isinstance(p, str)
            )
            commands = [n for n in (g.name, *g.aliases) if n in gate_commands([n])]
            usage = " / ".join(f"{c} {params}".strip() for c in commands)
            if not usage:
                usage = f"cantrip_gate {g.name} {params}".strip()
            summary = g.description.splitlines()[0] if g.description else ""
            lines.append(f"- {usage}: {summary}")
        notes = _NOTES_TEMPLATE.format(seconds=self.max_eval_ms / 1000, listing="\n".join(lines))
        tool = code_tool("bash", TOOL_NAME, gates, "")
        return (attrs.evolve(tool, description=notes),)

    async def open(self, wards: WardSet) -> BashSession:
        eval_ms = ward_limit(self.max_eval_ms, wards, "max_eval_ms")
        sandbox = None
        if self.isolation == "bwrap":
            bwrap = bwrap_path()
            problem = await trio.to_thread.run_sync(bwrap_problem, bwrap)
            if problem is not None:
                raise ConstructionError(f"isolation='bwrap': {problem}")
            sandbox = Sandbox(bwrap, self.network)
        if self.workdir is None:
            workdir, owned = Path(tempfile.mkdtemp(prefix="cantrip-bash-")), True
        else:
            workdir, owned = self.workdir.resolve(), False
            workdir.mkdir(parents=True, exist_ok=True)
        return BashSession(workdir, owned, eval_ms, self.max_output_chars, sandbox)

    def render_observation(self, turn: Turn) -> list[Message]:
        return render_code_observation(turn)


@attrs.define
class _Block:
    """What one code call did."""

    records: list[GateCallRecord] = attrs.field(factory=list)
    terminated: bool = False
    value: Any = None
    status: int | None = None
    exited: bool = False
    timed_out: bool = False
    gate_busy: bool = False
    finished: bool = False
    error: str | None = None
    """The code's own failure (non-zero exit, timeout, ...): makes the turn an error turn."""


class BashSession:
    """One entity's shell, started on first use and restarted after a kill."""

    def __init__(
        self,
        workdir: Path,
        owned: bool,
        eval_ms: int,
        output_chars: int,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._sandbox = sandbox
        self.workdir = workdir
        self._owned = owned
        self._eval_ms = eval_ms
        self._output_chars = output_chars
        self._shell: Shell | None = None
        self._lost_state: str | None = None

    @property
    def pid(self) -> int | None:
        """The live shell's pid (its process group id), if one is running."""
        return None if self._shell is None else self._shell.process.pid

    async def execute(self, response: Response, host: GateHost) -> Execution:
        return await execute_code_calls(response, host, self._run_code)

    async def _run_code(self, call: ToolCall, host: GateHost) -> CodeRun:
        text, block = await self._run_call(call, host)
        return CodeRun(text, tuple(block.records), block.terminated, block.value, block.error)

    async def _run_call(self, call: ToolCall, host: GateHost) -> tuple[str, _Block]:
        code = call.arguments.get("code")
        if call.name != TOOL_NAME or not isinstance(code, str):
            problem = (
                f"this circle's medium is bash: call the {TOOL_NAME!r} tool with "
                f'{{"code": "..."}} (got {call.name}({call.arguments_json}))'
            )
            return f"error: {problem}", _Block(error=problem)
        notice = None
        if self._lost_state is not None:
            notice = (
                f"notice: {self._lost_state}, so this is a fresh shell: the shell state was "
                "lost (current directory, variables, functions, options); files remain"
            )
            self._lost_state = None
        block = _Block()
        output = Output(self._output_chars)
        try:
            shell = await self._ensure_shell(host)
            shell.blocks += 1
            path = shell.control / f"block-{shell.blocks}.sh"
            path.write_text(code if code.endswith("\n") else code + "\n", encoding="utf-8")
            await self._drive(shell, path, block, output, host)
        except ShellDied as death:
            block.error = str(death)
            text = observation_text(records=[], console=[], error=block.error, notice=notice)
            return text, block
        except BaseException:
            # Cut off from outside (cancelled, timeout_s): the shell may be running
            # the code or waiting for a gate's reply and can never be trusted to be
            # in step again. Kill it; the next call starts a fresh shell.
            await self._discard_shell("the previous code call was interrupted")
            raise
        error = None
        if block.timed_out:
            await self._discard_shell(
                f"the previous code call timed out after {self._eval_ms} ms and was killed"
            )
            error = (
                f"timed out after {self._eval_ms} ms (max_eval_ms): the shell and every "
                "process it started were killed; the next call starts a fresh shell without "
                "the previous state"
            )
        elif block.exited:
            returncode = shell.process.returncode
            await self._discard_shell("the previous shell exited")
            error = (
                f"the shell exited (status {returncode}); the next call starts a fresh shell "
                "without the previous state"
            )
        elif block.status and not block.terminated:
            error = f"exit status {block.status}"
        lines = output.lines(str(path))
        if error and any("unexpected token `done'" in line for line in lines):
            error += (
                " (hint: `done` is a bash keyword; finish with submit_answer ANSWER "
                "or cantrip_gate done ANSWER)"
            )
        block.error = error
        text = observation_text(records=block.records, console=lines, error=error, notice=notice)
        return text, block

    async def _drive(
        self, shell: Shell, path: Path, block: _Block, output: Output, host: GateHost
    ) -> None:
        """Run one code call to its end, answering gate requests, within the time limit."""
        await shell.send_line(f". {shlex.quote(str(path))} </dev/null; " + shell.tail)
        with trio.CancelScope(deadline=trio.current_time() + self._eval_ms / 1000) as scope:
            async with trio.open_nursery() as nursery:

                def finish() -> None:
                    block.finished = True
                    if not block.gate_busy:
                        nursery.cancel_scope.cancel()

                async def read_output() -> None:
                    block.status, _ = await shell.read_to_sentinel(output)
                    if block.status is not None:
                        finish()

                async def watch_exit() -> None:
                    await shell.process.wait()
                    await trio.sleep(EXIT_GRACE_S)  # let the output reader drain the pipe
                    if not block.finished:
                        block.exited = True
                        finish()

                async def serve_gates() -> None:
                    while True:
                        request = await shell.next_request()
                        if request is None:
                            return
                        block.gate_busy = True
                        remaining = scope.deadline - trio.current_time()
                        scope.deadline = float("inf")  # time in gates does not count
                        try:
                            await self._host_call(shell, request, block, host)
                        finally:
                            block.gate_busy = False
                            scope.deadline = trio.current_time() + max(remaining, 0.0)
                        if block.finished:
                            nursery.cancel_scope.cancel()

                nursery.start_soon(read_output)
                nursery.start_soon(watch_exit)
                nursery.start_soon(serve_gates)
        if scope.cancelled_caught and not block.finished:
            block.timed_out = True
        if not block.finished:  # what the reader held back while looking for the sentinel
            output.add(bytes(shell.stdout_buffer))
            shell.stdout_buffer.clear()

    async def _host_call(
        self, shell: Shell, request: tuple[str, list[str]], block: _Block, host: GateHost
    ) -> None:
        mode, fields = request
        if not fields:  # only a malformed request (not written by cantrip_gate) has no name
            await shell.reply("error", "cantrip_gate: a request without a gate name")
            return
        name, raw = fields[0], fields[1:]
        args_for_record: dict[str, Any] = {"args": raw}
        if block.terminated:
            message = "skipped: done was already called"
            block.records.append(host.unexecuted(name, args_for_record, None, "skipped", message))
            await shell.reply("skip", message)
            return
        found = host.gate(name)
        if found is None:
            record = host.unexecuted(name, args_for_record, None, "error", f"unknown gate {name!r}")
            block.records.append(record)
            await shell.reply("error", f"cantrip_gate: {record.text}")
            return
        try:  # JSON arguments pass the value boundary (cantrip._values) too
            kwargs = boundary_arguments(name, _arguments(found, mode, raw))
        except (TypeError, ValueError) as exc:
            block.records.append(host.unexecuted(name, args_for_record, None, "error", str(exc)))
            await shell.reply("error", f"{name}: {exc}")
            return
        record = await host.call(name, kwargs)
        block.records.append(record)
        if record.is_error:
            await shell.reply("error", f"{name}: {record.text}")
        elif host.terminates(name):
            block.terminated, block.value = True, record.result
            await shell.reply("stop", "")
        else:
            value = record.result
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            await shell.reply("ok", text)

    async def _ensure_shell(self, host: GateHost) -> Shell:
        if self._shell is None:
            names: list[str] = []
            for g in host.gates:
                names.extend((g.name, *g.aliases))
            try:
                self._shell = await Shell.start(self.workdir, names, self._sandbox)
            except (OSError, trio.TooSlowError) as exc:
                raise ShellDied(f"bash could not be started: {exc or type(exc).__name__}") from None
        return self._shell

    async def _discard_shell(self, why: str) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            self._lost_state = why
            await shell.kill()

    async def aclose(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            await shell.kill()
        if self._owned:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _arguments(gate: Gate, mode: str, raw: list[str]) -> dict[str, Any]:
    """A gate request's arguments as the gate's keyword arguments."""
    if mode != "json":
        return map_arguments(gate, raw)
    if len(raw) != 1:
        raise ValueError("cantrip_gate --json NAME JSON takes exactly one JSON argument")
    try:
        value = json.loads(raw[0])
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("the JSON argument is nested too deeply") from None
    if isinstance(value, dict):
        return value
    return map_arguments(gate, value if isinstance(value, list) else [value])


bash = BashMedium()
"""A bash medium with a fresh temporary working directory per session.

Not registered anywhere by default: a circle must ask for it explicitly."""
