"""A turn's events as the parts a chat front end draws: text, tool calls, questions.

``Story`` is pure position logic shared by the front-end protocols (the AI SDK's UI
message stream, AG-UI): it turns logged events and live deltas into text parts
that open, grow and close, tool calls and their results, questions and the turn's
ending, each exactly once. A protocol's module only spells these items in its
own wire format.

Text is placed by the step it belongs to (a delta's ``next_seq``, the number its
step's ``message.completed`` is logged under). A stream that joined a turn late (a
reconnect) cannot know how much of the step then running it missed, so it draws
that step whole from its logged message instead of from deltas; every later step
streams live. A delta of a new ``attempt`` for a step (the turn was taken over
mid-reply) closes the part drawn so far as superseded and starts the step afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .._errors import TurnError
from .._values.events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    InputAnsweredEvent,
    InputRequestedEvent,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnHeldEvent,
)
from .._values.inputs import InputRequest
from .._values.messages import ToolCall

TextKind: TypeAlias = Literal["text", "reasoning"]


@dataclass(frozen=True, kw_only=True)
class StepOpened:
    """A model step began (``step``: its place, the seq of its message)."""

    step: int | None


@dataclass(frozen=True, kw_only=True)
class StepClosed:
    step: int | None


@dataclass(frozen=True, kw_only=True)
class TextOpened:
    """A text (or reasoning) part starts; ``message_id`` is its step's message."""

    part: str
    kind: TextKind
    message_id: str


@dataclass(frozen=True, kw_only=True)
class TextAdded:
    part: str
    kind: TextKind
    text: str
    message_id: str


@dataclass(frozen=True, kw_only=True)
class TextClosed:
    """The part is finished; ``superseded``: its step is being streamed again by a
    newer delivery, so what it holds is void (a renderer should hide it)."""

    part: str
    kind: TextKind
    message_id: str
    superseded: bool = False


@dataclass(frozen=True, kw_only=True)
class ToolCalled:
    call: ToolCall
    message_id: str


@dataclass(frozen=True, kw_only=True)
class ToolReturned:
    call_id: str
    name: str
    result: Any
    error: str | None


@dataclass(frozen=True, kw_only=True)
class Asked:
    """The turn parked on these questions (every one still open)."""

    requests: tuple[InputRequest, ...]


@dataclass(frozen=True, kw_only=True)
class Answered:
    input_id: str
    call_id: str
    by: str | None
    value: Any


@dataclass(frozen=True, kw_only=True)
class Ended:
    """How the stream ends: the turn ``completed`` (``detail``: its answer),
    ``failed`` (the error), was ``cancelled`` (the reason), is ``parked`` on
    questions, is ``held`` by another agent version (why), or the stream ``broke``
    (the delivery's error; the turn stays open)."""

    how: Literal["completed", "failed", "cancelled", "parked", "held", "broke"]
    detail: str = ""


Item: TypeAlias = (
    StepOpened
    | StepClosed
    | TextOpened
    | TextAdded
    | TextClosed
    | ToolCalled
    | ToolReturned
    | Asked
    | Answered
    | Ended
)


@dataclass
class _Part:
    id: str
    kind: TextKind
    attempt: str | None
    text: str = ""


@dataclass
class _Step:
    place: int | None
    parts: dict[TextKind, _Part] = field(default_factory=dict)
    #: Attempts whose deltas are void for this step (superseded by a newer one).
    void: set[str | None] = field(default_factory=set)
    count: int = 0


class Story:
    """One turn's items, event by event; ``joined_late`` for a stream that did not
    watch the turn from its start (its first live step is drawn whole)."""

    def __init__(self, turn_id: str, *, joined_late: bool = False) -> None:
        self.turn_id = turn_id
        self._late = joined_late
        #: Steps at or before this place are drawn from their logged message only.
        self._held_through: int | None = None
        self._step: _Step | None = None
        self._asked: set[str] = set()
        self._last: TurnEvent | None = None
        self.ended = False

    def message_id(self, place: int | None) -> str:
        """The id of the assistant message a step writes (stable across streams)."""
        return f"{self.turn_id}:{place if place is not None else 'live'}"

    def tell(self, event: TurnEvent) -> list[Item]:
        """The items ``event`` adds to the story."""
        if self.ended:
            return []
        self._last = event
        if isinstance(event, MessageDeltaEvent | ReasoningDeltaEvent):
            return self._delta(event)
        if isinstance(event, MessageCompletedEvent):
            return self._completed(event)
        if isinstance(event, ActionRequestedEvent):
            place = self._step.place if self._step is not None else event.seq
            return [ToolCalled(call=event.call, message_id=self.message_id(place))]
        if isinstance(event, ActionCompletedEvent):
            return [
                *self._close_step(),
                ToolReturned(
                    call_id=event.call_id, name=event.name, result=event.result, error=event.error
                ),
            ]
        if isinstance(event, InputRequestedEvent):
            fresh = tuple(r for r in event.requests if r.id not in self._asked)
            self._asked.update(r.id for r in event.requests)
            return [*self._close_step(), Asked(requests=event.requests)] if fresh else []
        if isinstance(event, InputAnsweredEvent):
            return [
                Answered(
                    input_id=event.input_id, call_id=event.call_id, by=event.by, value=event.value
                )
            ]
        return []

    def end(self, error: TurnError | None = None) -> list[Item]:
        """The closing items once the source of events has ended."""
        if self.ended:
            return []
        self.ended = True
        closing = self._close_step()
        last = self._last
        if error is not None:
            return [*closing, Ended(how="broke", detail=str(error))]
        if isinstance(last, TurnCompletedEvent):
            return [*closing, Ended(how="completed", detail=last.text)]
        if isinstance(last, TurnFailedEvent):
            return [*closing, Ended(how="failed", detail=last.error)]
        if isinstance(last, TurnCancelledEvent):
            return [*closing, Ended(how="cancelled", detail=last.reason)]
        if isinstance(last, InputRequestedEvent):
            return [*closing, Ended(how="parked")]
        if isinstance(last, TurnHeldEvent):
            return [*closing, Ended(how="held", detail=last.reason)]
        return [*closing, Ended(how="broke", detail="the stream ended before the turn did")]

    # -- text ------------------------------------------------------------------

    def _delta(self, event: MessageDeltaEvent | ReasoningDeltaEvent) -> list[Item]:
        place = event.next_seq
        if self._late:
            if self._held_through is None:
                self._held_through = place if place is not None else -1
            if place is None or (self._held_through is not None and place <= self._held_through):
                return []  # begun before this stream listened: drawn whole when logged
        kind: TextKind = "text" if isinstance(event, MessageDeltaEvent) else "reasoning"
        items: list[Item] = []
        step = self._step
        if step is None or step.place != place:
            items.extend(self._close_step())
            step = self._step = _Step(place=place)
            items.append(StepOpened(step=place))
        if event.attempt in step.void:
            return items
        for other in list(step.parts.values()):
            if other.attempt != event.attempt:
                # A newer delivery streams this step again: what was drawn is void.
                items.extend(self._close_all(step, superseded=True))
                step.void.add(other.attempt)
                break
        part = step.parts.get(kind)
        if part is None:
            step.count += 1
            part = step.parts[kind] = _Part(
                id=f"{self.message_id(place)}:{kind}:{step.count}", kind=kind, attempt=event.attempt
            )
            items.append(TextOpened(part=part.id, kind=kind, message_id=self.message_id(place)))
        if event.text:
            part.text += event.text
            items.append(
                TextAdded(
                    part=part.id, kind=kind, text=event.text, message_id=self.message_id(place)
                )
            )
        return items

    def _completed(self, event: MessageCompletedEvent) -> list[Item]:
        place = event.seq
        message_id = self.message_id(place)
        step = self._step
        items: list[Item] = []
        if step is None or step.place != place:
            items.extend(self._close_step())
            step = self._step = _Step(place=place)
            items.append(StepOpened(step=place))
        items.extend(self._close_all(step, superseded=False, keep="text"))
        text = event.message.text
        drawn = step.parts.get("text")
        if drawn is not None and not text.startswith(drawn.text):
            # Drawn live from a delivery whose reply did not commit: void.
            items.append(
                TextClosed(part=drawn.id, kind="text", message_id=message_id, superseded=True)
            )
            del step.parts["text"]
            drawn = None
        if drawn is None and text:
            step.count += 1
            drawn = step.parts["text"] = _Part(
                id=f"{message_id}:text:{step.count}", kind="text", attempt=None
            )
            items.append(TextOpened(part=drawn.id, kind="text", message_id=message_id))
        if drawn is not None:
            rest = text[len(drawn.text) :]
            if rest:
                drawn.text = text
                items.append(
                    TextAdded(part=drawn.id, kind="text", text=rest, message_id=message_id)
                )
            items.append(TextClosed(part=drawn.id, kind="text", message_id=message_id))
            del step.parts["text"]
        return items

    def _close_all(
        self, step: _Step, *, superseded: bool, keep: TextKind | None = None
    ) -> list[Item]:
        items: list[Item] = []
        for kind, part in list(step.parts.items()):
            if kind == keep:
                continue
            items.append(
                TextClosed(
                    part=part.id,
                    kind=kind,
                    message_id=self.message_id(step.place),
                    superseded=superseded,
                )
            )
            del step.parts[kind]
        return items

    def _close_step(self) -> list[Item]:
        step = self._step
        if step is None:
            return []
        self._step = None
        return [*self._close_all(step, superseded=False), StepClosed(step=step.place)]
