"""How a command ends: its exit codes, and the one line a mistake becomes.

Every command of the command line returns one of these codes (``cantrip --help``
lists them), defined once here; the plain error's code comes from
:mod:`cantrip._failure`, which also reports a bug (``EXIT_BUG``).
"""

from __future__ import annotations

import sys

from cantrip._failure import EXIT_ERROR, debug_requested
from cantrip._redact import redact
from cantrip._suggest import without_rule_ids

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PAUSED",
    "EXIT_TERMINATED",
    "EXIT_TRUNCATED",
    "EXIT_USAGE",
    "fail",
]

EXIT_TERMINATED = 0
EXIT_OK = EXIT_TERMINATED
EXIT_TRUNCATED = 2
EXIT_PAUSED = 3
"""``cast --db`` / ``answer --db``: the cast paused for a human and waits, durable in
the database, for ``cantrip answer`` (or any process's ``Dispatcher.answer``)."""
EXIT_INTERRUPTED = 130
EXIT_USAGE = 2
"""argparse's code for a command line it cannot parse."""


def fail(message: str) -> int:
    """Say what is wrong in one redacted line (rule ids only with ``--debug``); the
    exit code of an error."""
    text = message if debug_requested() else without_rule_ids(message)
    print(f"cantrip: {redact(text)}", file=sys.stderr)
    return EXIT_ERROR
