"""The JavaScript medium: QuickJS in a supervised worker process (4.1, MEDIUM-2/3).

The engine is quickjs-ng, the maintained fork of QuickJS (``import quickjs``).

The entity writes JavaScript; the circle's gates are synchronous host
functions inside it (``done(x)``, ``submit_answer(x)``, ``read(path)``, ...).
Each entity gets its own worker process and QuickJS context, so variables
persist across its turns (MEDIUM-3) and two entities never share state
(COMP-4).

A gate that fails throws a JS ``Error`` whose message is the error text, so
``try/catch`` sees it; every host call is still recorded, in order. After a
successful ``done`` the rest of the code is skipped (LOOP-3).

Wards (WARD-2; they compose like all wards): ``max_eval_ms`` (default 5000)
bounds the evaluation time of one code call, not counting time spent inside
gates; ``max_memory_mb`` (default 64) bounds the JS heap. Runaway loops,
memory bombs and deep recursion end that call with an error observation; if
the worker had to be killed (time limit, an uncaught out-of-memory error, or a
cast cut off mid-evaluation by cancellation or ``timeout_s``), the next turn
gets a fresh sandbox and the observation says that the variables were lost.

The loom (LOOM-11): unless ``expose_loom=False``, the sandbox has a read-only
global ``loom`` -- ``loom.turns`` (and ``loom.thread()``) is the entity's own
history as plain objects, ``loom.turn(n)`` one turn by sequence -- fetched from
the host when first read in a code call (see :func:`mediums._code.history_source`).

Forks and resumes (LOOM-4/13): :meth:`JsSession.replay_call` runs recorded code
again against a replaying host that answers every host call from the loom, so
a forked or restarted entity's sandbox is rebuilt without calling any gate
(see :mod:`cantrip._replay`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from cantrip.medium import (
    Gate,
    GateCallRecord,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ValueBoundaryError,
    WardSet,
    preview,
    require_extra,
    to_loom_value,
)
from mediums._code import (
    LOOM_DOC,
    CodeRun,
    HistorySource,
    SandboxMedium,
    code_tool,
    execute_code_calls,
    history_source,
    map_arguments,
    observation_text,
    refused_arguments,
)
from mediums._worker import WorkerDied, WorkerProcess
from mediums.base import Execution, GateHost

TOOL_NAME = "js"
WORKER_SCRIPT = str(Path(__file__).with_name("_js_worker.py"))


@attrs.frozen
class JsMedium(SandboxMedium):
    """JavaScript (QuickJS) as the medium: A = M + G - W (``max_eval_ms``, ``max_memory_mb``
    and the wards they obey: :class:`~mediums._code.SandboxMedium`)."""

    stack_kb: int = 1024
    expose_loom: bool = True
    """A read-only ``loom`` object with the entity's own history in the sandbox (LOOM-11)."""
    name: str = "js"
    default_tool_choice: ToolChoice = "required"
    fork_strategy: str = "replay"
    """How a fork's (or a resumed entity's) sandbox state is rebuilt (LOOM-4)."""

    def present(self, gates: Sequence[Gate]) -> tuple[ToolDefinition, ...]:
        notes = (
            "Call done(answer) (or submit_answer(answer)) when the task is complete; code after "
            "it does not run. console.log output is returned to you."
        )
        if self.expose_loom:
            notes += "\n" + LOOM_DOC
        return (code_tool("JavaScript", TOOL_NAME, gates, notes),)

    async def open(self, wards: WardSet) -> JsSession:
        # QuickJS runs in the worker process: a missing extra is said here, in one
        # line, not as the worker's traceback.
        require_extra("js", "the js medium")
        eval_ms, memory_mb = self.limits(wards)
        return JsSession(eval_ms, memory_mb, self.stack_kb, expose_loom=self.expose_loom)


class JsSession:
    """One entity's sandbox: a worker process started on first use."""

    replay_cut_resets = True
    """A code call cut off from outside kills the worker (see ``_run_call``), so a
    replay of such a turn resets the sandbox instead of running it."""

    def __init__(
        self, eval_ms: int, memory_mb: int, stack_kb: int, *, expose_loom: bool = True
    ) -> None:
        self._eval_ms = eval_ms
        self._memory_mb = memory_mb
        self._stack_kb = stack_kb
        self._expose_loom = expose_loom
        self._worker: WorkerProcess | None = None
        self._lost_state = False
        self._gates: tuple[str, ...] = ()

    async def execute(self, response: Response, host: GateHost) -> Execution:
        return await execute_code_calls(
            response, host, self._run_code, lost_state=lambda: self._lost_state
        )

    async def _run_code(self, call: ToolCall, host: GateHost) -> CodeRun:
        text, records, done, value, error = await self._run_call(call, host)
        return CodeRun(text, tuple(records), done, value, error)

    async def replay_call(self, call: ToolCall, host: GateHost) -> bool:
        """Run one recorded code call again (``host`` answers from the loom);
        True when it ended with a successful ``done``."""
        _text, _records, done, _value, _error = await self._run_call(call, host)
        return done

    async def replay_reset(self) -> None:
        """The recorded sandbox was lost at this point: lose it here too."""
        await self._discard_worker()
        self._lost_state = True

    async def _run_call(
        self, call: ToolCall, host: GateHost
    ) -> tuple[str, list[GateCallRecord], bool, Any, str | None]:
        code = call.arguments.get("code")
        if call.name != TOOL_NAME or not isinstance(code, str):
            problem = (
                f"this circle's medium is JavaScript: call the {TOOL_NAME!r} tool with "
                f'{{"code": "..."}} (got {call.name}({call.arguments_json}))'
            )
            return f"error: {problem}", [], False, None, problem
        notice = None
        if self._lost_state:
            notice = (
                "notice: the sandbox was restarted after the previous failure; "
                "variables defined before it are gone"
            )
            self._lost_state = False
        records: list[GateCallRecord] = []
        terminated = False
        value: Any = None
        history: HistorySource | None = history_source(host) if self._expose_loom else None
        try:
            worker = await self._ensure_worker(host)
            await worker.send({"op": "eval", "code": code})
            while True:
                message = await worker.receive()
                if message.get("op") == "loom":
                    await worker.send({"op": "loom", "turns": history() if history else []})
                    continue
                if message.get("op") == "call":
                    reply, record, stop = await self._host_call(message, host, terminated)
                    if record is not None:
                        records.append(record)
                        if stop and not terminated:
                            terminated, value = True, record.result
                    await worker.send(reply)
                    continue
                error = message.get("error")
                if message.get("restart"):
                    await self._discard_worker()
                    self._lost_state = True
                    error = (
                        f"{error} (max_memory_mb={self._memory_mb}); "
                        "the sandbox will restart without its state"
                    )
                text = observation_text(
                    records=records,
                    console=message.get("console") or [],
                    console_truncated=int(message.get("console_truncated") or 0),
                    kind=str(message.get("kind", "undefined")),
                    value=message.get("value"),
                    error=error,
                    notice=notice,
                )
                return text, records, terminated, value, error
        except WorkerDied as death:
            await self._discard_worker()
            self._lost_state = True
            error = (
                f"the code was stopped: {death.reason} (max_eval_ms={self._eval_ms}, "
                f"max_memory_mb={self._memory_mb}); the sandbox will restart without its state"
            )
            text = observation_text(records=records, console=[], error=error, notice=notice)
            return text, records, terminated, value, error
        except BaseException:
            # Cut off mid-exchange (cancelled, timeout_s): the worker may still be
            # running the code or waiting for a gate's reply, so it can never be
            # talked to again -- reusing it would pair the next code with this
            # code's result. Kill it; the next turn starts a fresh sandbox.
            await self._discard_worker()
            self._lost_state = True
            raise

    async def _host_call(
        self, message: dict[str, Any], host: GateHost, terminated: bool
    ) -> tuple[dict[str, Any], GateCallRecord | None, bool]:
        name = str(message.get("gate"))
        raw_args = message.get("args")
        try:  # the value boundary (cantrip._values): the worker is sandboxed code
            if not isinstance(raw_args, list):
                raise ValueBoundaryError(
                    f"{name}() needs its arguments as a list, got {preview(raw_args)}"
                )
            shown: dict[str, Any] = {
                "args": [
                    to_loom_value(a, f"{name}() argument {i + 1}") for i, a in enumerate(raw_args)
                ]
            }
        except ValueBoundaryError as exc:
            shown = refused_arguments(raw_args)
            if not terminated:
                record = host.unexecuted(name, shown, None, "error", str(exc))
                return {"op": "return", "ok": False, "error": str(exc)}, record, False
        found = host.gate(name)
        if terminated:
            record = host.unexecuted(
                name, shown, None, "skipped", "skipped: done was already called"
            )
            return {"op": "return", "ok": False, "stop": True}, record, False
        if found is None:
            record = host.unexecuted(name, shown, None, "error", f"unknown gate {name!r}")
            return {"op": "return", "ok": False, "error": record.result}, record, False
        try:
            kwargs = map_arguments(found, shown["args"])
        except TypeError as exc:
            record = host.unexecuted(name, shown, None, "error", str(exc))
            return {"op": "return", "ok": False, "error": str(exc)}, record, False
        record = await host.call(name, kwargs)
        if record.is_error:
            return {"op": "return", "ok": False, "error": record.text}, record, False
        stop = host.terminates(name)
        reply = {"op": "return", "ok": True, "value": _json_ready(record.result), "stop": stop}
        return reply, record, stop

    async def _ensure_worker(self, host: GateHost) -> WorkerProcess:
        if self._worker is not None:
            return self._worker
        names: list[str] = []
        for g in host.gates:
            names.extend((g.name, *g.aliases))
        config = {
            "eval_ms": self._eval_ms,
            "memory_bytes": self._memory_mb * 1024 * 1024,
            "stack_bytes": self._stack_kb * 1024,
            "gates": names,
            "loom": self._expose_loom and "loom" not in names,  # a gate named loom wins
            "address_space_bytes": max(self._memory_mb * 4, 1024) * 1024 * 1024,
        }
        worker = await WorkerProcess.start(WORKER_SCRIPT, [json.dumps(config)])
        try:
            ready = await worker.receive()
        except WorkerDied:
            await worker.kill()
            raise
        if ready.get("op") != "ready":
            await worker.kill()
            raise WorkerDied(f"unexpected first message {ready!r}", None)
        self._worker = worker
        return worker

    async def _discard_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.kill()

    async def aclose(self) -> None:
        await self._discard_worker()


def _json_ready(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


js = JsMedium()
