"""The Python medium: Monty, a sandboxed Python interpreter, in its own process (MEDIUM-2/3).

The entity writes Python; the circle's gates are synchronous host functions
inside it (``done(x)``, ``submit_answer(x)``, ``read(path)``, ...). The code
runs in `pydantic-monty <https://github.com/pydantic/monty>`_: a Python
interpreter written in Rust, executed in a ``monty`` worker subprocess, whose
only ways out are suspensions the host answers. Nothing is ``exec()``-ed in
the host process.

**Host calls.** Monty runs a snippet until it calls a name the sandbox does
not define, then suspends with a snapshot. This module drives those
snapshots: the blocking Monty work runs in a trio worker thread
(``trio.to_thread.run_sync``, awaited), and each gate call comes back to the
trio side, where it goes through ``await host.call(...)`` -- so every call is
recorded, in order -- before the snapshot is resumed with the result. A gate
that fails raises ``RuntimeError(<error text>)`` in the sandbox (catchable);
argument mapping errors raise ``TypeError``; calling any other undefined name
raises ``NameError``. Gates are first-class (``f = done`` works). After a
successful terminating gate (``done``) the rest of the code is skipped
(LOOP-3): the call is answered with ``SystemExit``, which ``except Exception``
does not catch; should the code swallow it anyway, every later gate call is
recorded as ``skipped`` and answered with ``SystemExit`` again.

**State (MEDIUM-3, COMP-4).** Each entity's session checks out its own Monty
worker (one pool of one process per session). A Monty REPL session keeps its
globals, functions and classes across ``feed`` calls, so state persists
between the entity's turns natively: nothing is replayed and no gate is ever
called twice. Two entities never share a worker. A feed interrupted from
outside (a ``timeout_s`` ward or a parent's cancellation while a gate was
running) is finished off at the start of the next turn, answering every
remaining gate call with ``SystemExit`` and recording none; the variables
survive.

**Sandbox.** Monty has no real filesystem, network, environment or process
access: ``open()`` and ``os``/``pathlib`` operations surface to the host as OS
calls and are refused (``PermissionError``/``RuntimeError``), modules such as
``subprocess`` and ``socket`` do not exist (``ModuleNotFoundError``),
``__import__`` is not defined, dunder attributes (``().__class__``) do not
exist, and ``eval``/``exec`` run inside the same sandbox. ``import os`` itself
succeeds, but it is Monty's virtual module (no ``system``, no ``environ``).
``time.sleep`` is answered on the trio side and counts against the time budget.

**Wards (WARD-2).** The same ``max_eval_ms`` and ``max_memory_mb`` ward kinds
as the JavaScript medium. ``max_eval_ms`` (default 5000) is Monty's
``max_feed_duration_secs``: execution time of one code call, not counting time
suspended in gates; ``max_memory_mb`` (default 64) is Monty's heap limit;
recursion is bounded by ``max_recursion_depth`` (default 1000). A memory bomb
or runaway recursion raises ``MemoryError``/``RecursionError`` (Monty's limit
errors cannot be caught by the code) and the session stays usable -- unless the
code's variables still fill the heap after a ``MemoryError`` (a small probe
allocation fails), in which case the session is discarded like after a time
limit, so the next call (``done`` included) does not fail the same way. A time
limit also cannot be caught; Monty then gives no guarantees about the heap, so
-- as its documentation asks, and as the JS medium does after a kill -- the
session is discarded and the next turn gets a fresh sandbox whose observation
says that the variables were lost. The same happens if the worker process
dies (Monty's pool kills it if it overruns the time limit by more than a
second). The host process is never at risk. Monty cannot be interrupted, so
when a code call is cancelled from outside while its code runs (``timeout_s``,
a parent's cancel) the worker process is killed at once and the session
replaced (:meth:`PythonSession._in_sandbox`).

**The loom (LOOM-11).** Unless ``expose_loom=False``, the name ``loom`` is a
host-backed read-only object (Monty's ``ClassInstance``): ``loom.turns`` (and
``loom.thread()``) is the entity's own history as a list of dicts,
``loom.turn(n)`` one turn by sequence. It is read lazily, when the code touches
it; assigning to its attributes changes nothing outside the sandbox.

**Forks and resumes (LOOM-4/13).** :meth:`PythonSession.replay_call` runs
recorded code again against a replaying host that answers every gate call
from the loom (see :mod:`cantrip._replay`). A recorded code call that was cut
off mid-way is replayed up to the cut and then finished off like the
interrupted feed it was, so the variables end up as they were.

**Layout.** This module is the medium and its session: the trio side, which
drives a code call, answers gate calls through the host and keeps the worker's
life (:class:`PythonSession`). The blocking calls into Monty, run in a worker
thread, are :mod:`mediums._python_sandbox`; converting values across the
sandbox's edge and rendering its results and errors is :mod:`mediums._python_values`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import pydantic_monty as monty
import trio

from cantrip.medium import (
    Gate,
    GateCallRecord,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ValueBoundaryError,
    WardSet,
)
from mediums._code import (
    LOOM_DOC,
    CodeRun,
    SandboxMedium,
    boundary_arguments,
    code_tool,
    execute_code_calls,
    history_source,
    observation_text,
    refused_arguments,
)
from mediums._python_sandbox import (
    STOP_MESSAGE,
    Feed,
    LoomView,
    checkout,
    drain,
    exit_quietly,
    loom_object,
    open_pool,
    probe_headroom,
    resume_feed,
    sandbox_error,
    start_feed,
    timed_out,
)
from mediums._python_values import (
    call_arguments,
    error_text,
    from_sandbox,
    render_result,
    shown_arguments,
    to_sandbox,
)
from mediums.base import Execution, GateHost

_T = TypeVar("_T")

TOOL_NAME = "python"
MAX_SUSPENSIONS = 1_000_000_000
"""Monty counts host calls per checkout (default 1000); an entity's life may need more."""

_NOTES = (
    "The sandbox runs Monty, a secure subset of Python 3: no files, network, environment or "
    "subprocesses (open() and os operations fail), no third-party packages, no class "
    "inheritance. Modules include json, re, math, datetime, collections, itertools, "
    "functools, random, dataclasses, typing, decimal, bisect, copy, base64, hashlib, csv, "
    "tomllib and time.\n"
    "A host function that fails raises RuntimeError with the error message. Call "
    "done(answer) (or submit_answer(answer)) when the task is complete; code after it does "
    "not run. print() output is returned to you."
)


@attrs.frozen
class PythonMedium(SandboxMedium):
    """Python (Monty) as the medium: A = M + G - W (``max_eval_ms``, ``max_memory_mb``
    and the wards they obey: :class:`~mediums._code.SandboxMedium`)."""

    max_recursion_depth: int = 1000
    expose_loom: bool = True
    """A read-only ``loom`` object with the entity's own history in the sandbox (LOOM-11)."""
    name: str = "python"
    default_tool_choice: ToolChoice = "required"
    fork_strategy: str = "replay"
    """How a fork's (or a resumed entity's) sandbox state is rebuilt (LOOM-4)."""

    def present(self, gates: Sequence[Gate]) -> tuple[ToolDefinition, ...]:
        notes = _NOTES + ("\n" + LOOM_DOC if self.expose_loom else "")
        return (code_tool("Python", TOOL_NAME, gates, notes),)

    async def open(self, wards: WardSet) -> PythonSession:
        eval_ms, memory_mb = self.limits(wards)
        return PythonSession(
            eval_ms, memory_mb, self.max_recursion_depth, expose_loom=self.expose_loom
        )


@attrs.define
class _Outcome:
    records: list[GateCallRecord] = attrs.field(factory=list)
    terminated: bool = False
    value: Any = None
    result: Any = None
    has_result: bool = False
    error: str | None = None


class PythonSession:
    """One entity's sandbox: a Monty worker of its own, checked out on first use."""

    replay_cut_resets = False
    """A code call cut off from outside leaves the feed suspended and it is finished
    off later, keeping the variables; a replay of such a turn does the same."""

    def __init__(
        self, eval_ms: int, memory_mb: int, recursion_depth: int, *, expose_loom: bool = True
    ) -> None:
        self._eval_ms = eval_ms
        self._memory_mb = memory_mb
        self._limits: monty.ResourceLimits = {
            "max_feed_duration_secs": eval_ms / 1000.0,
            "max_memory": memory_mb * 1024 * 1024,
            "max_recursion_depth": recursion_depth,
            "max_suspensions": MAX_SUSPENSIONS,
        }
        self._pool: monty.Monty | None = None
        self._session: monty.MontySession | None = None
        self._worker_pid: int | None = None
        self._pending: monty.SyncSnapshot | None = None
        self._lost_state = False
        self._stubs: dict[str, Callable[..., Any]] = {}
        self._loom_view = LoomView() if expose_loom else None
        self._loom: monty.ClassInstance | None = (
            loom_object(self._loom_view) if self._loom_view is not None else None
        )

    # -- the medium contract --------------------------------------------------

    async def execute(self, response: Response, host: GateHost) -> Execution:
        return await execute_code_calls(
            response, host, self._run_code, lost_state=lambda: self._lost_state
        )

    async def _run_code(self, call: ToolCall, host: GateHost) -> CodeRun:
        text, outcome = await self._run_call(call, host)
        return CodeRun(
            text, tuple(outcome.records), outcome.terminated, outcome.value, outcome.error
        )

    async def replay_call(self, call: ToolCall, host: GateHost) -> bool:
        """Run one recorded code call again (``host`` answers from the loom);
        True when it ended with a successful ``done``."""
        _text, outcome = await self._run_call(call, host)
        return outcome.terminated

    async def replay_reset(self) -> None:
        """The recorded sandbox was lost at this point: lose it here too."""
        self._pending = None
        await self._discard_session()
        self._lost_state = True

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            self._pending = None
            await self._discard_session()
            pool, self._pool = self._pool, None
            if pool is not None:
                await trio.to_thread.run_sync(exit_quietly, pool)

    # -- one code call ----------------------------------------------------------

    async def _run_call(self, call: ToolCall, host: GateHost) -> tuple[str, _Outcome]:
        code = call.arguments.get("code")
        if call.name != TOOL_NAME or not isinstance(code, str):
            problem = (
                f"this circle's medium is Python: call the {TOOL_NAME!r} tool with "
                f'{{"code": "..."}} (got {call.name}({call.arguments_json}))'
            )
            return f"error: {problem}", _Outcome()
        await self._finish_pending()
        names: set[str] = set()
        for g in host.gates:
            names.update((g.name, *g.aliases))
        if self._loom_view is not None:
            self._loom_view.source = history_source(host)
        feed = Feed(frozenset(names), self._eval_ms / 1000.0, self._stubs, self._loom)
        outcome = _Outcome()
        notice = self._take_notice()
        try:
            session = await self._ensure_session()
            step = await self._in_sandbox(start_feed, session, code, feed)
            await self._drive(step, feed, host, outcome)
        except monty.MontyError as exc:
            await self._failed(exc, outcome)
        kind, rendered = "undefined", None
        if outcome.has_result and not outcome.terminated and outcome.error is None:
            kind, rendered = render_result(outcome.result)
        text = observation_text(
            records=outcome.records,
            console=feed.lines(),
            console_truncated=feed.console_truncated,
            kind=kind,
            value=rendered,
            error=outcome.error,
            notice=notice,
        )
        return text, outcome

    async def _drive(
        self, step: monty.SyncSnapshot, feed: Feed, host: GateHost, outcome: _Outcome
    ) -> None:
        """Answer the snapshots that need trio (gate calls, sleeps) until the code ends."""
        try:
            while not isinstance(step, monty.MontyComplete):
                if not isinstance(step, monty.FunctionSnapshot):  # settle never returns these
                    raise AssertionError(f"unexpected snapshot {step!r}")
                if step.is_os_function:
                    answer = await _sleep(step, feed, self._eval_ms)
                else:
                    answer = await self._host_call(step, host, outcome)
                step = await self._in_sandbox(resume_feed, step, answer, feed)
            outcome.result, outcome.has_result = step.output, True
        except monty.MontyError:
            raise
        except BaseException:
            # Cancelled while the sandbox waits on us: keep the suspended feed and
            # finish it off before the next one, so the variables survive. (Cancelled
            # while the code ran, the worker was killed: nothing is left to finish.)
            if not isinstance(step, monty.MontyComplete) and self._session is not None:
                self._pending = step
            raise

    async def _host_call(
        self, snap: monty.FunctionSnapshot, host: GateHost, outcome: _Outcome
    ) -> monty.ExternalResult:
        name = str(snap.function_name)
        args = [from_sandbox(a) for a in snap.args]
        kwargs = {str(k): from_sandbox(v) for k, v in snap.kwargs.items()}
        shown: dict[str, Any] = {"args": args, **({"kwargs": kwargs} if kwargs else {})}
        if outcome.terminated:
            outcome.records.append(
                host.unexecuted(
                    name, shown_arguments(shown), None, "skipped", "skipped: " + STOP_MESSAGE
                )
            )
            return sandbox_error("SystemExit", STOP_MESSAGE)
        found = host.gate(name)
        if found is None:  # settle only hands over the circle's gates
            return sandbox_error("NameError", f"name {name!r} is not defined")
        try:
            call_args = boundary_arguments(name, call_arguments(found, args, kwargs))
        except TypeError as exc:
            outcome.records.append(
                host.unexecuted(name, shown_arguments(shown), None, "error", str(exc))
            )
            return sandbox_error("TypeError", str(exc))
        except ValueBoundaryError as exc:  # the value boundary (cantrip._values)
            outcome.records.append(
                host.unexecuted(name, refused_arguments(shown), None, "error", str(exc))
            )
            return sandbox_error("ValueError", str(exc))
        record = await host.call(name, call_args)
        outcome.records.append(record)
        if record.is_error:
            return sandbox_error("RuntimeError", record.text)
        if host.terminates(name):
            outcome.terminated, outcome.value = True, record.result
            return sandbox_error("SystemExit", STOP_MESSAGE)
        return {"return_value": to_sandbox(record.result)}

    async def _failed(self, exc: monty.MontyError, outcome: _Outcome) -> None:
        """The code ended with an exception: say what happened, in the entity's terms."""
        limits = f"max_eval_ms={self._eval_ms}, max_memory_mb={self._memory_mb}"
        if isinstance(exc, monty.MontyCrashedError):
            await self._discard_session()
            self._lost_state = True
            reason = "time limit exceeded" if exc.timed_out else str(exc)
            outcome.error = (
                f"the code was stopped: {reason} ({limits}); "
                "the sandbox will restart without its state"
            )
            return
        inner = exc.exception()
        if isinstance(inner, SystemExit) and outcome.terminated:
            return  # the stop after done: not an error
        if timed_out(exc):
            await self._discard_session()
            self._lost_state = True
            outcome.error = (
                f"TimeoutError: the code ran longer than max_eval_ms={self._eval_ms} and was "
                "stopped; the sandbox will restart without its state"
            )
            return
        hint = ""
        if isinstance(inner, MemoryError) and "memory limit" in str(inner):
            hint = f" (max_memory_mb={self._memory_mb})"
            if not await self._has_headroom():
                # What the code kept fills the heap: every later code call (done
                # included) would fail the same way. Start afresh (issue 13, item 3).
                await self._discard_session()
                self._lost_state = True
                hint += (
                    "; the variables still fill the memory limit, so the sandbox will "
                    "restart without its state"
                )
        outcome.error = error_text(exc, hint)

    # -- the Monty worker --------------------------------------------------------

    async def _in_sandbox(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking Monty work (code running in the worker) in a trio thread.

        Monty cannot be interrupted from outside, and a thread cannot be cancelled;
        so when this task is cancelled (``timeout_s``, a parent's cancel) the worker
        process is killed, which makes the blocked call return at once, and the
        cancellation goes on within milliseconds instead of when the code's own
        time limit ends (issue 13, item 4). The sandbox is then lost, and the next
        code call says so.
        """
        finished = trio.Event()
        killed = False
        result: list[_T] = []
        failure: list[BaseException] = []

        async def run() -> None:
            with trio.CancelScope(shield=True):
                try:
                    result.append(await trio.to_thread.run_sync(fn, *args))
                except BaseException as exc:  # noqa: BLE001 -- handed to the caller below
                    failure.append(exc)
            finished.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                try:
                    await finished.wait()
                except trio.Cancelled:
                    if not finished.is_set():
                        killed = True
                        self._kill_worker()
                    raise
        finally:
            if killed:  # the blocked call has returned: release the dead session
                await self._discard_session()
        if failure:
            raise failure[0]
        return result[0]

    async def _has_headroom(self) -> bool:
        """After a memory error: can the session still allocate a little? (A bomb whose
        memory was freed leaves it usable, with its variables; a list kept growing in a
        global does not.)"""
        session = self._session
        if session is None:
            return False
        try:
            await self._in_sandbox(probe_headroom, session)
        except monty.MontyError:
            return False
        return True

    @property
    def cut_lost_sandbox(self) -> bool:
        """The last cut (cancellation) killed the worker mid-code: the entity records
        it on the cut turn (``extras["sandbox_lost"]``) and a replay resets there."""
        return self._lost_state and self._session is None

    def _kill_worker(self) -> None:
        pid, self._worker_pid = self._worker_pid, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._pending = None
        self._lost_state = True

    async def _ensure_session(self) -> monty.MontySession:
        if self._session is None:
            if self._pool is None:
                self._pool = await trio.to_thread.run_sync(open_pool)
            session = await trio.to_thread.run_sync(checkout, self._pool, self._limits)
            self._session, self._worker_pid = session, session.worker_pid
        return self._session

    async def _discard_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(exit_quietly, session)

    async def _finish_pending(self) -> None:
        """Run an interrupted feed to its end, answering every gate call with SystemExit."""
        snap, self._pending = self._pending, None
        if snap is None:
            return
        try:
            await self._in_sandbox(drain, snap)
        except monty.MontyError as exc:
            if isinstance(exc, monty.MontyCrashedError) or timed_out(exc):
                await self._discard_session()
                self._lost_state = True
        except RuntimeError:  # the snapshot could not be resumed: the feed is unusable
            await self._discard_session()
            self._lost_state = True

    def _take_notice(self) -> str | None:
        if not self._lost_state:
            return None
        self._lost_state = False
        return (
            "notice: the sandbox was restarted after the previous failure; "
            "variables defined before it are gone"
        )


async def _sleep(snap: monty.FunctionSnapshot, feed: Feed, eval_ms: int) -> monty.ExternalResult:
    """``time.sleep`` on the trio side (cancellable), within the code call's time budget."""
    try:
        seconds = float(snap.args[0]) if snap.args else 0.0
    except (TypeError, ValueError):
        return sandbox_error("TypeError", "sleep() needs a number of seconds")
    if math.isnan(seconds) or seconds < 0:
        return sandbox_error("ValueError", "sleep length must be non-negative")
    if seconds > feed.sleep_left:
        await trio.sleep(feed.sleep_left)
        feed.sleep_left = 0.0
        return sandbox_error("TimeoutError", f"sleeping exceeds max_eval_ms={eval_ms}")
    await trio.sleep(seconds)
    feed.sleep_left -= seconds
    return {"return_value": None}


python = PythonMedium()
