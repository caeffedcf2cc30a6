"""Where the library's own warnings go while a command runs: stderr, one line each.

Without a handler Python would print them with a full traceback (a turn whose
session belongs to another agent, a store outage), beside the command's own
one-line error. ``TURNKIT_DEBUG=1`` brings the tracebacks back; ``turnkit dev``
keeps them, since a server's log is where an unexpected error is read.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from .._channels.printable import printable_line


class _OneLine(logging.Formatter):
    """``turnkit: <message>: <Exception>: <text>``, control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = f"{text}: {type(exc).__name__}: {exc}"
        return "turnkit: " + printable_line(text)


def log_to_stderr(*, tracebacks: bool) -> Callable[[], None]:
    """Send the ``turnkit`` loggers' warnings and errors to stderr; returns the
    function that undoes it."""
    logger = logging.getLogger("turnkit")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    if not (tracebacks or os.environ.get("TURNKIT_DEBUG")):
        handler.setFormatter(_OneLine())
    logger.addHandler(handler)
    return lambda: logger.removeHandler(handler)
