"""The JavaScript sandbox worker: QuickJS in its own process.

Run by :mod:`mediums.js` as ``python -m mediums._js_worker``; it speaks JSON
lines on stdin/stdout and never touches anything else:

* host -> worker ``{"op": "eval", "code": ...}``; the worker evaluates it in
  the one long-lived QuickJS context (variables persist, MEDIUM-3);
* while evaluating, every host function call goes out as ``{"op": "call",
  "gate": name, "args": [...]}`` and blocks until ``{"op": "return", ...}``
  comes back -- so gates are synchronous functions inside JS;
* when the code finishes (pending Promise jobs included): ``{"op": "result",
  ...}`` with the last value, console output and any uncaught error;
  ``"restart": true`` when that error was running out of memory, after which
  the context is not trusted and the host replaces the worker;
* when the code reads the global ``loom`` (LOOM-11, if the host enabled it):
  ``{"op": "loom"}`` out, ``{"op": "loom", "turns": [...]}`` back, once per
  evaluation; every read hands the code fresh copies, so nothing it does to
  them reaches the loom.

Limits are enforced by the operating system, not by the host's clock: an
interval timer (``SIGALRM``, default action: terminate) bounds evaluation
time and is paused while a host call is outstanding, so a gate's own latency
never counts; QuickJS's allocator limit turns a memory bomb into a catchable
``out of memory`` error (left uncaught, the host restarts the sandbox);
``RLIMIT_AS`` backs it up; the stack limit turns
runaway recursion into a ``stack overflow`` error. The context has no
``std``/``os`` modules: host functions are the only way out.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any, BinaryIO

import quickjs

_PRELUDE = r"""
var __cantrip_stop = new Error("__cantrip_stop__: done was called; the rest is skipped");
function __cantrip_call(name, args) {
  var reply = JSON.parse(__cantrip_host(name, JSON.stringify(args)));
  if (reply.stop) { throw __cantrip_stop; }
  if (!reply.ok) { throw new Error(reply.error); }
  return reply.value;
}
var console = (function () {
  function show(x) {
    if (typeof x === 'string') return x;
    try { var s = JSON.stringify(x); return s === undefined ? String(x) : s; }
    catch (e) { return String(x); }
  }
  function log() { __cantrip_console(Array.prototype.map.call(arguments, show).join(' ')); }
  return {log: log, info: log, warn: log, error: log, debug: log};
})();
"""

_LOOM = r"""
(function () {
  function load() { return JSON.parse(__cantrip_loom()); }
  var view = {};
  Object.defineProperty(view, 'turns', { get: load, enumerable: true });
  view.thread = function () { return load(); };
  view.turn = function (sequence) {
    var turns = load();
    for (var i = 0; i < turns.length; i++) {
      if (turns[i].sequence === sequence) { return turns[i]; }
    }
    return null;
  };
  Object.freeze(view);
  Object.defineProperty(globalThis, 'loom', { value: view, writable: false, configurable: false });
})();
"""

MAX_CONSOLE_CHARS = 20_000
MAX_ERROR_CHARS = 4_000
OUT_OF_MEMORY = "InternalError: out of memory"


class Worker:
    def __init__(self, inp: BinaryIO, out: BinaryIO, eval_ms: int) -> None:
        self.inp = inp
        self.out = out
        self.eval_s = eval_ms / 1000.0
        self.remaining = self.eval_s
        self.console: list[str] = []
        self.console_chars = 0
        self.console_cut = 0
        self.stopped = False
        self.loom_json: str | None = None
        self.ctx = quickjs.Context()

    def setup(
        self, gates: list[str], memory_bytes: int, stack_bytes: int, loom: bool = False
    ) -> None:
        self.ctx.set_memory_limit(memory_bytes)
        self.ctx.set_max_stack_size(stack_bytes)
        self.ctx.add_callable("__cantrip_host", self.host_call)
        self.ctx.add_callable("__cantrip_console", self.console_line)
        self.ctx.eval(_PRELUDE)
        if loom:
            self.ctx.add_callable("__cantrip_loom", self.loom_data)
            self.ctx.eval(_LOOM)
        for name in gates:
            self.ctx.eval(
                f"function {name}() {{ return __cantrip_call({json.dumps(name)}, "
                "Array.prototype.slice.call(arguments)); }"
            )

    # -- host functions (must never raise into QuickJS) -----------------------

    def host_call(self, name: str, args_json: str) -> str:
        try:  # code may call __cantrip_host itself, with anything
            args = json.loads(args_json)
        except (TypeError, ValueError, RecursionError) as exc:
            problem = f"{name}() arguments could not be read ({type(exc).__name__})"
            return json.dumps({"ok": False, "error": problem})
        self.remaining = _pause_timer()
        try:
            self.send({"op": "call", "gate": str(name), "args": args})
            reply = self.receive()
        finally:
            _arm_timer(self.remaining)
        if reply.get("stop"):
            self.stopped = True
        return json.dumps({k: reply.get(k) for k in ("ok", "value", "error", "stop")}, default=str)

    def loom_data(self) -> str:
        """The entity's history as JSON text, asked of the host once per evaluation."""
        if self.loom_json is None:
            self.remaining = _pause_timer()
            try:
                self.send({"op": "loom"})
                reply = self.receive()
            finally:
                _arm_timer(self.remaining)
            self.loom_json = json.dumps(reply.get("turns") or [], default=str)
        return self.loom_json

    def console_line(self, text: str) -> None:
        if self.stopped:
            return  # code after done (reached through a catch) has no visible effect
        room = MAX_CONSOLE_CHARS - self.console_chars
        if len(text) > room:  # one 30 MB line must not cross the pipe (issue 13, item 2)
            self.console_cut += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self.console.append(text)
            self.console_chars += len(text)

    # -- protocol -------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message, default=str).encode() + b"\n")
        self.out.flush()

    def receive(self) -> dict[str, Any]:
        line = self.inp.readline()
        if not line:
            os._exit(0)  # the host went away
        message: dict[str, Any] = json.loads(line)
        return message

    def evaluate(self, code: str) -> dict[str, Any]:
        self.console, self.console_chars, self.console_cut = [], 0, 0
        self.stopped = False
        self.loom_json = None
        self.remaining = self.eval_s
        _arm_timer(self.remaining)
        error = None
        value: Any = None
        kind = "undefined"
        try:
            try:
                raw = self.ctx.eval(code)
                kind, value = _convert(raw)
            except quickjs.JSException as exc:
                error = self.describe(exc)
            try:
                # Promise jobs (then-callbacks, async functions, import()) run now,
                # still under the time limit, as they would when a script ends.
                while self.ctx.execute_pending_job():
                    pass
            except quickjs.JSException as exc:
                error = error or self.describe(exc)
        finally:
            _pause_timer()
        stopped = self.stopped
        if stopped:
            kind, value = "undefined", None
        out_of_memory = error is not None and error.startswith(OUT_OF_MEMORY)
        if not out_of_memory and not self.has_headroom():
            # The code caught an out-of-memory error and kept what filled the heap:
            # every later call (done included) would fail. Restart now (issue 13, item 3).
            error, out_of_memory = OUT_OF_MEMORY + " (the variables fill the heap)", True
        return {
            "op": "result",
            "kind": kind,
            "value": value,
            "error": error,
            "stopped": stopped,
            "console": self.console,
            "console_truncated": self.console_cut,
            # The heap is exhausted by what the code kept: the context cannot be
            # trusted any more (QuickJS even fails to report later errors).
            "restart": out_of_memory,
        }

    def describe(self, exc: quickjs.JSException) -> str | None:
        """The one-line error of an uncaught exception; None for done's own stop."""
        text = str(exc).strip()
        if self.stopped and "__cantrip_stop__" in text:
            return None
        if "stack overflow" in text or "Maximum call stack size exceeded" in text:
            return "RangeError: stack overflow (recursion too deep)"
        unshowable = "Failed obtaining QuickJS error string" in text
        if text.startswith(OUT_OF_MEMORY) or (
            (text == "null" or unshowable) and self.heap_exhausted()
        ):
            # QuickJS throws null when it runs out of memory while building the error,
            # and then cannot even turn later errors into strings.
            return OUT_OF_MEMORY
        if unshowable:
            return "Error: uncaught exception whose value cannot be shown (its toString threw)"
        line = text.splitlines()[0] if text else "Error"
        if len(line) > MAX_ERROR_CHARS:
            line = f"{line[:MAX_ERROR_CHARS]}... [{len(line) - MAX_ERROR_CHARS} characters cut]"
        return line

    def has_headroom(self) -> bool:
        """Can the heap still take 256 KB? (Cheap: one allocation, freed at once;
        ``memory()`` walks the whole heap.)"""
        try:
            self.ctx.eval("void new ArrayBuffer(262144)")
        except quickjs.JSException:
            return False
        return True

    def heap_exhausted(self) -> bool:
        usage = self.ctx.memory()
        return bool(usage["malloc_size"] >= 0.9 * usage["malloc_limit"] > 0)

    def serve(self) -> None:
        while True:
            message = self.receive()
            if message.get("op") == "eval":
                self.send(self.evaluate(str(message.get("code", ""))))
            elif message.get("op") == "exit":
                return


def _convert(raw: Any) -> tuple[str, Any]:
    """(type name, JSON-ready value) of an evaluation result."""
    if raw is None:
        return "undefined", None
    if isinstance(raw, bool):
        return "boolean", raw
    if isinstance(raw, int | float):
        return "number", raw
    if isinstance(raw, str):
        return "string", raw
    if isinstance(raw, quickjs.Object):
        text = raw.json()
        try:
            return ("array" if text.startswith("[") else "object"), json.loads(text)
        except (TypeError, ValueError, RecursionError):
            return "object", str(text)[:1000]
    return type(raw).__name__, str(raw)


def _arm_timer(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def _pause_timer() -> float:
    remaining, _interval = signal.setitimer(signal.ITIMER_REAL, 0)
    return float(remaining)


def main() -> None:
    config = json.loads(sys.argv[1])
    address_space = int(config.get("address_space_bytes", 0))
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing but the protocol may reach the host's pipe
    worker = Worker(inp, out, int(config["eval_ms"]))
    worker.setup(
        list(config["gates"]),
        int(config["memory_bytes"]),
        int(config["stack_bytes"]),
        bool(config.get("loom", False)),
    )
    worker.send({"op": "ready"})
    worker.serve()


if __name__ == "__main__":
    main()
