"""Where a tool batch's results go: the transcript keeps the model's order of calls.

Calls of one model step may commit out of order (they run in parallel), and each
commits its memoized result at once; its tool message joins the transcript only
when every call before it has one. Pure functions over the owed calls and the
turn's memoized steps, so a replay after a crash finds the same order. The
questions several calls ask at once get ids of their own here, too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._values.checkpoints import ToolStepResult
from .._values.inputs import InputRequest
from .._values.messages import ToolCall, ToolMessage
from .._values.step_ids import call_input_id, tool_step_id


def memo_message(call: ToolCall, memo: ToolStepResult, turn_id: str) -> ToolMessage:
    """The tool message a memoized result stands for (what its step committed)."""
    return ToolMessage(
        call_id=call.id,
        name=call.name,
        result=memo.result,
        turn_id=turn_id,
        is_error=memo.error is not None,
    )


def committed_results(
    assistant_index: int, owed: Sequence[ToolCall], steps: Mapping[str, Any], turn_id: str
) -> dict[str, ToolMessage]:
    """The owed calls whose result is already stored, by call id: they finished out
    of order (or before a crash) and wait for the calls before them."""
    found: dict[str, ToolMessage] = {}
    for call in owed:
        stored = steps.get(tool_step_id(assistant_index, call.id))
        if stored is not None:
            found[call.id] = memo_message(call, ToolStepResult.from_dict(stored), turn_id)
    return found


def in_order(owed: Sequence[ToolCall], results: Mapping[str, ToolMessage]) -> list[ToolMessage]:
    """The messages that may join the transcript now: those of the first owed calls,
    up to the first one without a result."""
    ready: list[ToolMessage] = []
    for call in owed:
        message = results.get(call.id)
        if message is None:
            break
        ready.append(message)
    return ready


def distinct_ids(requests: Sequence[InputRequest]) -> tuple[InputRequest, ...]:
    """The requests of one park, each with an id of its own: an id that several calls
    asked with (two refunds asking ``approve-refund``) becomes ``<id>@<call_id>``
    for each, so every call gets its own answer (``ToolContext.request_input`` looks
    that id up first)."""
    counts = Counter(r.id for r in requests)
    return tuple(
        replace(r, id=call_input_id(r.id, r.call_id)) if counts[r.id] > 1 else r for r in requests
    )
