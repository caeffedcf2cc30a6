"""Every step id's format, in one place: the keys of a turn's memoized steps.

A step id names one durable result within a session (``docs/architecture.md``,
"Step ids"); it is also the seed of a remote tool's idempotency key, so these
formats are part of what is stored and must never change.
"""

from __future__ import annotations

MODEL = "model"
TOOL = "tool"
INPUT = "input"
POLICY = "policy"
TRACE = "trace"
TOOLS = "tools"
HISTORY = "history"
WINDOW = "window"
NOTE = "note"
REWRITE = "rewrite"


def model_step_id(index: int) -> str:
    """A model step: ``model:<n>``, ``n`` the position its assistant message takes."""
    return f"{MODEL}:{index}"


def tool_step_id(assistant_index: int, call_id: str) -> str:
    """A tool step: ``tool:<n>:<call_id>``, ``n`` the position of the calling message."""
    return f"{TOOL}:{assistant_index}:{call_id}"


def window_step_id(index: int) -> str:
    """What the model step ``model:<n>`` was sent (where its window started, and the
    summary before it): ``window:<n>``, committed with the step."""
    return f"{WINDOW}:{index}"


def history_step_id(turn_id: str, upto: int) -> str:
    """A summary of the transcript before position ``upto``, made by a model call
    of turn ``turn_id``: ``history:<turn_id>:<upto>``."""
    return f"{HISTORY}:{turn_id}:{upto}"


def input_step_id(turn_id: str, input_id: str) -> str:
    """Where a resume stores the answer: ``input:<turn_id>:<id>``."""
    return f"{INPUT}:{turn_id}:{input_id}"


def call_input_id(input_id: str, call_id: str) -> str:
    """The id a question takes when several calls of one park ask with the same id
    (two refunds, each asking ``approve-refund``): ``<id>@<call_id>``, so each call
    gets its own answer."""
    return f"{input_id}@{call_id}"


def rewrite_step_id(turn_id: str, call_id: str) -> str:
    """The call an ``on_version_change`` migration runs instead of the recorded call
    ``call_id`` of turn ``turn_id``: ``rewrite:<turn_id>:<call_id>``."""
    return f"{REWRITE}:{turn_id}:{call_id}"


def policy_step_id(turn_id: str) -> str:
    """The memo row that keeps a turn's policy (one per turn, like its input answers)."""
    return f"{POLICY}:{turn_id}"


def trace_step_id(turn_id: str) -> str:
    """The memo row that keeps the trace context a turn first opened in (one per
    turn, written only when a tracer records it)."""
    return f"{TRACE}:{turn_id}"


def tools_step_id(turn_id: str) -> str:
    """The memo row that keeps the tools a turn's tool sources listed (one per turn)."""
    return f"{TOOLS}:{turn_id}"


def note_step_id(tool_step: str, key: str) -> str:
    """A note a remote tool call keeps for itself (``ctx.remember``), for the call
    whose step is ``tool:<n>:<call_id>``: ``note:<n>:<key>:<call_id>``."""
    _, position, call = tool_step.split(":", 2)
    return f"{NOTE}:{position}:{key}:{call}"


def noted_call(step_id: str) -> str:
    """The tool step a note belongs to (the inverse of ``note_step_id``)."""
    _, position, _, call = step_id.split(":", 3)
    return f"{TOOL}:{position}:{call}"


def relayed_input_id(step_id: str, input_id: str) -> str:
    """The input id under which a parent turn asks a child turn's question
    ``input_id``: ``<parent call's step id>/<id>``, unique per call and question."""
    return f"{step_id}/{input_id}"


def step_kind(step_id: str) -> str:
    """``model``, ``tool``, ``note``, ``input``, ``policy``, ``trace`` or ``tools`` (what
    precedes the first colon)."""
    return step_id.partition(":")[0]


def step_position(step_id: str) -> int | None:
    """The transcript position a model, tool or window step id carries (a summary's:
    the position it summarizes up to), else ``None``."""
    kind, _, rest = step_id.partition(":")
    if kind == HISTORY:
        position = rest.rsplit(":", 1)[-1]
    elif kind in (MODEL, TOOL, WINDOW, NOTE):
        position = rest.split(":", 1)[0]
    else:
        return None
    return int(position) if position.isdigit() else None
