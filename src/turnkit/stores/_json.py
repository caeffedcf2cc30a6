"""How every store writes a value as JSON: one function, two encoders behind it.

Each step's commit encodes its rows (the message, the step's memo, the events); on
the engine's own path that was ~18% of a model+tool pair's instructions with
pydantic's ``to_json``, which infers each value's type as it goes. ``orjson``
writes the same bytes for the plain JSON values turnkit makes (dicts with str keys,
lists, tuples, str, int, float, bool, None) about four times faster. Anything else
(a dataclass, a date, a ``str`` subclass, an int past 64 bits, a set) orjson is told
to refuse, and pydantic writes it exactly as before, or refuses it with its own
words. ``tests/stores/test_json_encoding.py`` holds the two to the same bytes.

JSON has no NaN or infinity: both encoders write ``null`` for one (turnkit's values
never hold them: see ``_values.text``).

A store that keeps the bytes themselves (the memory store) takes ``kept_json_bytes``:
orjson builds its output in a 1 KiB buffer of the C heap and shrinks it in place,
and a 300-byte row kept that way left the heap ~1 KiB bigger each time (the
remainder too small for the next buffer): a 100-pair turn touched ~300 new pages,
~3 page faults a pair, dearer than the encoding saved. The copy goes to Python's
small-object allocator, sized to its content.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import to_json

#: orjson takes plain JSON values only; the rest goes to pydantic.
_PLAIN_ONLY = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON; pydantic's ``PydanticSerializationError`` (a
    ``ValueError``) if it is not JSON at all."""
    try:
        return orjson.dumps(value, option=_PLAIN_ONLY)
    except TypeError:  # (orjson.JSONEncodeError is one)
        return to_json(value, inf_nan_mode="null")


def kept_json_bytes(value: Any) -> bytes:
    """``json_bytes(value)`` as bytes to keep: orjson's output copied to the size of
    its content (see the module's docstring)."""
    try:
        encoded = orjson.dumps(value, option=_PLAIN_ONLY)
    except TypeError:
        return to_json(value, inf_nan_mode="null")
    return b"".join((encoded, b""))  # (a new bytes object: two parts are always copied)
