"""AG-UI events for a turn's story, built with the official ``ag-ui-protocol`` types.

``Run`` spells each ``Story`` item as AG-UI events (a model step, its text messages
and reasoning, tool calls and results) and the run's ending: ``RUN_FINISHED`` (its outcome an
``interrupt`` carrying every open question when the turn parked, ``cancelled``
when it was cancelled) or ``RUN_ERROR``. See docs/frontends.md for the table.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

from ..._values.inputs import InputRequest
from .._story import (
    Asked,
    Ended,
    Item,
    StepClosed,
    StepOpened,
    TextAdded,
    TextClosed,
    TextOpened,
    ToolCalled,
    ToolReturned,
)
from ._decisions import metadata, response_schema

#: Marks a text message a newer delivery of its step replaced (the turn was taken
#: over mid-reply): a renderer hides it.
SUPERSEDED = {"turnkit": {"superseded": True}}


class Run:
    """One AG-UI run over one turn's story: ``started()``, then ``events(item)`` for
    each item, the last of which (``Ended``) finishes the run."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self._asked: tuple[InputRequest, ...] = ()
        #: Per assistant message of the story, the AG-UI message its tool calls join.
        self._parent: dict[str, str] = {}

    def started(self) -> BaseEvent:
        return RunStartedEvent(
            thread_id=self.thread_id, run_id=self.run_id, protocol_version=PROTOCOL_VERSION
        )

    def finished(self) -> BaseEvent:
        """The end of a run that had nothing to tell (an answer taken for someone
        who may not read on)."""
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id)

    def events(self, item: Item) -> list[BaseEvent]:
        match item:
            case StepOpened(step=place):
                return [StepStartedEvent(step_name=_step_name(place))]
            case StepClosed(step=place):
                return [StepFinishedEvent(step_name=_step_name(place))]
            case TextOpened(part=id, kind="text", message_id=message):
                self._parent[message] = id
                return [TextMessageStartEvent(message_id=id, role="assistant")]
            case TextOpened(part=id, kind="reasoning"):
                return [
                    ReasoningStartEvent(message_id=id),
                    ReasoningMessageStartEvent(message_id=id, role="reasoning"),
                ]
            case TextAdded(part=id, kind="text", text=text):
                return [TextMessageContentEvent(message_id=id, delta=text)]
            case TextAdded(part=id, kind="reasoning", text=text):
                return [ReasoningMessageContentEvent(message_id=id, delta=text)]
            case TextClosed(part=id, kind="text", superseded=superseded):
                return [TextMessageEndEvent(message_id=id, metadata=_marked(superseded))]
            case TextClosed(part=id, kind="reasoning", superseded=superseded):
                return [
                    ReasoningMessageEndEvent(message_id=id, metadata=_marked(superseded)),
                    ReasoningEndEvent(message_id=id),
                ]
            case ToolCalled(call=call, message_id=message):
                return [
                    ToolCallStartEvent(
                        tool_call_id=call.id,
                        tool_call_name=call.name,
                        parent_message_id=self._parent.get(message, message),
                    ),
                    ToolCallArgsEvent(tool_call_id=call.id, delta=json.dumps(call.input)),
                    ToolCallEndEvent(tool_call_id=call.id),
                ]
            case ToolReturned(call_id=call_id, result=result, error=error):
                return [
                    ToolCallResultEvent(
                        message_id=f"{call_id}:result",
                        tool_call_id=call_id,
                        content=error if error is not None else _as_text(result),
                        role="tool",
                    )
                ]
            case Asked(requests=requests):
                self._asked = requests
                return []
            case Ended(how=how, detail=detail):
                return [self._ending(how, detail)]
        return []

    def _ending(self, how: str, detail: str) -> BaseEvent:
        if how == "completed":
            return self._finished(result=detail)
        if how == "parked":
            interrupts = [interrupt_of(r) for r in self._asked]
            return self._finished(outcome=RunFinishedInterruptOutcome(interrupts=interrupts))
        if how == "cancelled":
            return self._finished(outcome=RunFinishedCancelledOutcome())
        code = {"failed": "turn_failed", "held": "turn_held"}.get(how, "delivery_failed")
        return RunErrorEvent(message=detail, code=code)

    def _finished(
        self,
        *,
        result: str | None = None,
        outcome: RunFinishedInterruptOutcome | RunFinishedCancelledOutcome | None = None,
    ) -> BaseEvent:
        return RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id, result=result, outcome=outcome
        )


def interrupt_of(request: InputRequest) -> Interrupt:
    """A parked question as an AG-UI interrupt: answered by a resume entry whose
    ``interruptId`` is the question's id and whose ``payload`` is the answer."""
    if request.decision is not None:
        # A decision on the call itself: AG-UI's tool_call interrupt, approve-with-edits.
        return Interrupt(
            id=request.id,
            reason="tool_call",
            message=request.prompt,
            tool_call_id=request.call_id,
            response_schema=response_schema(request.decision),
            metadata=metadata(request.decision),
            expires_at=_iso(request.expires_at),
        )
    return Interrupt(
        id=request.id,
        reason="input_required",
        message=request.prompt,
        tool_call_id=request.call_id,
        response_schema=request.schema,
        expires_at=_iso(request.expires_at),
    )


def _iso(at: float | None) -> str | None:
    """A deadline as AG-UI's ``expiresAt``: an ISO-8601 UTC time."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds")


def _step_name(place: int | None) -> str:
    """A model step's name: ``model`` and where its message is logged."""
    return f"model@{place}" if place is not None else "model"


def _marked(superseded: bool) -> dict[str, Any] | None:
    return SUPERSEDED if superseded else None


def _as_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


_ENCODER = EventEncoder()


def encode(event: BaseEvent) -> bytes:
    """One AG-UI event as one SSE event (the official encoder)."""
    return _ENCODER.encode(event).encode()
