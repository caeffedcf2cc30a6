"""How a model's reply becomes the assistant message and the events of its step.

Observers may mutate the events they get, so the calls they are shown are copies,
never the transcript's own.
"""

from __future__ import annotations

from itertools import count

from .._values.events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    MessageCompletedEvent,
    TurnCompletedEvent,
    TurnEvent,
)
from .._values.frozen import made_clean
from .._values.messages import AssistantMessage, Message, ModelReply, ToolCall, ToolMessage
from .._values.text import clean_copy
from .tool_call import copy_input

#: Made from a reply's fields and its calls, every text of which the reply and the
#: calls made storable when they were made: nothing to check again.
_clean_message = made_clean(AssistantMessage)
_completed = made_clean(MessageCompletedEvent)
_requested = made_clean(ActionRequestedEvent)


def assistant_message(
    reply: ModelReply, turn_id: str, calls: tuple[ToolCall, ...]
) -> AssistantMessage:
    """The message a model step commits for ``reply`` (with ``calls``, the reply's)."""
    return _clean_message(
        text=reply.text,
        turn_id=turn_id,
        tool_calls=calls,
        stop=reply.stop,
        provider_state=reply.provider_state,
        usage=reply.usage,
    )


def reply_events(
    reply: ModelReply,
    message: AssistantMessage,
    tail: list[Message],
    answer: str | None,
    *,
    turn_id: str,
    session_id: str,
    first_seq: int,
) -> list[TurnEvent]:
    """The events a model step commits, numbered from ``first_seq``: the reply, the
    calls it asks for, the messages that follow it in the same commit, and the
    turn's completion if ``answer`` ends it."""
    tid, sid, seq = turn_id, session_id, count(first_seq)
    # Observers may mutate what they get; the transcript must not change with it.
    calls = reply.tool_calls
    shown = clean_copy(message, tool_calls=_detached(calls)) if calls else message
    events: list[TurnEvent] = [
        _completed(turn_id=tid, session_id=sid, message=shown, seq=next(seq))
    ]
    for c in shown.tool_calls:  # (loops, not comprehensions: no frame each, every step)
        events.append(_requested(turn_id=tid, session_id=sid, call=c, seq=next(seq)))
    for m in tail:
        e = _tail_event(m, tid, sid, next(seq))
        if e is not None:
            events.append(e)
    if answer is not None:
        completed = TurnCompletedEvent(turn_id=tid, session_id=sid, text=answer, seq=next(seq))
        events.append(completed)
    return events


def error_of(message: ToolMessage) -> str | None:
    """The error text of an error result the engine made (``{"error": text}``)."""
    if not message.is_error or not isinstance(message.result, dict):
        return None
    return str(message.result.get("error", ""))


def _tail_event(message: Message, tid: str, sid: str, seq: int) -> TurnEvent | None:
    """The event for a message a model step commits after its reply, if any."""
    if isinstance(message, ToolMessage):
        return ActionCompletedEvent(
            turn_id=tid,
            session_id=sid,
            call_id=message.call_id,
            name=message.name,
            result=copy_input(message.result),
            error=error_of(message),
            seq=seq,
        )
    if isinstance(message, AssistantMessage):
        return MessageCompletedEvent(turn_id=tid, session_id=sid, message=message, seq=seq)
    return None  # the feedback on a refused text answer: in the transcript only


def _detached(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """Copies of ``calls`` whose inputs are not shared with the transcript."""
    return tuple(map(_detached_call, calls))


def _detached_call(call: ToolCall) -> ToolCall:
    state = call.provider_state
    return clean_copy(
        call,
        input=copy_input(call.input),
        provider_state=None if state is None else copy_input(state),
    )
