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
