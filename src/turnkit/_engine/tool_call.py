"""Running one tool call: local tools inside a transaction, remote ones awaited outside.

These functions decide only what a call *returned*; committing it is the engine's
job. A tool exception becomes an error result, ``FatalToolError`` fails the turn,
and a passing failure of the store's database fails the step unrecorded.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from .._errors import FatalToolError
from .._seams.store import StoreHandle
from .._values.messages import ToolCall
from .._values.turns import TurnFailure
from .context import ToolContext
from .tool_results import error_result, error_text, to_json_result
from .tools import Tool


class ToolRaised(Exception):
    """Internal: a local tool raised, so its transaction must roll back before the
    error is recorded in a transaction of its own."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


#: What most tools return: never awaitable, so not asked (an ABC check costs).
_PLAIN = (dict, list, str, int, float, bool, type(None))
#: The JSON values that hold others (and so are copied).
_NESTING = (dict, list)


def copy_input(value: Any) -> Any:
    """A private copy of a JSON input, so a tool that mutates it cannot change the
    committed transcript (and make the next model call differ from a replay)."""
    if isinstance(value, dict):
        # A copy in C, then only what nests copied again (no comprehension: a frame
        # of its own, for what is most often a flat dict). Replacing a key's value
        # leaves the dict's size, so iterating it stays valid.
        copy = value.copy() if type(value) is dict else dict(value)
        for k, v in copy.items():
            if isinstance(v, _NESTING):
                copy[k] = copy_input(v)
        return copy
    if isinstance(value, list):
        return [copy_input(v) if isinstance(v, _NESTING) else v for v in value]
    return value


#: The ``ToolCall.provider_state`` key by which an adapter reports that the model's
#: arguments could not be read (not JSON, say): the call is answered with that
#: text as an error result the model can correct, and its tool never runs.
INPUT_ERROR_KEY = "input_error"


def input_error(call: ToolCall) -> str | None:
    """Why the adapter could not read this call's arguments, or ``None`` if it could."""
    state = call.provider_state
    problem = state.get(INPUT_ERROR_KEY) if state else None
    return problem if isinstance(problem, str) and problem else None


def transient(handle: StoreHandle, exc: BaseException) -> bool:
    """Whether a local tool's exception is the store's database failing for a passing
    reason (``handle.transient``), checked on it and on the causes it was raised
    ``from``: a tool that wraps a lock timeout in an error of its own still did not
    answer. Such a step is failed unrecorded, so a redelivery runs the tool again."""
    check = getattr(handle, "transient", None)  # (a handle written before it existed)
    seen: BaseException | None = exc
    for _ in range(16):  # a cause chain is short; never loop on a cycle
        if seen is None or check is None:
            return False
        if check(seen):
            return True
        seen = seen.__cause__
    return False


def fatal(tool: Tool, exc: FatalToolError) -> TurnFailure:
    return TurnFailure(f"tool {tool.name!r} failed the turn: {error_text(exc)}")


def run_local(tool: Tool, data: Any, ctx: ToolContext) -> Any:
    """Call a ``def`` tool; meant to run inside the step's ``commit``."""
    try:
        value = tool.run(data, ctx)
    except FatalToolError:
        raise
    except Exception as exc:
        raise ToolRaised(exc) from exc
    if not isinstance(value, _PLAIN) and inspect.isawaitable(value):
        _discard(value)
        raise TurnFailure(
            f"tool {tool.name!r} is declared with plain `def` but returned an awaitable; "
            "declare it `async def` so the engine awaits it outside the transaction"
        )
    try:
        return to_json_result(value)
    except Exception as exc:
        raise ToolRaised(exc) from exc


async def run_remote(tool: Tool, data: Any, ctx: ToolContext) -> tuple[Any, Exception | None]:
    """Await an ``async def`` tool; return its JSON result (an error result if it
    raised) and the exception it raised, if any."""
    try:
        return to_json_result(await tool.run(data, ctx)), None
    except FatalToolError as exc:
        raise fatal(tool, exc) from exc
    except Exception as exc:
        return error_result(error_text(exc)), exc


def _discard(value: Any) -> None:
    """Stop an awaitable a ``def`` tool returned, so its work never happens unrecorded."""
    if asyncio.isfuture(value):
        value.cancel()
        return
    close = getattr(value, "close", None)
    if close is not None:
        close()
