"""How the command line reports a failure: one line for the user's mistakes, a
traceback for cantrip's own bugs (issue 20).

The distinction is by exception type, decided here once for every command:
what a user can cause by what they type, pipe or point cantrip at -- a
:class:`~cantrip.CantripError` (bad spec, LLM failure, damaged or foreign loom
file), text that is not UTF-8 (:class:`~cantrip._text.TextError`), a file
that is missing, unreadable or a folder (:class:`OSError`), a database file
SQLite cannot read -- is one redacted line, ``cantrip: <what is wrong>``, exit
1. Anything else reaching the top of a command is a bug: its traceback is
printed (redacted) with a line that says so, exit 70. Trio's exception groups
are looked through: a group of user errors is reported as its first one.
``debug`` prints the traceback of user errors too.

A reader that went away (``cantrip loom X list | head``) is no failure: the command
stops writing and exits quietly, as a process killed by SIGPIPE would (141), for
every command (:func:`closed_pipe`).

A command given ``--json`` also prints the failure on stdout, as one JSON object
(:func:`print_json_error`), so a script reading stdout is told what went wrong
instead of reading nothing (issue 47.6).
"""

from __future__ import annotations

import json
import os
import select
import sqlite3
import sys
import traceback
from typing import Any, TextIO

from cantrip._errors import CantripError, ConstructionError
from cantrip._redact import redact
from cantrip._suggest import without_rule_ids
from cantrip._text import TextError

EXIT_ERROR = 1
EXIT_BUG = 70
EXIT_PIPE = 128 + 13
"""What a shell reports for a process its reader left (SIGPIPE)."""


def stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``| head``): only
    then is a ``BrokenPipeError`` the user's doing, not a broken socket to a server."""
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else -1
    except (OSError, ValueError):
        return False
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def closed_pipe() -> int:
    """Stop quietly: standard output's reader went away. Output is pointed at
    ``/dev/null`` so the interpreter's last flush of what is buffered fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]
    finally:
        os.close(devnull)
    return EXIT_PIPE


def is_closed_pipe(exc: BaseException) -> bool:
    found = leaves(exc)
    return all(isinstance(leaf, BrokenPipeError) for leaf in found) and stdout_gone()


def debug_requested(args: Any = None) -> bool:
    """``--debug`` on the command line, or ``CANTRIP_DEBUG`` set to anything but 0/false/no."""
    if getattr(args, "debug", False):
        return True
    return os.environ.get("CANTRIP_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return False  # how cantrip used SQLite, not what the file holds
    return isinstance(exc, CantripError | TextError | OSError | sqlite3.DatabaseError)


def message(exc: BaseException, *, debug: bool = False) -> str:
    """One line saying what is wrong, redacted; spec rule ids only with ``debug``."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        text = f"{where}{exc.strerror}"
    elif isinstance(exc, sqlite3.DatabaseError):
        text = (
            f"the database cannot be read ({exc}); if it is a loom, 'cantrip loom FILE check' "
            "says what is readable and 'cantrip loom FILE recover NEW.db' copies its complete "
            "turns into a new file"
        )
    else:
        text = str(exc) or type(exc).__name__
    if not debug:
        text = without_rule_ids(text)
    return redact(" ".join(text.split()))


def problem_lines(exc: BaseException, *, debug: bool = False) -> list[str]:
    """What to print for a user's mistake: one line, or -- for a spec with several
    problems -- a heading and one line per problem, so all are fixed in one pass."""
    if isinstance(exc, ConstructionError) and len(exc.problems) > 1:
        items = [ConstructionError(p) for p in exc.problems]
        return [
            f"cantrip: {len(items)} problems (all of them, so you can fix them in one pass):",
            *(f"  - {message(item, debug=debug)}" for item in items),
        ]
    return [f"cantrip: {message(exc, debug=debug)}"]


def print_json_error(
    out: TextIO, *, kind: str, exit_code: int, text: str, problems: list[str] | None = None
) -> None:
    """The ``--json`` form of a failure, one line on ``out``:
    ``{"error": {"kind", "exit_code", "message", "problems"}}``. ``kind`` is ``"error"``
    (the user's input) or ``"bug"`` (cantrip's); ``problems`` lists
    every problem (one item unless a spec has several). The texts are already redacted."""
    body = {"kind": kind, "exit_code": exit_code, "message": text, "problems": problems or [text]}
    print(json.dumps({"error": body}), file=out, flush=True)


def report(
    exc: BaseException, *, debug: bool, stream: TextIO, json_out: TextIO | None = None
) -> int:
    """Print ``exc`` for a user (see the module docstring), and as a JSON object on
    ``json_out`` when given (``--json``); the exit code."""
    if is_closed_pipe(exc):
        return closed_pipe()
    found = leaves(exc)
    if all(is_user_error(leaf) for leaf in found):
        if debug:
            stream.write(redact("".join(traceback.format_exception(exc))))
        lines = problem_lines(found[0], debug=debug)
        for line in lines:
            print(line, file=stream)
        if json_out is not None:
            problems = [line.removeprefix("  - ") for line in lines[1:]] or None
            text = lines[0].removeprefix("cantrip: ")
            print_json_error(json_out, kind="error", exit_code=EXIT_ERROR, text=text,
                             problems=problems)  # fmt: skip
        return EXIT_ERROR
    bug = next(leaf for leaf in found if not is_user_error(leaf))
    stream.write(redact("".join(traceback.format_exception(exc))))
    text = (
        f"internal error -- this is a bug in cantrip, not in your input; please "
        f"report it with the traceback above ({type(bug).__name__}: {message(bug)})"
    )
    print(f"cantrip: {text}", file=stream)
    if json_out is not None:
        print_json_error(json_out, kind="bug", exit_code=EXIT_BUG, text=text)
    return EXIT_BUG
