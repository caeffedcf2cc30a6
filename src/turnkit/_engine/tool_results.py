"""How a tool's return value or exception becomes the JSON result the model reads."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_json, to_jsonable_python

from .._values.text import storable_json
from .input_errors import ToolInputError

#: The longest error text a model is shown; the rest is cut.
MAX_ERROR_CHARS = 2000


def error_text(exc: BaseException) -> str:
    """``"QuotaError: quota exceeded"``; a plain ``Exception`` (or bad input) has no prefix.

    Never includes a traceback: only the class name and the message.
    """
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {type(exc).__name__}>"
    if type(exc) is Exception or isinstance(exc, ToolInputError):
        text = message
    else:
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def error_result(text: str) -> dict[str, Any]:
    return {"error": text[:MAX_ERROR_CHARS]}


def to_json_result(value: Any) -> Any:
    """The JSON form of a tool's return value (pydantic models, dataclasses, dates, …).

    Text no store can keep (NUL, unpaired surrogates) reads U+FFFD (see
    ``_values.text``); a value that still cannot be encoded (an unknown type) becomes
    an error result the model reads, not a stuck turn.
    """
    jsonable = to_jsonable_python(value)
    stored = storable_json(jsonable)
    if stored is not jsonable:
        # Cleaned: check that what will be stored encodes. (Unchanged, it encoded
        # when storable_json checked it; a JSON scalar always does.)
        to_json(stored)
    return stored
