"""The Python medium's sandbox side: the blocking calls into a Monty worker.

Everything here runs in a trio worker thread (``trio.to_thread.run_sync``, see
``PythonSession._in_sandbox`` in :mod:`mediums.python`) and never touches trio or
the gate host: it opens the one-process Monty pool and checks out a session,
starts and resumes a feed (a code call), and answers by itself every suspension
that needs no host call (:func:`settle`: gate names and the ``loom`` object looked
up, refused OS calls, undefined names), stopping at a gate call or a sleep for the
trio side to answer. :class:`Feed` is one code call's state as both sides see it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

import attrs
import pydantic_monty as monty

from mediums._code import LOOM_NAME, HistorySource

MAX_CONSOLE_CHARS = 20_000
STOP_MESSAGE = "done was called; the rest of the code is skipped"
SLEEPS = frozenset({"time.sleep", "asyncio.sleep"})
"""OS calls the trio side answers (a sleep counts against the time budget)."""


class LoomView:
    """What ``loom`` is inside the sandbox: the entity's history, read on demand.

    One per session (the sandbox may keep the name bound across feeds); each
    feed points :attr:`source` at its own history before the code runs.
    """

    def __init__(self) -> None:
        self.source: HistorySource = list

    @property
    def turns(self) -> list[dict[str, Any]]:
        return self.source()

    def thread(self) -> list[dict[str, Any]]:
        return self.source()

    def turn(self, sequence: int) -> dict[str, Any] | None:
        for turn in self.source():
            if turn.get("sequence") == sequence:
                return turn
        return None


def loom_object(view: LoomView) -> monty.ClassInstance:
    return monty.ClassInstance(view, lazy_attrs={"turns"}, allowed_methods={"thread", "turn"})


@attrs.define
class Feed:
    """One code call as the worker thread and the trio side both see it."""

    gate_names: frozenset[str]
    sleep_left: float
    stubs: dict[str, Callable[..., Any]]
    loom: monty.ClassInstance | None = None
    console: list[str] = attrs.field(factory=list)
    console_chars: int = 0
    console_truncated: int = 0
    """Characters of console output cut off (and how many)."""

    def output(self, stream: Literal["stdout", "stderr"], text: str) -> None:
        """Monty's print callback; never raises into the sandbox."""
        room = MAX_CONSOLE_CHARS - self.console_chars
        if len(text) > room:
            self.console_truncated += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self.console.append(text)
            self.console_chars += len(text)

    def lines(self) -> list[str]:
        text = "".join(self.console)
        if text.endswith("\n"):
            text = text[:-1]
        return text.split("\n") if text else []


def open_pool() -> monty.Monty:
    pool = monty.Monty(min_processes=1, max_processes=1)
    pool.__enter__()
    return pool


def checkout(pool: monty.Monty, limits: monty.ResourceLimits) -> monty.MontySession:
    session = pool.checkout(
        script_name="main.py",
        limits=limits,
        os_policy={"sleep": "call_host"},
    )
    session.__enter__()
    return session


def exit_quietly(resource: monty.Monty | monty.MontySession) -> None:
    with contextlib.suppress(monty.MontyError, RuntimeError, OSError):  # a dead worker
        resource.__exit__(None, None, None)


def start_feed(session: monty.MontySession, code: str, feed: Feed) -> monty.SyncSnapshot:
    return settle(session.feed_start(code, print_callback=feed.output), feed)


HEADROOM_PROBE = "len('x' * 262144)"
"""Allocates 256 KB and keeps nothing: fails only when the heap is (nearly) full."""


def probe_headroom(session: monty.MontySession) -> None:
    step = session.feed_start(HEADROOM_PROBE)
    if not isinstance(step, monty.MontyComplete):  # pragma: no cover -- pure code
        raise AssertionError(f"the probe suspended: {step!r}")


def resume_feed(
    snap: monty.FunctionSnapshot, answer: monty.ExternalResult, feed: Feed
) -> monty.SyncSnapshot:
    return settle(snap.resume(answer), feed)


def settle(step: monty.SyncSnapshot, feed: Feed) -> monty.SyncSnapshot:
    """Answer every suspension that needs no host call; stop at one that does."""
    while True:
        if isinstance(step, monty.MontyComplete):
            return step
        if isinstance(step, monty.NameLookupSnapshot):
            name = step.variable_name
            if step.object_id is None and name in feed.gate_names:
                step = step.resume(value=_stub(feed.stubs, name))
            elif step.object_id is None and name == LOOM_NAME and feed.loom is not None:
                step = step.resume(value=feed.loom)
            elif _is_loom(step.object_id, feed):
                step = step.resume_auto()  # an attribute of loom, by its wrapper's policy
            else:
                step = step.resume()  # NameError / AttributeError in the sandbox
        elif isinstance(step, monty.FutureSnapshot):
            # Nothing here answers with a future; settle any that appear as errors.
            error = sandbox_error("RuntimeError", "asynchronous host calls are not supported")
            step = step.resume(dict.fromkeys(step.pending_call_ids, error))
        elif step.is_os_function:
            if str(step.function_name) in SLEEPS:
                return step  # slept on the trio side
            step = step.resume_not_handled()  # files, env, imports: refused by Monty
        elif step.object_id is None and str(step.function_name) in feed.gate_names:
            return step  # a gate call: the trio side calls it
        elif _is_loom(step.object_id, feed):
            step = step.resume_auto()  # a method of loom: reads the history
        else:
            step = step.resume(
                sandbox_error("NameError", f"name {str(step.function_name)!r} is not defined")
            )


def _is_loom(object_id: Any, feed: Feed) -> bool:
    return object_id is not None and feed.loom is not None and str(object_id) == str(feed.loom.id)


def drain(step: monty.SyncSnapshot) -> None:
    """Finish an abandoned feed without calling anything."""
    stop = sandbox_error("SystemExit", STOP_MESSAGE)
    while not isinstance(step, monty.MontyComplete):
        if isinstance(step, monty.NameLookupSnapshot):
            step = step.resume()
        elif isinstance(step, monty.FutureSnapshot):
            step = step.resume(dict.fromkeys(step.pending_call_ids, stop))
        else:
            step = step.resume(stop)


def _stub(stubs: dict[str, Callable[..., Any]], name: str) -> Callable[..., Any]:
    """A host function value for a gate name; Monty calls it back by its ``__name__``."""
    found = stubs.get(name)
    if found is None:

        def gate_function(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("gate stubs are answered by the medium, never called")

        gate_function.__name__ = gate_function.__qualname__ = name
        found = stubs[name] = gate_function
    return found


def timed_out(exc: monty.MontyError) -> bool:
    """Monty's own (uncatchable) time limit, as opposed to a TimeoutError of the code."""
    if isinstance(exc, monty.MontyCrashedError):
        return False
    inner = exc.exception()
    return isinstance(inner, TimeoutError) and "time limit exceeded" in str(inner)


def sandbox_error(exc_type: monty.ExcType, message: str) -> monty.ExternalExceptionData:
    return {"exc_type": exc_type, "message": message}
