"""A client's bad request is logged at DEBUG, in one line: the client's fault, not the server's.

Why: a server's log at WARNING and above is for what its operator must look at. A
library that logs every malformed request it refuses at ERROR, with a traceback
(the a2a-sdk's JSON-RPC dispatcher does), lets any client that can reach the
server flood that log -- and the traceback quotes what the client sent. The
client gets its error in the protocol's shape all the same; the log keeps a
DEBUG line naming what was refused, without the request's content.

A fault of the server itself (an exception in cantrip's own code) is no client's
fault: only the records a classifier names are changed, everything else passes as
it was logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

Classifier = Callable[[logging.LogRecord], "str | None"]
"""What a library's record says a client did wrong (None: not a client's fault)."""


class ClientFaults(logging.Filter):
    """On a library's logger: the records ``classify`` names become one DEBUG line."""

    def __init__(self, label: str, classify: Classifier) -> None:
        super().__init__()
        self.label = label
        self.classify = classify

    def filter(self, record: logging.LogRecord) -> bool:
        what = self.classify(record)
        if what is None:
            return True
        record.msg, record.args = "%s: a client's request refused (%s)", (self.label, what)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info = record.exc_text = record.stack_info = None
        # The logger let it through at its old level; handlers only compare levels.
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def demote_client_faults(logger_names: tuple[str, ...], label: str, classify: Classifier) -> None:
    """Put a :class:`ClientFaults` filter on each logger (once: a server started again
    in the same process adds none)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientFaults) for f in logger.filters):
            logger.addFilter(ClientFaults(label, classify))
