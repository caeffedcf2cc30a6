"""Typed turn events and the ``EventSink`` seam that fans them out to observers.

Structural events (a turn started, a message or action completed, a turn ended)
are logged in the store in the same transaction as the step that caused them and
carry their sequence number in the session; deltas, a child's events and a
channel's delivery failures are live-only and carry none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeAlias, cast

from .._errors import MessageDecodeError
from .frozen import quick_init
from .inputs import InputRequest
from .messages import AssistantMessage, JsonObject, ToolCall, message_from_dict
from .text import clean_fields

_NESTED = frozenset({"message", "call", "request", "event"})
#: Per event class, its fields that hold a value with a ``to_dict`` of its own.
_NESTED_FIELDS: dict[type, tuple[str, ...]] = {}


#: The fields of free text an event may carry (see ``text.storable``).
_TEXTS = (
    "text",
    "error",
    "reason",
    "result",
    "by",
    "value",
    "channel",
    "target",
    "method",
    "source",
)
#: Per event class, which of ``_TEXTS`` it has.
_TEXT_FIELDS: dict[type, tuple[str, ...]] = {}


class _Event:
    """Shared JSON encoding: the nested message or call is encoded with its ``to_dict``."""

    def to_dict(self) -> JsonObject:
        cls = type(self)
        nested = _NESTED_FIELDS.get(cls)
        if nested is None:
            names = (f.name for f in fields(cast(Any, self)))
            nested = _NESTED_FIELDS[cls] = tuple(n for n in names if n in _NESTED)
        # A dataclass's __init__ sets every field, in field order, and nothing else.
        out: JsonObject = dict(self.__dict__)
        for name in nested:
            out[name] = out[name].to_dict()
        if "requests" in out:
            out["requests"] = [r.to_dict() for r in out["requests"]]
        return out


@dataclass(frozen=True, kw_only=True)
class _TurnEventBase(_Event):
    """Fields every event carries: which turn, which session, its logged position, and
    ``at``, when it happened (seconds since the epoch; ``None`` in events logged before
    turnkit stamped them). Two events that differ only in ``at`` are equal."""

    turn_id: str
    session_id: str
    seq: int | None = None
    at: float | None = field(default_factory=time.time, compare=False)

    def __post_init__(self) -> None:
        # Live deltas and logged events alike: what a client is shown is what is kept.
        names = _TEXT_FIELDS.get(type(self))
        if names is None:
            present = {f.name for f in fields(self)}
            names = _TEXT_FIELDS[type(self)] = tuple(n for n in _TEXTS if n in present)
        clean_fields(self, names)


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnStartedEvent(_TurnEventBase):
    """The turn's opening message committed; ``text`` is what opened it."""

    text: str
    type: Literal["turn.started"] = "turn.started"


@quick_init
@dataclass(frozen=True, kw_only=True)
class MessageDeltaEvent(_TurnEventBase):
    """A live piece of the reply's text (never logged, never replayed).

    ``next_seq`` is the session's next event number when it was emitted: the number
    its reply's ``message.completed`` will be logged under. A feed joining deltas
    heard from another process with the log uses it to place them: a delta whose
    ``next_seq`` is already logged is stale, one past what it has shown waits for
    the events before it. ``None`` where nothing tells it.

    ``attempt`` names the delivery that streamed it. A turn taken over mid-reply
    (its process died or stalled) is delivered again, and the new attempt streams
    the same step from its start: a delta whose ``attempt`` differs from the one
    before it for the same ``next_seq`` means the text shown so far for that step
    is void and starts again, so no word is shown twice.
    """

    text: str
    next_seq: int | None = None
    attempt: str | None = None
    type: Literal["message.delta"] = "message.delta"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ReasoningDeltaEvent(_TurnEventBase):
    """A live piece of the model's reasoning (never logged, never replayed);
    ``next_seq`` and ``attempt`` as in ``MessageDeltaEvent``."""

    text: str
    next_seq: int | None = None
    attempt: str | None = None
    type: Literal["reasoning.delta"] = "reasoning.delta"


@quick_init
@dataclass(frozen=True, kw_only=True)
class MessageCompletedEvent(_TurnEventBase):
    """A model step committed this assistant message."""

    message: AssistantMessage
    type: Literal["message.completed"] = "message.completed"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ActionRequestedEvent(_TurnEventBase):
    """The model asked for this tool call (logged with the model step that asked)."""

    call: ToolCall
    type: Literal["action.requested"] = "action.requested"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ActionCompletedEvent(_TurnEventBase):
    """A tool call's result committed; ``error`` is set when the result is an error."""

    call_id: str
    name: str
    result: Any
    error: str | None = None
    type: Literal["action.completed"] = "action.completed"


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnCompletedEvent(_TurnEventBase):
    """The model answered without calling a tool; ``text`` is the answer."""

    text: str
    type: Literal["turn.completed"] = "turn.completed"


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnFailedEvent(_TurnEventBase):
    """The turn ended in failure; ``error`` says why."""

    error: str
    type: Literal["turn.failed"] = "turn.failed"


@quick_init
@dataclass(frozen=True, kw_only=True)
class InputRequestedEvent(_TurnEventBase):
    """The turn parked: tools asked for input. ``requests`` lists every question it
    waits on, in the order of the calls that asked; ``request`` is the first.

    Logged again, with what is still open, each time one of several is answered:
    that one has ``still_open`` set (its questions were asked before, so a renderer
    that posted them need not post them again).
    """

    request: InputRequest
    requests: tuple[InputRequest, ...] = ()
    still_open: bool = False
    type: Literal["input.requested"] = "input.requested"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.requests:
            object.__setattr__(self, "requests", (self.request,))


@quick_init
@dataclass(frozen=True, kw_only=True)
class InputAnsweredEvent(_TurnEventBase):
    """The parked turn's request ``input_id`` (asked by tool call ``call_id``) was
    answered with ``value`` by ``by`` (``None`` when the resume named nobody).

    Logged by the resume in the transaction that stores the answer, so it is logged
    exactly once however often the resumed turn is redelivered; its delivery emits it
    before anything else.
    """

    input_id: str
    call_id: str
    by: str | None
    value: Any
    #: The channel the answer came through (``"http"``, ``"slack"``…), if it said.
    source: str | None = None
    #: The request's kind: ``"decision"`` when ``value`` is a ``Decision``'s form.
    kind: str = "input"
    #: The tool whose call asked (``""`` in events logged before it was kept).
    tool: str = ""
    type: Literal["input.answered"] = "input.answered"


@quick_init
@dataclass(frozen=True, kw_only=True)
class InputExpiredEvent(_TurnEventBase):
    """The deadline of request ``input_id`` passed with no answer, and ``action`` was
    taken: ``answer`` (the turn resumes with the request's default answer, or a
    timer's wait ended), ``cancel`` or ``fail``. ``late_by`` is how many seconds after
    the deadline it was acted on: more than a moment when every process was down."""

    input_id: str
    call_id: str
    action: str
    expires_at: float
    late_by: float
    type: Literal["input.expired"] = "input.expired"


@quick_init
@dataclass(frozen=True, kw_only=True)
class InputReminderEvent(_TurnEventBase):
    """Request ``input_id`` is still unanswered: reminder number ``reminder`` (from
    1), for a channel to show again where it asked; ``expires_at`` is its deadline,
    if it has one."""

    input_id: str
    call_id: str
    prompt: str
    reminder: int
    expires_at: float | None = None
    type: Literal["input.reminder"] = "input.reminder"


@quick_init
@dataclass(frozen=True, kw_only=True)
class StepRetryEvent(_TurnEventBase):
    """Step ``step_id`` failed (``error`` says how, and which attempt of how many)
    and runs again as attempt number ``attempt`` (from 2) at ``retry_at``; the turn
    waits parked until then, holding no process. Logged with the park."""

    step_id: str
    attempt: int
    error: str
    retry_at: float
    type: Literal["step.retry"] = "step.retry"


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnCancelledEvent(_TurnEventBase):
    """The turn was cancelled at a checkpoint boundary; ``reason`` says why
    (``requested``, ``replaced`` or ``reset``)."""

    reason: str
    type: Literal["turn.cancelled"] = "turn.cancelled"


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnVersionChangedEvent(_TurnEventBase):
    """A delivery of agent version ``to_version`` took on the turn recorded under
    ``from_version`` (``None``: recorded before turns kept versions, or held by the
    same version) and runs it on: ``action`` is ``continued``, or ``migrated`` when
    the agent's ``on_version_change`` rewrote the owed calls named in ``rewritten``."""

    from_version: str | None
    to_version: str
    action: Literal["continued", "migrated"]
    rewritten: tuple[str, ...] = ()
    type: Literal["turn.version_changed"] = "turn.version_changed"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "rewritten", tuple(self.rewritten))


@quick_init
@dataclass(frozen=True, kw_only=True)
class TurnHeldEvent(_TurnEventBase):
    """The turn, recorded under ``from_version``, was refused by a delivery of
    ``by_version`` and is held parked (``problems`` say what conflicted, ``reason``
    sums it up). A delivery of another version may take it on later; see
    docs/deploying.md. It ends the delivery, like a park."""

    from_version: str | None
    by_version: str
    reason: str
    problems: tuple[str, ...] = ()
    type: Literal["turn.held"] = "turn.held"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "problems", tuple(self.problems))


@quick_init
@dataclass(frozen=True, kw_only=True)
class SubagentEvent(_TurnEventBase):
    """An event of a child turn, shown to the parent turn's observers (live only).

    ``call_id`` is the parent's tool call that runs the child; ``event`` is the
    child's own event, with the child's session and turn ids.
    """

    call_id: str
    agent: str
    event: TurnEvent
    type: Literal["subagent.event"] = "subagent.event"


@quick_init
@dataclass(frozen=True, kw_only=True)
class DeliveryFailedEvent(_TurnEventBase):
    """A channel could not show the turn where it was going (live only).

    ``channel`` is the channel's source (``slack``), ``target`` where on its platform
    (a Slack channel id), ``method`` the platform call that failed (``chat.update``;
    ``None`` when the channel cannot tell) and ``error`` the platform's error code
    (``channel_not_found``) or what else went wrong. It concerns that reply only: the
    turn runs to its end regardless, and its record says how it ended.
    """

    channel: str
    target: str
    method: str | None
    error: str
    type: Literal["delivery.failed"] = "delivery.failed"


@quick_init
@dataclass(frozen=True, kw_only=True)
class UnknownEvent(_TurnEventBase):
    """An event of a type this version of turnkit does not know, as a newer version
    logged it (during a rolling upgrade, say). It is kept whole in ``data`` and
    written back exactly so (``to_dict``), so a feed forwards it and a store keeps
    it; renderers skip it. ``name`` is the type it was logged as; ``type`` is
    ``"unknown"`` in this process, so code that branches on ``type`` passes it by."""

    name: str
    data: JsonObject = field(default_factory=dict, compare=False)
    type: Literal["unknown"] = "unknown"

    def to_dict(self) -> JsonObject:
        return dict(self.data)


TurnEvent: TypeAlias = (
    TurnStartedEvent
    | MessageDeltaEvent
    | ReasoningDeltaEvent
    | MessageCompletedEvent
    | ActionRequestedEvent
    | ActionCompletedEvent
    | InputRequestedEvent
    | InputAnsweredEvent
    | InputExpiredEvent
    | InputReminderEvent
    | StepRetryEvent
    | TurnCompletedEvent
    | TurnFailedEvent
    | TurnCancelledEvent
    | TurnVersionChangedEvent
    | TurnHeldEvent
    | SubagentEvent
    | DeliveryFailedEvent
    | UnknownEvent
)

#: Event types after which a turn has ended for good.
TERMINAL_EVENT_TYPES: frozenset[str] = frozenset(
    {"turn.completed", "turn.failed", "turn.cancelled"}
)
#: Event types that end a delivery: the terminal ones, and a park. An observer of a
#: delivery stops at the first of them.
ENDING_EVENT_TYPES: frozenset[str] = TERMINAL_EVENT_TYPES | {"input.requested", "turn.held"}

_EVENT_TYPES: dict[str, type[_Event]] = {
    cls.type: cls
    for cls in (
        TurnStartedEvent,
        MessageDeltaEvent,
        ReasoningDeltaEvent,
        MessageCompletedEvent,
        ActionRequestedEvent,
        ActionCompletedEvent,
        InputRequestedEvent,
        InputAnsweredEvent,
        InputExpiredEvent,
        InputReminderEvent,
        StepRetryEvent,
        TurnCompletedEvent,
        TurnFailedEvent,
        TurnCancelledEvent,
        TurnVersionChangedEvent,
        TurnHeldEvent,
        SubagentEvent,
        DeliveryFailedEvent,
    )
}


#: Per event class, the names of its fields.
_FIELD_NAMES: dict[type, frozenset[str]] = {}


def _unknown(kind: str, data: dict[str, Any]) -> UnknownEvent:
    turn_id, session_id, seq, at = (data.get(k) for k in ("turn_id", "session_id", "seq", "at"))
    if not isinstance(turn_id, str) or not isinstance(session_id, str):
        raise MessageDecodeError(f"event {kind}: turn_id and session_id must be strings")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
        raise MessageDecodeError(f"event {kind}: seq must be an integer")
    return UnknownEvent(
        name=kind,
        data=dict(data),
        turn_id=turn_id,
        session_id=session_id,
        seq=seq,
        at=at if isinstance(at, int | float) and not isinstance(at, bool) else None,
    )


def event_from_dict(data: object) -> TurnEvent:
    """Rebuild an event from its ``to_dict()`` form; raise ``MessageDecodeError`` if malformed."""
    if not isinstance(data, dict):
        raise MessageDecodeError(f"event: expected a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str) or not kind:
        raise MessageDecodeError(f"event: type must be a non-empty string, got {kind!r}")
    cls = _EVENT_TYPES.get(kind)
    if cls is None:
        return _unknown(kind, data)
    # Fields a newer version added to a known type are left out, not fatal.
    known = _FIELD_NAMES.get(cls)
    if known is None:
        known = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cast(Any, cls)))
    values = {k: v for k, v in data.items() if k in known}
    values.setdefault("at", None)  # logged before events were stamped: the time is unknown
    if "message" in values:
        message = message_from_dict(values["message"])
        if not isinstance(message, AssistantMessage):
            raise MessageDecodeError("event: message.completed must carry an assistant message")
        values["message"] = message
    if "call" in values:
        values["call"] = ToolCall.from_dict(values["call"])
    if "request" in values:
        values["request"] = InputRequest.from_dict(values["request"])
    if "requests" in values:
        if not isinstance(values["requests"], list):
            raise MessageDecodeError(f"event {kind}: requests must be a list")
        values["requests"] = tuple(InputRequest.from_dict(r) for r in values["requests"])
    if "event" in values:
        values["event"] = event_from_dict(values["event"])
    try:
        event = cls(**values)
    except TypeError as exc:
        raise MessageDecodeError(f"event {kind}: {exc}") from None
    return cast(TurnEvent, event)
