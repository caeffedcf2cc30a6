"""The shapes of what Slack sends, checked before anything reads a field.

A request Slack signed is still only as well formed as the code that built it: a
test tool, a replayed capture or a changed API can send a ``channel`` that is a
list or a payload that is an array. Each model below holds the fields the channel
reads, strictly typed, and ignores the rest; a request that does not fit is
answered 400 and nothing is stored. pydantic's JSON parser also bounds nesting, so
no depth reaches a recursive parser.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "BlockActions",
    "ButtonValue",
    "DecisionMetadata",
    "Envelope",
    "FormMetadata",
    "MessageEvent",
    "ValidationError",
    "ViewSubmission",
]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class Envelope(_Shape):
    """An Events API request: a URL check, or a callback carrying one event."""

    type: str
    challenge: str | None = None
    team_id: str | None = None
    event_id: str | None = None
    event: dict[str, Any] | None = None


class MessageEvent(_Shape):
    """An ``app_mention`` or ``message`` event: the only ones that start turns."""

    type: Literal["app_mention", "message"]
    channel: str = Field(min_length=1)
    ts: str = Field(min_length=1)
    user: str | None = None
    text: str | None = None
    thread_ts: str | None = None
    channel_type: str | None = None
    bot_id: str | None = None
    subtype: str | None = None
    team: str | None = None


class _Id(_Shape):
    id: str = Field(min_length=1)


class _MessageRef(_Shape):
    ts: str | None = None
    thread_ts: str | None = None


class _Action(_Shape):
    action_id: str | None = None
    value: str


class BlockActions(_Shape):
    """A click on one of the buttons turnkit posted."""

    type: Literal["block_actions"]
    user: _Id
    channel: _Id
    actions: list[_Action] = Field(min_length=1)
    message: _MessageRef | None = None
    trigger_id: str | None = None
    team: _Id | None = None


class ButtonValue(_Shape):
    """What turnkit put in a button's ``value``: the question it answers."""

    session: str = Field(min_length=1)
    turn: str = Field(min_length=1)
    input: str = Field(min_length=1)


class _FormField(_Shape):
    value: str | None = None


class _State(_Shape):
    #: Per block id, per action id, what was entered.
    entered: dict[str, dict[str, _FormField]] = Field(alias="values")


class _View(_Shape):
    callback_id: str | None = None
    private_metadata: str
    state: _State


class ViewSubmission(_Shape):
    """A submitted answer form."""

    type: Literal["view_submission"]
    user: _Id
    view: _View
    team: _Id | None = None


class FormMetadata(ButtonValue):
    """A form's ``private_metadata``: the question and the thread it was asked in."""

    channel: str = Field(min_length=1)
    thread: str | None = None


class DecisionMetadata(FormMetadata):
    """A decision form's ``private_metadata``: also which decision it takes, and the
    message that asked (edited once the decision is taken)."""

    kind: Literal["edit", "reject", "respond"]
    question: str | None = None
