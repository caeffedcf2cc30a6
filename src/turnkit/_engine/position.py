"""Pure position logic: where a turn stands, read straight off the transcript.

Nothing here does I/O. Each function walks back from the end of the transcript and
stops at the latest assistant message, so its cost depends on the size of the last
tool batch, never on the length of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from .._values.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    TriggerMessage,
    UserMessage,
)


@dataclass(frozen=True)
class AppendOpening:
    """The turn's opening message is not in the transcript yet."""


@dataclass(frozen=True)
class CallModel:
    """Ask the model; its assistant message will take transcript index ``index``."""

    index: int


@dataclass(frozen=True)
class RunTools:
    """Run the calls of the assistant message at ``assistant_index`` still owed a result."""

    assistant_index: int
    owed: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Finished:
    """The model answered without calling a tool; ``text`` is the answer."""

    text: str


NextStep: TypeAlias = AppendOpening | CallModel | RunTools | Finished

#: The messages that open a turn (a tuple: ``isinstance`` checks it faster than a union).
_OPENINGS = (UserMessage, TriggerMessage)


def _latest_assistant(
    transcript: Sequence[Message],
) -> tuple[int, AssistantMessage, set[str]] | None:
    """The last assistant message, its index, and the call ids answered after it."""
    answered: set[str] = set()
    for i in range(len(transcript) - 1, -1, -1):
        msg = transcript[i]
        if isinstance(msg, AssistantMessage):
            return i, msg, answered
        if isinstance(msg, ToolMessage):
            answered.add(msg.call_id)
        else:
            return None
    return None


def owed_calls(message: AssistantMessage, answered: set[str]) -> tuple[ToolCall, ...]:
    """The message's calls that have no tool result yet, in the order the model asked."""
    return tuple(c for c in message.tool_calls if c.id not in answered)


def next_step(transcript: Sequence[Message], turn_id: str) -> NextStep:
    """What the engine must do next for ``turn_id``, given the transcript so far."""
    if not transcript:
        return AppendOpening()
    last = transcript[-1]
    if isinstance(last, _OPENINGS):
        return CallModel(len(transcript)) if last.turn_id == turn_id else AppendOpening()
    if type(last) is AssistantMessage and last.turn_id == turn_id:
        # Just asked (the usual case after a model step): every call it made is owed.
        calls = last.tool_calls
        return RunTools(len(transcript) - 1, calls) if calls else Finished(last.text)
    if type(last) is ToolMessage and _answers_lone_call(transcript, last, turn_id):
        return CallModel(len(transcript))  # the usual case after a tool step
    found = _latest_assistant(transcript)
    if found is None or found[1].turn_id != turn_id:
        # A tool or assistant tail that belongs to an earlier turn: ours has not opened.
        if last.turn_id != turn_id:
            return AppendOpening()
        # Tool messages of this turn with no assistant before them cannot happen.
        raise ValueError(f"transcript for turn {turn_id} has tool results without a call")
    index, message, answered = found
    if not message.tool_calls:
        return Finished(message.text)
    owed = owed_calls(message, answered)
    if owed:
        return RunTools(index, owed)
    return CallModel(len(transcript))


def _answers_lone_call(transcript: Sequence[Message], last: ToolMessage, turn_id: str) -> bool:
    """Whether ``last`` answers the one call of the turn's assistant message just
    before it: then nothing is owed, without walking back for what is."""
    before = transcript[-2] if len(transcript) > 1 else None
    if type(before) is not AssistantMessage or before.turn_id != turn_id:
        return False
    calls = before.tool_calls
    return len(calls) == 1 and calls[0].id == last.call_id


def stale_calls(
    transcript: Sequence[Message], turn_id: str
) -> tuple[int, tuple[ToolCall, ...]] | None:
    """Calls an *earlier* turn left unanswered at the tail (it failed mid-batch)."""
    found = _latest_assistant(transcript)
    if found is None:
        return None
    index, message, answered = found
    if message.turn_id == turn_id:
        return None
    owed = owed_calls(message, answered)
    return (index, owed) if owed else None


def count_model_steps(transcript: Sequence[Message], turn_id: str) -> int:
    """How many model steps ``turn_id`` has committed (its assistant messages at the tail).

    Called once per delivery, so it may walk the whole turn.
    """
    steps = 0
    for i in range(len(transcript) - 1, -1, -1):
        msg = transcript[i]
        if msg.turn_id != turn_id:
            break
        steps += isinstance(msg, AssistantMessage)
    return steps


def has_opening_message(transcript: Sequence[Message], turn_id: str) -> bool:
    """True when the transcript already holds the opening of ``turn_id``.

    Turns run one after another, so a turn's messages are contiguous at the tail
    while it runs; this walks back only through that turn.
    """
    for i in range(len(transcript) - 1, -1, -1):
        msg = transcript[i]
        if msg.turn_id != turn_id:
            return False
        if isinstance(msg, _OPENINGS):
            return True
    return False
