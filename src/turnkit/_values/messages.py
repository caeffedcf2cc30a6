"""The transcript's value types: messages, tool calls, model replies and stop reasons.

Every type is a frozen, keyword-only dataclass whose ``to_dict()`` output is plain
JSON and whose ``from_dict()`` rebuilds an equal value, so the message log can be
stored, sent over the wire and replayed without loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args

from .._errors import MessageDecodeError
from .frozen import quick_init
from .text import clean_fields
from .usage import Usage

JsonObject: TypeAlias = dict[str, Any]

StopKind = Literal[
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "content_filter",
    "refusal",
    "context_window",
    "pause",
    "other",
]
STOP_KINDS: frozenset[str] = frozenset(get_args(StopKind))
#: Stops after which an empty reply means the provider cut the model off.
ABNORMAL_STOPS: frozenset[str] = frozenset(
    {"max_tokens", "content_filter", "refusal", "context_window", "pause", "other"}
)

_T = TypeVar("_T")


def _get(data: Mapping[str, Any], key: str, kind: type[_T], what: str) -> _T:
    if key not in data:
        raise MessageDecodeError(f"{what}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MessageDecodeError(
            f"{what}: field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _get_optional(data: Mapping[str, Any], key: str, kind: type[_T], what: str) -> _T | None:
    if data.get(key) is None:
        return None
    return _get(data, key, kind, what)


def _require_mapping(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise MessageDecodeError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


@quick_init
@dataclass(frozen=True, kw_only=True)
class StopReason:
    """Why the model stopped: a normalized ``kind`` plus the provider's own word."""

    kind: StopKind
    raw: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in STOP_KINDS:
            raise ValueError(
                f"unknown stop kind {self.kind!r}; expected one of {sorted(STOP_KINDS)}"
            )
        if self.raw is not None and not isinstance(self.raw, str):
            raise ValueError(f"StopReason.raw must be a str or None, got {type(self.raw).__name__}")

    @property
    def abnormal(self) -> bool:
        """True when the provider cut the reply short (length, filter, refusal, …)."""
        return self.kind in ABNORMAL_STOPS

    def to_dict(self) -> JsonObject:
        return {"kind": self.kind, "raw": self.raw}

    @classmethod
    def from_dict(cls, data: object) -> StopReason:
        d = _require_mapping(data, "stop reason")
        kind = _get(d, "kind", str, "stop reason")
        if kind not in STOP_KINDS:
            raise MessageDecodeError(f"stop reason: unknown kind {kind!r}")
        return cls(kind=cast(StopKind, kind), raw=_get_optional(d, "raw", str, "stop reason"))


@quick_init
@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool invocation the model asked for. ``provider_state`` is opaque to the engine."""

    id: str
    name: str
    input: JsonObject = field(default_factory=dict)
    provider_state: JsonObject | None = None

    def __post_init__(self) -> None:
        clean_fields(self, ("id", "name", "input", "provider_state"))

    def to_dict(self) -> JsonObject:
        return {
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "provider_state": self.provider_state,
        }

    @classmethod
    def from_dict(cls, data: object) -> ToolCall:
        d = _require_mapping(data, "tool call")
        return cls(
            id=_get(d, "id", str, "tool call"),
            name=_get(d, "name", str, "tool call"),
            input=dict(_get(d, "input", dict, "tool call")),
            provider_state=_get_optional(d, "provider_state", dict, "tool call"),
        )


def _calls_from(d: Mapping[str, Any], what: str) -> tuple[ToolCall, ...]:
    return tuple(ToolCall.from_dict(c) for c in _get(d, "tool_calls", list, what))


@quick_init
@dataclass(frozen=True, kw_only=True)
class ModelReply:
    """A finished model step: its text, the tools it wants run, and why it stopped."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop: StopReason | None = None
    #: Opaque, JSON-able data an adapter needs back on the next call (for example
    #: Anthropic's signed thinking blocks). Stored on the assistant message.
    provider_state: JsonObject | None = None
    #: The tokens the step used, as the provider reported them (``None``: not reported).
    usage: Usage | None = None
    #: The model that answered, as the provider named it (``None``: not reported).
    model: str | None = None

    def __post_init__(self) -> None:
        clean_fields(self, ("text", "provider_state"))

    @property
    def empty(self) -> bool:
        return not self.text and not self.tool_calls

    def to_dict(self) -> JsonObject:
        return {
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "stop": self.stop.to_dict() if self.stop else None,
            "provider_state": self.provider_state,
            "usage": self.usage.to_dict() if self.usage is not None else None,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, data: object) -> ModelReply:
        d = _require_mapping(data, "model reply")
        stop = d.get("stop")
        return cls(
            text=_get(d, "text", str, "model reply"),
            tool_calls=_calls_from(d, "model reply"),
            stop=StopReason.from_dict(stop) if stop is not None else None,
            provider_state=_get_optional(d, "provider_state", dict, "model reply"),
            usage=_usage(d),
            model=_get_optional(d, "model", str, "model reply"),
        )


def _usage(d: Mapping[str, Any]) -> Usage | None:
    """The optional ``usage`` of a reply or assistant message (absent in older rows)."""
    data = d.get("usage")
    return Usage.from_dict(data) if data is not None else None


@quick_init
@dataclass(frozen=True, kw_only=True)
class UserMessage:
    """What a person sent to open a turn."""

    text: str
    turn_id: str
    role: Literal["user"] = "user"

    def __post_init__(self) -> None:
        clean_fields(self, ("text",))

    def to_dict(self) -> JsonObject:
        return {"role": self.role, "turn_id": self.turn_id, "text": self.text}


@quick_init
@dataclass(frozen=True, kw_only=True)
class TriggerMessage:
    """A turn's opening that no person sent (a schedule, a webhook), attributed to ``by``."""

    text: str
    turn_id: str
    by: str
    role: Literal["trigger"] = "trigger"

    def __post_init__(self) -> None:
        clean_fields(self, ("text", "by"))

    def to_dict(self) -> JsonObject:
        return {"role": self.role, "turn_id": self.turn_id, "text": self.text, "by": self.by}


@quick_init
@dataclass(frozen=True, kw_only=True)
class AssistantMessage:
    """The model's reply as committed to the transcript by a model step."""

    text: str
    turn_id: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop: StopReason | None = None
    provider_state: JsonObject | None = None
    #: What the model step that wrote this message used (its reply's ``usage``).
    usage: Usage | None = None
    role: Literal["assistant"] = "assistant"

    def __post_init__(self) -> None:
        clean_fields(self, ("text", "provider_state"))

    def to_dict(self) -> JsonObject:
        return {
            "role": self.role,
            "turn_id": self.turn_id,
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "stop": self.stop.to_dict() if self.stop else None,
            "provider_state": self.provider_state,
            "usage": self.usage.to_dict() if self.usage is not None else None,
        }


@quick_init
@dataclass(frozen=True, kw_only=True)
class ToolMessage:
    """The result of one tool call; ``is_error`` marks a result that reports a failure."""

    call_id: str
    name: str
    result: Any
    turn_id: str
    is_error: bool = False
    role: Literal["tool"] = "tool"

    def __post_init__(self) -> None:
        clean_fields(self, ("call_id", "name", "result"))

    def to_dict(self) -> JsonObject:
        return {
            "role": self.role,
            "turn_id": self.turn_id,
            "call_id": self.call_id,
            "name": self.name,
            "result": self.result,
            "is_error": self.is_error,
        }


Message: TypeAlias = UserMessage | TriggerMessage | AssistantMessage | ToolMessage
OpeningMessage: TypeAlias = UserMessage | TriggerMessage


def opening_from_dict(data: object, turn_id: str) -> OpeningMessage:
    """A turn's stored opening (a user's or a trigger's message) from its ``to_dict()``
    form; ``MessageDecodeError`` if it is another kind of message or malformed.

    A fork of an archived generation whose opening was lost stored only
    ``{"text": ""}``; that reads as an empty user message of ``turn_id``."""
    if isinstance(data, dict) and "role" not in data:
        text = data.get("text", "")
        if not isinstance(text, str):
            raise MessageDecodeError(f"opening of turn {turn_id}: text must be a string")
        return UserMessage(text=text, turn_id=turn_id)
    message = message_from_dict(data)
    if not isinstance(message, UserMessage | TriggerMessage):
        raise MessageDecodeError(
            f"opening of turn {turn_id}: expected a user or trigger message, got {message.role}"
        )
    return message


def message_from_dict(data: object) -> Message:
    """Rebuild a message from its ``to_dict()`` form; raise ``MessageDecodeError`` if malformed."""
    d = _require_mapping(data, "message")
    role = _get(d, "role", str, "message")
    what = f"{role} message"
    turn_id = _get(d, "turn_id", str, what)
    if role == "user":
        return UserMessage(text=_get(d, "text", str, what), turn_id=turn_id)
    if role == "trigger":
        return TriggerMessage(
            text=_get(d, "text", str, what), turn_id=turn_id, by=_get(d, "by", str, what)
        )
    if role == "assistant":
        stop = d.get("stop")
        return AssistantMessage(
            text=_get(d, "text", str, what),
            turn_id=turn_id,
            tool_calls=_calls_from(d, what),
            stop=StopReason.from_dict(stop) if stop is not None else None,
            provider_state=_get_optional(d, "provider_state", dict, what),
            usage=_usage(d),
        )
    if role == "tool":
        if "result" not in d:
            raise MessageDecodeError(f"{what}: missing field 'result'")
        return ToolMessage(
            call_id=_get(d, "call_id", str, what),
            name=_get(d, "name", str, what),
            result=d["result"],
            turn_id=turn_id,
            is_error=_get(d, "is_error", bool, what),
        )
    raise MessageDecodeError(
        f"message: unknown role {role!r}; expected user, trigger, assistant or tool"
    )
