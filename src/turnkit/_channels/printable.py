"""Text that is safe to write to a terminal: stored text shown, never obeyed.

Anything a session holds may have come from a stranger (a message over HTTP, a
model's reply, a tool's result), and a terminal treats some characters as
commands: ``ESC ] 0 ; … BEL`` retitles the window, ``ESC [ 2 J`` clears it, OSC 52
writes the clipboard, a lone carriage return overwrites the line, bidi overrides
reorder what the reader sees. Every human-readable output of the command line and
the terminal channel goes through ``printable``, which shows such characters as
visible escapes instead.
"""

from __future__ import annotations

import re

#: C0 controls but tab and newline, a carriage return not starting a CRLF, DEL, the
#: C1 controls (U+0080 to U+009F: ``U+009B`` is a one-character CSI) and the bidi
#: embeddings, overrides and isolates (U+202A to U+202E, U+2066 to U+2069).
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")


def _visible(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on shown as an escape:
    ``ESC`` becomes ``\\x1b``, ``U+009B`` becomes ``\\u009b``; newlines, tabs and
    CRLF stay as they are. Applying it twice changes nothing more."""
    return _UNSAFE.sub(_visible, text)


_LINE_BREAKS = re.compile("[\t\n\r]")


def printable_line(text: str) -> str:
    """``printable(text)`` on one line: tabs, newlines and carriage returns are shown
    as escapes too, so text put in a log line cannot forge another line."""
    return _LINE_BREAKS.sub(_visible, printable(text))


#: What ``printable`` escapes that ``json.dumps(..., ensure_ascii=False)`` leaves raw.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable_json(encoded: str) -> str:
    """JSON text (as ``json.dumps`` wrote it) with those characters written as
    ``\\uXXXX`` escapes: the very same JSON value, safe to print. (Outside its
    strings JSON is plain ASCII, so every match is inside a string.)"""
    return _RAW_IN_JSON.sub(lambda found: f"\\u{ord(found.group()):04x}", encoded)
