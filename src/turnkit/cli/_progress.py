"""Progress lines for the command line's long reads, on stderr and only on a terminal.

A person waiting on ``turnkit show`` of a session with 100,000 messages wants to see
that something is happening; a script piping the output, a log file or a test wants
nothing but the result. So progress is written only when stderr is a terminal, on
one line that is rewritten in place and erased when the work is done.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .._channels.printable import printable

#: Rewrites closer together than this are skipped: a terminal cannot show them anyway.
MIN_INTERVAL = 0.1
_ERASE = "\r\x1b[K"


class Progress:
    """One rewritable status line; silent unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self._stream)
        self._shown = False
        self._last = 0.0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text``, unless the previous line went out a moment ago (``force``
        shows it anyway: for the line announcing a single long read)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and self._shown and now - self._last < MIN_INTERVAL:
            return
        self._stream.write(f"{_ERASE}{printable(text)}")
        self._stream.flush()
        self._shown, self._last = True, now

    def done(self) -> None:
        """Erase the line, so the result (or an error) starts on a clean one."""
        if self._shown:
            self._stream.write(_ERASE)
            self._stream.flush()
            self._shown = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
