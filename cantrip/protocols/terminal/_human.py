"""Answering pauses from a terminal, or by a standing rule (``--approve-all`` / ``--deny-all``).

A front end gives its entity an ``on_pause`` handler (``cantrip._core.PauseHandler``):
the entity waits in place while the handler asks its human and returns the
:class:`~cantrip.Decision`. The terminal handler shows the call -- gate and
pretty-printed arguments, or the question -- and reads the answer a line at a
time from whatever source the command already reads (``cast``: stdin;
``invoke``: its line reader), so no two readers compete for the terminal.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.markup import escape

from cantrip._approval import Decision, Pause
from cantrip._elicit import AnswerError, form_content
from cantrip._redact import redact

ReadLine = Callable[[], Awaitable[str | None]]
"""The next line the human typed, or ``None`` at end of input."""


def standing_rule(approve: bool) -> Callable[[Pause], Awaitable[Decision]]:
    """``--approve-all`` / ``--deny-all``: every pause answered without asking.

    A question cannot be approved; with ``--approve-all`` it is declined with a
    reason the model sees, so the loop goes on."""

    async def decide(pause: Pause) -> Decision:
        if not approve:
            return Decision.deny("denied by --deny-all")
        if pause.kind == "question":
            return Decision.deny("no human is attached (--approve-all answers approvals only)")
        return Decision.approve()

    return decide


APPROVAL_CHOICES = "[y]es / [n]o / [a]lways for this gate / [e]dit the arguments"
"""The approval menu, printed as is (escaped: rich markup would read ``[y]`` as a tag)."""


class TerminalHuman:
    """Asks on a terminal: [y]es / [n]o / [a]lways for this gate / [e]dit.

    ``hold`` is entered around each question: a live progress display stops
    drawing there (:meth:`Progress.held`), so its status line cannot overwrite
    the prompt the human is typing at."""

    def __init__(
        self,
        console: Console,
        read_line: ReadLine,
        hold: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        self.console = console
        self.read_line = read_line
        self.hold = hold or contextlib.nullcontext

    async def __call__(self, pause: Pause) -> Decision:
        with self.hold():
            if pause.kind == "question":
                return await self._question(pause)
            return await self._approval(pause)

    def _say(self, markup: str) -> None:
        self.console.print(markup, highlight=False, soft_wrap=True)

    async def _ask(self, prompt: str) -> str | None:
        self.console.print(prompt, end="", highlight=False)
        return await self.read_line()

    async def _question(self, pause: Pause) -> Decision:
        if pause.origin is not None:
            return await self._elicitation(pause)
        self._say(f"\n[bold cyan]the entity asks:[/] {escape(redact(pause.question or ''))}")
        line = await self._ask("[bold]answer>[/] ")
        if line is None:
            return Decision.deny("no answer (end of input)")
        return Decision.answer(line)

    async def _elicitation(self, pause: Pause) -> Decision:
        """A question from outside the entity (an MCP server, during a call of
        ``pause.gate``): a form to fill, or a page to open. An empty line declines."""
        who = escape(f"{pause.origin} (during {pause.gate})")
        self._say(f"\n[bold cyan]{who} asks:[/] {escape(redact(pause.question or ''))}")
        if pause.url is not None:
            self._say(f"open this page to go on: [underline]{escape(pause.url)}[/]")
            prompt = "[bold]press Enter to decline, or type ok once done>[/] "
        else:
            fields = (pause.schema or {}).get("properties") or {}
            described = ", ".join(
                f"{name} ({field.get('type', 'value')})" if isinstance(field, dict) else name
                for name, field in fields.items()
            )
            self._say(f"[dim]the form: {escape(described)}; an empty line declines[/]")
            prompt = "[bold]answer>[/] "
        while True:
            line = await self._ask(prompt)
            if line is None:
                return Decision.deny("no answer (end of input)")
            if not line.strip():
                return Decision.deny("declined at the terminal")
            if pause.schema is None:
                return Decision.answer(line)
            try:
                form_content(pause.schema, line)
            except AnswerError as exc:
                self._say(f"[red]{escape(str(exc))}[/]")
                continue
            return Decision.answer(line)

    async def _approval(self, pause: Pause) -> Decision:
        arguments = json.dumps(dict(pause.args), indent=2, ensure_ascii=False, default=str)
        self._say(
            f"\n[bold yellow]approval needed:[/] [bold]{escape(pause.gate)}[/]"
            f"\n{escape(redact(arguments))}"
        )
        while True:
            line = await self._ask(f"[bold]{escape(APPROVAL_CHOICES)}>[/] ")
            if line is None:
                return Decision.deny("no answer (end of input)")
            choice = line.strip().lower()
            if choice in ("y", "yes"):
                return Decision.approve()
            if choice in ("a", "always"):
                return Decision.approve(always=True)
            if choice in ("n", "no"):
                reason = await self._ask("[bold]reason (optional)>[/] ")
                return Decision.deny((reason or "").strip() or None)
            if choice in ("e", "edit"):
                edited = await self._edit(pause)
                if edited is not None:
                    return edited
                continue
            self._say("[dim]type y, n, a or e[/]")

    async def _edit(self, pause: Pause) -> Decision | None:
        current = json.dumps(dict(pause.args), ensure_ascii=False, default=str)
        self._say(
            f"[dim]editing the arguments of {escape(pause.gate)}: type them as one line of "
            "JSON and press Enter (an empty line goes back to the choices). Now:[/]\n"
            f"{escape(redact(current))}"
        )
        line = await self._ask("[bold]new arguments (JSON)>[/] ")
        if line is None or not line.strip():
            return None
        try:
            args = json.loads(line)
        except json.JSONDecodeError as exc:
            self._say(f"[red]not JSON: {escape(str(exc))}[/]")
            return None
        if not isinstance(args, dict):
            self._say('[red]the arguments are a JSON object, e.g. {"path": "a.txt"}[/]')
            return None
        return Decision.edit(args)
