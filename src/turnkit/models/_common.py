"""What every adapter needs and no SDK provides: the install hint, tool results as
text, and tool arguments that may not be JSON.

Kept free of SDK imports so ``turnkit.models`` imports without any extra installed.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from typing import Any

from .._values.messages import JsonObject, ToolCall

#: The ``ToolCall.provider_state`` key the engine reads to answer a call with an
#: error instead of running its tool (see ``turnkit._engine.tool_call.input_error``).
INPUT_ERROR = "input_error"
#: How much of an unreadable argument string the model is shown back.
MAX_ECHO_CHARS = 500


#: How providers word a request longer than the context window (Anthropic: "prompt is
#: too long"; OpenAI and compatible servers: "maximum context length", and the like).
_TOO_LONG = re.compile(
    r"prompt is too long|context[ _-]?(length|window)|maximum context|too many tokens", re.I
)


def too_long(status: int, code: str | None, message: str) -> bool:
    """Whether an HTTP error says the request did not fit the model's context window."""
    if code == "context_length_exceeded":
        return True
    return status in (400, 413) and _TOO_LONG.search(message) is not None


#: The HTTP statuses a provider answers with when it is too busy for the call: rate
#: limited (429), unavailable (503), overloaded (Anthropic's 529).
OVERLOADED = frozenset({429, 503, 529})


def retry_after(headers: Any) -> float | None:
    """Seconds the provider asked to wait, from ``retry-after-ms`` or ``retry-after``
    (seconds, or an HTTP date); ``None`` when it said nothing usable."""
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    try:
        if millis is not None:
            return max(0.0, float(millis) / 1000)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def missing_sdk(package: str, extra: str) -> str:
    """The ``ImportError`` text for an adapter whose SDK is not installed."""
    return (
        f"turnkit.models.{extra} needs the {package!r} package, which is not installed; "
        f"install it with: pip install 'turnkit[{extra}]'"
    )


def result_text(result: Any) -> str:
    """A tool result as the text a provider's ``tool_result`` carries: strings as they
    are, anything else as compact JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def arguments_call(call_id: str, name: str, raw: str | None) -> ToolCall:
    """A ``ToolCall`` from the argument text a model streamed.

    Text that is not a JSON object becomes an empty input plus an ``input_error`` the
    engine answers as an error result, so the model reads what went wrong and can call
    again, and the turn goes on.
    """
    text = (raw or "").strip()
    if not text:
        return ToolCall(id=call_id, name=name, input={})
    try:
        value = json.loads(text)
    except ValueError as exc:
        return _unreadable(call_id, name, text, f"not valid JSON ({exc})")
    if not isinstance(value, dict):
        return _unreadable(call_id, name, text, f"a JSON {type(value).__name__}, not an object")
    return ToolCall(id=call_id, name=name, input=value)


def _unreadable(call_id: str, name: str, text: str, why: str) -> ToolCall:
    shown = text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "…"
    problem = (
        f"invalid arguments for {name}: they were {why}, so the tool did not run; call "
        f"{name} again with a JSON object that fits its input schema. Received: {shown}"
    )
    state: JsonObject = {INPUT_ERROR: problem}
    return ToolCall(id=call_id, name=name, input={}, provider_state=state)
