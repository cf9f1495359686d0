"""How a command ends: its exit codes, and the one line a mistake becomes.

Every command of the command line returns one of these codes (``cantrip --help``
lists them), defined once here; the plain error's code comes from
:mod:`cantrip._failure`, which also reports a bug (``EXIT_BUG``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from cantrip._failure import EXIT_ERROR, debug_requested, print_json_error
from cantrip._redact import redact
from cantrip._suggest import without_rule_ids

__all__ = [
    "EXIT_ERROR",
    "EXIT_GUARDRAIL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PAUSED",
    "EXIT_TERMINATED",
    "EXIT_TRUNCATED",
    "EXIT_USAGE",
    "exit_for",
    "fail",
    "json_errors",
]

EXIT_TERMINATED = 0
EXIT_OK = EXIT_TERMINATED
EXIT_TRUNCATED = 2
EXIT_PAUSED = 3
"""``cast --db`` / ``answer --db``: the cast paused for a human and waits, durable in
the database, for ``cantrip answer`` (or any process's ``Dispatcher.answer``)."""
EXIT_GUARDRAIL = 4
"""A guardrail tripped (reason ``guardrail``): the cast was refused, not cut short."""
EXIT_INTERRUPTED = 130
EXIT_USAGE = 2
"""argparse's code for a command line it cannot parse."""


def exit_for(terminated: bool, reason: str | None) -> int:
    """The exit code of a cast that ended (not interrupted, not paused): 0 done, 4 a
    guardrail tripped, 2 any other ward or limit."""
    if terminated:
        return EXIT_TERMINATED
    return EXIT_GUARDRAIL if reason == "guardrail" else EXIT_TRUNCATED


_JSON_ERRORS: ContextVar[bool] = ContextVar("cantrip_json_errors", default=False)
"""Whether the running command was given ``--json`` (set by ``main`` around it), so
every way it fails -- :func:`fail` or an exception reaching ``main`` -- also prints
the JSON error object on stdout."""


@contextmanager
def json_errors(enabled: bool) -> Iterator[None]:
    """Within, failures are also printed as a JSON object on stdout."""
    token = _JSON_ERRORS.set(enabled)
    try:
        yield
    finally:
        _JSON_ERRORS.reset(token)


def fail(message: str) -> int:
    """Say what is wrong in one redacted line (rule ids only with ``--debug``), and
    under ``--json`` as a JSON object on stdout too; the exit code of an error."""
    text = redact(message if debug_requested() else without_rule_ids(message))
    print(f"cantrip: {text}", file=sys.stderr)
    if _JSON_ERRORS.get():
        print_json_error(sys.stdout, kind="error", exit_code=EXIT_ERROR, text=text)
    return EXIT_ERROR
