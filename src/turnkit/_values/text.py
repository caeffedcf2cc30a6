"""The rules for what no store can keep: NUL, unpaired surrogates, NaN and infinity.

PostgreSQL refuses NUL in text (and in JSON it extracts text from), and no store can
encode a surrogate code point as UTF-8, so a value holding either would fail its
commit and leave the turn wedged at that step, replay after replay. turnkit's
values never hold them: each is replaced by U+FFFD (the Unicode replacement
character) when the value is made, whoever made it (a model, a tool, Slack, an MCP
client, a schedule, the developer's own code). Only the HTTP API refuses them
instead, with a 400 naming the field, since its client can send the text again.

JSON has no NaN or infinity either: a store writes ``null`` for one, and a browser's
``JSON.parse`` refuses the bare ``NaN`` Python's ``json`` would put in a stream. So a
float that is not finite, anywhere in a value, is made ``None`` when the value is
made, as ``JSON.stringify`` does: what the live turn holds is what a replay reads.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic_core import to_json

#: NUL, and every surrogate code point (in a ``str`` a surrogate is always unpaired:
#: a pair decodes to the one character it stands for).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"

_V = TypeVar("_V")


def _bad(text: str) -> bool:
    # Every value of every step passes here: two C-level scans for the usual ASCII
    # text, the regular expression only for text that has something else.
    if "\x00" in text:
        return True
    return not text.isascii() and _SURROGATE.search(text) is not None


def storable(text: str) -> str:
    """``text`` with NUL and unpaired surrogates replaced by U+FFFD (``text`` itself,
    unchanged and uncopied, when it holds none)."""
    if not _bad(text):
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def unstorable(text: str) -> str | None:
    """What in ``text`` no store can keep (``"a NUL character"``, ``"an unpaired
    surrogate"``), or ``None``: for the boundaries that refuse instead."""
    if "\x00" in text:
        return "a NUL character"
    if _SURROGATE.search(text) is not None:
        return "an unpaired surrogate"
    return None


def storable_json(value: Any) -> Any:
    """A JSON-like value (dicts, lists, tuples, strings, numbers) with every string
    in it, keys included, made ``storable`` and every float that is not finite made
    ``None``; the same object when nothing changes (and then it is known clean: see
    ``clean_fields``)."""
    global _clean_a, _clean_b
    if not _needs(value):
        if type(value) not in _UNCACHED:
            _clean_a, _clean_b = value, _clean_a
        return value
    return _cleaned(value)


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, float):
        return value if value - value == 0.0 else None  # (inf - inf and NaN are NaN)
    if isinstance(value, dict):
        return {(storable(k) if isinstance(k, str) else k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_cleaned(v) for v in value)
    return value


def _needs(value: Any) -> bool:
    kind = type(value)
    if kind is str:
        return _bad(value)
    if kind in _SCALARS:
        return False
    if kind is dict or kind is list or kind is tuple or isinstance(value, _CONTAINERS):
        # One pass in C over the whole value instead of a walk in Python: the encoder
        # refuses a surrogate and writes NUL as an escape, NaN and infinity as bare
        # words. (Text that spells out one of them is a false alarm, and only costs
        # the walk that finds nothing.)
        try:
            encoded = to_json(value)
        except Exception:
            return True  # a surrogate, or a value JSON cannot hold: the walk decides
        return _flagged(encoded) is not None
    if isinstance(value, float):
        return value - value != 0.0
    if isinstance(value, str):
        return _bad(value)
    return False


#: What in ``to_json``'s output may be a value no store keeps: NUL's escape, NaN and
#: infinity. (One scan; ``bytes in bytes`` would first try its operand as an int,
#: raising and clearing an error at every check.)
_flagged = re.compile(rb"\\u0000|NaN|Infinity").search
#: What is never unstorable (a float is, when it is not finite).
_SCALARS = frozenset({int, bool, type(None)})
#: What ``storable_json`` does not remember as known clean (see ``clean_fields``).
_UNCACHED = _SCALARS | {float, str}
_CONTAINERS = (dict, list, tuple)


#: The two containers most recently found clean (held, so their ids stay theirs):
#: one step's tool result passes through its message, its stored step and its
#: event, and one call's input through the reply and the transcript, so each is
#: encoded once to be checked, not three times.
_clean_a: Any = None
_clean_b: Any = None


def clean_fields(value: object, names: tuple[str, ...]) -> None:
    """Make the named fields of a frozen dataclass ``value`` storable, in place (for
    its ``__post_init__``)."""
    global _clean_a, _clean_b
    fields = value.__dict__
    for name in names:
        current = fields[name]
        kind = type(current)
        if kind is str:
            # Inline, for the text of every value of every step.
            if "\x00" not in current and (current.isascii() or _SURROGATE.search(current) is None):
                continue
        elif kind in _SCALARS or current is _clean_a or current is _clean_b:
            continue
        elif not _needs(current):
            if kind is not float:  # (as in storable_json: only containers are remembered)
                _clean_a, _clean_b = current, _clean_a
            continue
        object.__setattr__(value, name, _cleaned(current))


def clean_copy(value: _V, **changes: Any) -> _V:
    """A copy of the frozen dataclass ``value`` with ``changes``, made without its
    ``__init__``: for a copy whose every field is storable already (the original's
    own, or a copy of one), which its ``__post_init__`` would only check again."""
    copy: _V = object.__new__(type(value))
    vars(copy).update(vars(value), **changes)
    return copy
