"""The durable records the engine writes besides messages and events, as typed values.

A parked turn's suspend checkpoint, a tool step's memoized result and the answer a
resume stores are each built and read through one frozen dataclass here, whose
``to_dict``/``from_dict`` are the stored form. Those forms are what existing stores
hold, so they must keep decoding unchanged; fields added later get a default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from .._errors import MessageDecodeError
from .frozen import quick_init
from .inbound import InboundEvent
from .inputs import InputRequest
from .messages import JsonObject
from .policy import TurnPolicy
from .text import clean_fields


@dataclass(frozen=True, kw_only=True)
class SuspendCheckpoint:
    """What a parked turn waits for, and what a resume in another process needs to
    replay it as it was opened. Kept as the turn record's ``pending``.

    ``requests`` are the questions still open, in the order of the calls that asked
    (several calls of one model step may each ask one); ``request`` is the first.
    """

    request: InputRequest
    #: The call whose tool asked (``request.call_id``).
    call_id: str
    #: The stored opening's text (a redelivery may have been started with another).
    opening_text: str
    event: InboundEvent | None
    #: ``None`` only in a checkpoint written before policies were stored with it.
    policy: TurnPolicy | None
    #: The session's generation: a grant answers only the one it was issued in.
    generation: int = 0
    requests: tuple[InputRequest, ...] = ()

    def __post_init__(self) -> None:
        if not self.requests:
            object.__setattr__(self, "requests", (self.request,))

    def find(self, input_id: str) -> InputRequest | None:
        """The open request with id ``input_id``, if there is one."""
        return next((r for r in self.requests if r.id == input_id), None)

    def without(self, input_id: str) -> SuspendCheckpoint:
        """This checkpoint once ``input_id`` is answered (others must remain open)."""
        left = tuple(r for r in self.requests if r.id != input_id)
        return replace(self, request=left[0], call_id=left[0].call_id, requests=left)

    def to_dict(self) -> JsonObject:
        return {
            "request": self.request.to_dict(),
            "call_id": self.call_id,
            "opening_text": self.opening_text,
            "event": self.event.to_dict() if self.event is not None else None,
            "policy": self.policy.to_dict() if self.policy is not None else None,
            "generation": self.generation,
            "requests": [r.to_dict() for r in self.requests],
        }

    @classmethod
    def from_dict(cls, data: Any) -> SuspendCheckpoint:
        if not isinstance(data, dict) or "request" not in data:
            raise MessageDecodeError("suspend checkpoint: expected a JSON object with a request")
        request = InputRequest.from_dict(data["request"])
        listed = data.get("requests", [])
        if not isinstance(listed, list):
            raise MessageDecodeError("suspend checkpoint: requests must be a list")
        event, policy = data.get("event"), data.get("policy")
        generation = data.get("generation", 0)
        if isinstance(generation, bool) or not isinstance(generation, int):
            raise MessageDecodeError(
                f"suspend checkpoint: generation must be an integer, got {generation!r}"
            )
        return cls(
            request=request,
            call_id=str(data.get("call_id", request.call_id)),
            opening_text=str(data.get("opening_text", "")),
            event=InboundEvent.from_dict(event) if event is not None else None,
            policy=TurnPolicy.from_dict(policy) if policy is not None else None,
            generation=generation,
            requests=tuple(InputRequest.from_dict(r) for r in listed),
        )


@quick_init
@dataclass(frozen=True, kw_only=True)
class ToolStepResult:
    """A tool step's memoized result: the JSON the model reads, and the error text
    when the call failed (``result`` is then the error result shown to the model)."""

    result: Any
    error: str | None = None

    def __post_init__(self) -> None:
        clean_fields(self, ("result", "error"))

    def to_dict(self) -> JsonObject:
        return {"result": self.result, "error": self.error}

    @classmethod
    def from_dict(cls, data: Any) -> ToolStepResult:
        if not isinstance(data, dict) or "result" not in data:
            raise MessageDecodeError("tool step: expected a JSON object with a result")
        error = data.get("error")
        if error is not None and not isinstance(error, str):
            raise MessageDecodeError(f"tool step: error must be a string or null, got {error!r}")
        return cls(result=data["result"], error=error)


@dataclass(frozen=True, kw_only=True)
class InputAnswer:
    """The answer a resume stores for one input request, and who gave it (the
    verified ``by``, or ``None`` for an anonymous answerer). ``expired="fail"`` is
    what a deadline stores for a request whose ``on_expiry`` fails the turn: the
    asking tool then fails it where it waited."""

    value: Any
    by: str | None = None
    expired: Literal["fail"] | None = None

    def __post_init__(self) -> None:
        clean_fields(self, ("value", "by"))

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"value": self.value, "by": self.by}
        if self.expired is not None:
            out["expired"] = self.expired
        return out

    @classmethod
    def from_dict(cls, data: Any) -> InputAnswer:
        if not isinstance(data, dict) or "value" not in data:
            raise MessageDecodeError("input answer: expected a JSON object with a value")
        by = data.get("by")
        if by is not None and not isinstance(by, str):
            raise MessageDecodeError(f"input answer: by must be a string or null, got {by!r}")
        expired = data.get("expired")
        if expired not in (None, "fail"):
            raise MessageDecodeError(f"input answer: unknown expired {expired!r}")
        return cls(value=data["value"], by=by, expired=expired)
