"""The terminal: live progress of casts (``cantrip cast``) and the ``invoke`` prompt.

Both are one more way to reach the same entity (PROD-1): ``cast`` summons,
sends one intent and closes -- what :meth:`Cantrip.cast_async` does -- and
``invoke`` keeps a summoned entity under a supervisor (:class:`EntityServer`)
and sends it one intent per line (ENTITY-5).

Progress is an event sink (spec 7.5), drawn with ``rich`` on stderr when
stderr is a terminal and silent otherwise, so stdout carries only results.
It shows the turn counter, gate calls as they happen, streamed text, and the
tokens (and cost, when the provider reports one) so far.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, TextIO

import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from cantrip._cantrip import Cantrip
from cantrip._core import PauseHandler
from cantrip._errors import CantripError
from cantrip._events import (
    FinalResponse,
    GateProgress,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._outcome import CastResult
from cantrip._redact import redact
from cantrip._server import EntityServer
from cantrip._supervisor import Supervisor
from cantrip._text import TextError, check_text
from cantrip.llm._contract import Response, Usage
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord
from cantrip.loom._summary import cost_text, turn_cost
from cantrip.protocols.terminal._human import TerminalHuman

PREVIEW = 100
"""Response metadata keys under which a provider may report what a query cost."""

_log = logging.getLogger(__name__)


def _short(text: str, limit: int = PREVIEW) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Progress:
    """An event sink that draws a cast's progress on a terminal.

    Use it as a context manager around the cast; while active, a status line
    (turn, gate calls, tokens, cost, time) stays at the bottom, streamed text
    grows above it, and each gate call is printed as it completes. With
    ``enabled=False`` it only counts (nothing is drawn).
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        enabled: bool = True,
        llm: str | None = None,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.llm = llm
        """What the cast's LLM is (provider, model, address): the status line names
        it while a turn waits for its answer (see :func:`describe_llm`)."""
        self._waiting: int | None = None
        """The attempt of the query being waited for, or ``None`` between queries."""
        self.entity_id: str | None = None
        self.turn = 0
        self.calls = 0
        self.failed = 0
        self.usage = Usage()
        self.cost = 0.0
        self.cost_unknown = False
        """A query of this cast had no known cost, so the sum is unknown (as the loom
        and ``cast --json`` say), not the sum of the others."""
        self.started = time.monotonic()
        self._text = ""
        self._thinking = ""
        self._streamed = False
        """Whether this step's message arrived in deltas (else it is shown whole)."""
        self._live: Live | None = None
        self.turns_before = 0
        """The entity's turns before this cast: the counter shows the entity's turn
        number, as the loom counts it (``invoke`` continues one entity cast after cast)."""

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        self.entity_id = None
        self.calls = self.failed = 0
        self.turn = self.turns_before
        self.usage, self.cost, self.cost_unknown = Usage(), 0.0, False
        self._waiting = None
        if self.enabled:
            self._live = Live(
                console=self.console,
                get_renderable=self._render,
                refresh_per_second=8,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._flush_text()
        if self._live is not None:
            self._live.stop()
            self._live = None
            self.console.print(Text(self.status(), style="dim"))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Stop drawing while a human is asked something (the live status line
        would redraw over the prompt), then go on from where it was."""
        live = self._live
        if live is None:
            yield
            return
        self._flush_text()
        live.stop()
        try:
            yield
        finally:
            if self._live is live:
                live.start()

    def status(self) -> str:
        cost = cost_text(None if self.cost_unknown else self.cost)
        waiting = ""
        if self._waiting is not None:
            waiting = f" · waiting for {self.llm or 'the LLM'}" + (
                f" (attempt {self._waiting})" if self._waiting > 1 else ""
            )
        return (
            f"turn {self.turn}{waiting} · {self.calls} gate call(s)"
            + (f", {self.failed} failed" if self.failed else "")
            + f" · {self.usage.total_tokens:,} tokens · {cost} · "
            f"{time.monotonic() - self.started:.1f}s"
        )

    def _render(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self._thinking:
            parts.append(Text(_tail(self._thinking), style="dim italic"))
        if self._text:
            parts.append(Text(_tail(redact(self._text))))
        parts.append(Text("⠿ " + self.status(), style="cyan"))
        return Group(*parts)

    def _print(self, markup: str) -> None:
        if self.enabled:
            self.console.print(markup, highlight=False, soft_wrap=False)

    def _flush_text(self) -> None:
        if self._thinking:
            self._print(f"[dim italic]{escape(redact(self._thinking.strip()))}[/]")
        if self._text:
            self._print(escape(redact(self._text.strip())))
        self._text = self._thinking = ""

    # -- the sink --------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        if self.entity_id is None and event.entity_id:
            self.entity_id = event.entity_id
        mine = not event.entity_id or event.entity_id == self.entity_id
        indent = "" if mine else "  ↳ "
        if isinstance(event, StepStart) and mine:
            self._flush_text()
            self.turn += 1
            self._streamed = False
            self._waiting = 1
        elif isinstance(event, MessageStart) and mine:
            self._waiting = event.attempt
        elif isinstance(event, TextDelta) and mine:
            self._waiting = None
            self._text += event.text
            self._streamed = True
        elif isinstance(event, ThinkingDelta) and mine:
            self._thinking += event.text
            self._streamed = True
        elif isinstance(event, ToolCallEvent) and event.final:
            self._flush_text()
        elif isinstance(event, MessageComplete):
            if mine:
                self._waiting = None
            self._message(event.response, mine)
        elif isinstance(event, UsageEvent):
            self.usage = self.usage + event.usage
        elif isinstance(event, ToolResultEvent):
            self._result(event.record, indent)
        elif isinstance(event, GateProgress):
            of = f"/{event.total:g}" if event.total is not None else ""
            note = f" {_short(redact(event.message), 60)}" if event.message else ""
            self._print(
                f"{indent}  [dim]… {escape(event.gate)} {event.progress:g}{of}{escape(note)}[/]"
            )
        elif isinstance(event, StepComplete) and event.turn is not None:
            turn = event.turn
            usd = turn_cost(turn)  # as recorded: the loom and --json count the same
            if usd is None:
                self.cost_unknown = True
            else:
                self.cost += usd
            if mine:
                self._waiting = None
            if turn.truncated:
                self._print(f"{indent}[yellow]✂ truncated: {escape(turn.reason or '?')}[/]")
        elif isinstance(event, FinalResponse) and not mine:
            self._print(
                f"{indent}[dim]child answered: {escape(_short(redact(str(event.result))))}[/]"
            )

    def _message(self, response: Response, mine: bool) -> None:
        if not mine:
            return
        if not self._streamed:  # an LLM that does not stream: the whole message now
            self._text, self._thinking = response.content or "", response.thinking or ""
        self._flush_text()
        for call in response.tool_calls:
            args = _short(redact(call.arguments_json), 80)
            self._print(f"[bold]→ {escape(call.name)}[/]([dim]{escape(args)}[/])")

    def _result(self, record: GateCallRecord, indent: str) -> None:
        self.calls += 1
        text = escape(_short(redact(record.text)))
        name = escape(record.gate)
        if record.status == "ok":
            self._print(f"{indent}  [green]✓ {name}[/] {text}")
        elif record.status == "error":
            self.failed += 1
            self._print(f"{indent}  [red]✗ {name}[/] {text}")
        else:
            self._print(f"{indent}  [yellow]⊘ {name} {record.status}[/]")


def describe_llm(llm: object) -> str:
    """``provider model at address`` for a status line: the innermost adapter of a
    wrapped LLM (retry, fallback, rate limit), else the LLM's name."""
    seen = 0
    while hasattr(llm, "inner") and seen < 16:
        llm, seen = llm.inner, seen + 1
    provider = getattr(llm, "provider", None)
    model = getattr(llm, "model", None)
    base_url = getattr(llm, "base_url", None)
    if isinstance(provider, str) and isinstance(model, str):
        return f"{provider} {model}" + (f" at {base_url}" if base_url else "")
    return str(getattr(llm, "name", None) or type(llm).__name__)


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def wants_progress(stream: TextIO, quiet: bool) -> bool:
    """Progress is drawn on a terminal only (``--quiet`` turns it off)."""
    return not quiet and stream.isatty()


# -- cast --------------------------------------------------------------------------


async def cast_with_progress(
    spell: Cantrip, intent: str, progress: Progress, on_pause: PauseHandler | None = None
) -> tuple[CastResult | None, bool]:
    """One cast -- summon, send, close, exactly :meth:`Cantrip.cast_async` -- with
    progress, where Ctrl-C cancels the cast (recorded as cancelled).

    Returns the outcome and whether it was interrupted. Cantrip errors propagate.
    """
    interrupted = False
    outcome: CastResult | None = None
    error: BaseException | None = None
    entity = spell.summon(on_event=progress, on_pause=on_pause, pause="wait")
    async with entity:
        with trio.open_signal_receiver(signal.SIGINT) as signals, progress:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        if not entity.cancel():
                            nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                try:
                    outcome = await entity.send(intent)
                except CantripError as exc:
                    error = exc
                nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return outcome, interrupted


# -- invoke ------------------------------------------------------------------------


async def read_lines(fd: int, send: trio.MemorySendChannel[str | None]) -> None:
    """Lines of ``fd``, read in a worker thread (plain ``os.read``, so an abandoned
    read holds no lock at exit); ``None`` marks end of input. Bytes that are not
    UTF-8 survive as lone surrogates, for the reader to refuse (``cantrip._text``)."""
    buffer = b""
    async with send:
        while True:
            chunk = await trio.to_thread.run_sync(os.read, fd, 65536, abandon_on_cancel=True)
            if not chunk:
                if buffer:
                    await send.send(buffer.decode(errors="surrogateescape"))
                await send.send(None)
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                await send.send(line.decode(errors="surrogateescape").rstrip("\r"))


class Invocation:
    """``cantrip invoke``: a long-lived supervised entity and a line prompt.

    Each line is a cast on the same entity; its state accumulates (ENTITY-5).
    Ctrl-C during a cast cancels that cast -- the loom records it as cancelled
    and the entity stays alive; Ctrl-C twice at the prompt, or end of input,
    ends the session. The entity runs as an :class:`EntityServer` under a
    :class:`Supervisor`: a runtime crash is reported, and the entity resumes
    from its last committed turn.
    """

    def __init__(
        self,
        spell: Cantrip,
        *,
        entity_id: str | None = None,
        out: Callable[[str], None],
        err: Console,
        progress: Progress,
        interactive: bool,
        stdin_fd: int = 0,
        on_pause: PauseHandler | Literal["ask"] | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self.spell = spell
        self.out = out
        self.err = err
        self.progress = progress
        self.interactive = interactive
        self.stdin_fd = stdin_fd
        self._lines_send, self._lines = trio.open_memory_channel[str | None](math.inf)
        self._steering: trio.Nursery | None = None
        """Where a running cast's line reader runs (see :meth:`_steer_lines`)."""
        self._typed: list[str] = []
        """Lines the reader took as a cast ended: the next intents."""
        self._eof = False
        if on_pause == "ask":  # the human at this terminal, through the same line reader
            on_pause = TerminalHuman(err, self._lines.receive, progress.held)
        self.server = EntityServer(spell, entity_id=entity_id, on_event=progress, on_pause=on_pause)
        self.grace_s = grace_s
        """On SIGTERM, how long a running cast may finish before it is cut off."""
        self.idle = trio.Event()
        self.idle.set()
        self.casting = False
        self.armed = False
        self.casts = 0
        self.stopping = False

    def _note(self, markup: str) -> None:
        self.err.print(markup, highlight=False, soft_wrap=True)

    def _prompt(self) -> None:
        if self.interactive:
            self.err.print("[bold magenta]cantrip>[/] ", end="")

    async def run(self) -> int:
        server = self.server
        resumed = server.entity_id in self.spell.loom.entities
        supervisor = Supervisor([server.child_spec()], name="invoke")
        lines_send, lines = self._lines_send, self._lines
        finished = trio.Event()

        async def supervise() -> None:
            try:
                await supervisor.run()
            finally:
                finished.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervise)
            await server.ready.wait()
            prior = len(self.spell.loom.entity_turns(server.entity_id))
            how = f"resumed with {prior} turn(s)" if resumed else "summoned"
            self._note(
                f"[dim]entity {server.entity_id} {how}. One intent per line; "
                "Ctrl-C cancels a cast, Ctrl-C twice or Ctrl-D exits.[/]"
            )
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                done = trio.Event()
                nursery.start_soon(read_lines, self.stdin_fd, lines_send)
                nursery.start_soon(self._signals, signals, done)
                async with trio.open_nursery() as loop:
                    loop.start_soon(self._loop, lines, done)
                    await done.wait()
                    loop.cancel_scope.cancel()
            server.close()  # the entity ends normally; its supervisor with it
            with trio.move_on_after(10):
                await finished.wait()
            nursery.cancel_scope.cancel()  # the stdin reader
        if self.interactive:
            self.err.print()
        self._note(f"[dim]entity {server.entity_id}: {self.casts} cast(s) this session[/]")
        return 0

    async def _signals(self, signals: Any, done: trio.Event) -> None:
        async for signum in signals:
            if signum == signal.SIGTERM:
                await self._terminate(done)
                return
            if self.casting:
                self.server.cancel()
            elif self.armed:
                done.set()
                return
            else:
                self.armed = True
                self._note("\n[dim](Ctrl-C again, or Ctrl-D, to exit)[/]")
                self._prompt()

    async def _terminate(self, done: trio.Event) -> None:
        """SIGTERM: no new intents; the running cast gets ``grace_s`` to finish,
        then it is cut off -- recorded with reason ``shutdown`` -- and we exit 0."""
        self._note(f"\n[dim]SIGTERM: finishing (grace {self.grace_s:g} s)[/]")
        self.stopping = True
        if self.casting:
            with trio.move_on_after(self.grace_s):
                await self.idle.wait()
            if self.casting:
                # sticky: the intent may still be on its way to the entity
                self.server.cancel("shutdown", next_cast=True)
                await self.idle.wait()
        done.set()

    async def _loop(self, lines: trio.MemoryReceiveChannel[str | None], done: trio.Event) -> None:
        try:
            async with trio.open_nursery() as steering:
                self._steering = steering
                while True:
                    self._prompt()
                    if self._typed:
                        line: str | None = self._typed.pop(0)
                    elif self._eof:
                        return
                    else:
                        line = await lines.receive()
                    if line is None:
                        return
                    self.armed = False
                    if not line.strip():
                        continue
                    try:
                        intent = check_text(line.strip(), "that line")
                    except TextError as exc:
                        self._note(f"[red]cantrip: {escape(str(exc))}[/]; nothing was cast")
                        continue
                    await self._cast(intent)
        finally:
            self._steering = None
            done.set()

    async def _steer_lines(self, scope: trio.CancelScope) -> None:
        """While a cast runs, a typed line is a message to it: it joins the cast's next
        turn (``Entity.steer``). One typed as the cast ends becomes the next intent."""
        with scope:
            while True:
                line = await self._lines.receive()
                if line is None:
                    self._eof = True
                    return
                text = line.strip()
                if not text:
                    continue
                entity = self.server.entity
                if entity is not None and entity.steer(text):
                    self._note("[dim]sent to the running cast: it joins the next turn[/]")
                else:
                    self._typed.append(line)

    async def _cast(self, intent: str) -> None:
        if self.stopping:
            return
        self.casting = True
        self.idle = trio.Event()
        self.casts += 1
        steer = trio.CancelScope()
        if self._steering is not None and self.interactive and not self.spell.circle.needs_humans:
            # Only a person types while a cast runs: lines piped in are intents, one cast
            # each. (A circle that asks a human reads the typed lines as its answers.)
            self._steering.start_soon(self._steer_lines, steer)
        entity_id = self.server.entity_id
        self.progress.turns_before = len(self.spell.loom.entity_turns(entity_id))
        try:
            with self.progress:
                outcome = await self.server.ask(intent)
        except CantripError as exc:
            self._note(f"[red]cantrip: {escape(redact(str(exc)))}[/]")
            return
        except Exception as exc:  # noqa: BLE001 -- the supervisor restarts it; we report
            self._note(
                f"[red]the entity crashed: {escape(redact(repr(exc)))}; "
                "it resumes from its last recorded turn[/]"
            )
            await self.server.ready.wait()
            return
        finally:
            steer.cancel()
            self.casting = False
            self.idle.set()
        for text in outcome.undelivered:
            self._note(f"[yellow]not delivered[/] (the cast ended first): {escape(text)}")
        if outcome.terminated:
            self.out(redact(outcome.text))
        elif outcome.reason in ("cancelled", "shutdown"):
            self._note("[yellow]cancelled[/] (recorded in the loom); the entity is still here")
        else:
            self._note(f"[yellow]{escape(redact(outcome.summary or 'truncated'))}[/]")


def print_out(text: str) -> None:
    print(text, flush=True)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


__all__ = [
    "Invocation",
    "Progress",
    "cast_with_progress",
    "print_out",
    "read_lines",
    "stderr_console",
    "wants_progress",
]
