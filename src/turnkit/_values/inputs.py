"""What a parked turn waits for: the input request and who may answer it, as values.

A tool asks with ``await ctx.request_input(...)``; the engine stores the request in
the turn's suspend checkpoint and announces it in ``input.requested``. Everything
here round-trips through JSON, because a resume may happen days later in another
process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

import jsonschema

from .._errors import MessageDecodeError
from .decisions import DecisionOptions
from .messages import JsonObject
from .text import clean_fields


@dataclass(frozen=True, kw_only=True)
class Answerer:
    """One party allowed to answer: a verified user id, or a named policy (and scope)."""

    kind: Literal["user", "policy"]
    user_id: str | None = None
    policy: str | None = None
    scope: str | None = None

    def __post_init__(self) -> None:
        if self.kind == "user" and not (isinstance(self.user_id, str) and self.user_id):
            raise ValueError("Answerers.user needs a non-empty user id")
        if self.kind == "policy" and not (isinstance(self.policy, str) and self.policy):
            raise ValueError("Answerers.policy needs a non-empty policy name")
        if self.kind not in ("user", "policy"):
            raise ValueError(f"answerer kind must be 'user' or 'policy', got {self.kind!r}")

    def describe(self) -> str:
        if self.kind == "user":
            return f"user {self.user_id}"
        return f"policy {self.policy}" + (f" (scope {self.scope})" if self.scope else "")

    def to_dict(self) -> JsonObject:
        if self.kind == "user":
            return {"kind": "user", "user_id": self.user_id}
        return {"kind": "policy", "policy": self.policy, "scope": self.scope}

    @classmethod
    def from_dict(cls, data: Any) -> Answerer:
        try:
            if data["kind"] == "user":
                return cls(kind="user", user_id=str(data["user_id"]))
            if data["kind"] == "policy":
                scope = data.get("scope")
                return cls(
                    kind="policy",
                    policy=str(data["policy"]),
                    scope=None if scope is None else str(scope),
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageDecodeError(f"answerer: malformed {data!r}: {exc}") from None
        raise MessageDecodeError(f"answerer: unknown kind in {data!r}")


class Answerers:
    """Constructors for ``request_input(answerers=...)``."""

    @staticmethod
    def user(user_id: str) -> Answerer:
        """Only a resume whose verified ``by`` is ``user_id``."""
        return Answerer(kind="user", user_id=user_id)

    @staticmethod
    def policy(policy: str, scope: str | None = None) -> Answerer:
        """Only a resume carrying a ``Grant`` for exactly this policy and scope."""
        return Answerer(kind="policy", policy=policy, scope=scope)


#: What a request's deadline does (see ``Expiry``).
ExpiryAction: TypeAlias = Literal["answer", "cancel", "fail"]


@dataclass(frozen=True, kw_only=True)
class Expiry:
    """What happens when a request's deadline passes unanswered: the turn resumes
    with ``value`` as the answer (``action="answer"``, recorded as given by
    ``"deadline"``), or it ends ``cancelled`` or ``failed``."""

    action: ExpiryAction
    value: Any = None

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"action": self.action}
        if self.action == "answer":
            out["value"] = self.value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Expiry:
        if not isinstance(data, dict) or data.get("action") not in ("answer", "cancel", "fail"):
            raise MessageDecodeError(f"input request: malformed on_expiry {data!r}")
        return cls(action=data["action"], value=data.get("value"))


#: What a request waits for: a person's answer (``input``), a person's decision on a
#: proposed call (``decision``), or only the clock (``timer``: ``ctx.sleep``, a
#: retry's backoff), which ``session.wake`` can end early and nobody answers.
RequestKind: TypeAlias = Literal["input", "decision", "timer"]


@dataclass(frozen=True, kw_only=True)
class InputRequest:
    """A question a parked turn waits on.

    ``answerers`` empty means anyone may answer (a turn no person opened).
    ``schema`` is a JSON Schema the answer must satisfy, if given. ``kind`` is
    ``"decision"`` for an ``Approval``'s question on a proposed call, whose
    ``decision`` says what may be decided (the answer is a ``Decision``);
    ``"timer"`` for a wait on the clock alone (``ctx.sleep``, a retry's backoff),
    which ends at ``expires_at`` and nobody answers; ``"input"`` for any other.
    ``asked_at`` is when it was asked (seconds since the epoch; ``None`` in a
    request stored before turnkit kept it).

    ``expires_at`` (seconds since the epoch) is its deadline, with ``on_expiry``
    saying what happens then; ``remind_at`` is when the next reminder is due, one
    every ``remind_every`` seconds until an answer or the deadline.
    """

    id: str
    prompt: str
    turn_id: str
    call_id: str
    tool: str
    schema: JsonObject | None = None
    answerers: tuple[Answerer, ...] = ()
    kind: RequestKind = "input"
    decision: DecisionOptions | None = None
    expires_at: float | None = None
    on_expiry: Expiry | None = None
    remind_every: float | None = None
    remind_at: float | None = None
    asked_at: float | None = None

    def __post_init__(self) -> None:
        clean_fields(self, ("id", "prompt", "schema"))
        if (self.kind == "decision") != (self.decision is not None):
            raise ValueError("a decision request (and only one) carries DecisionOptions")

    @property
    def wake_at(self) -> float | None:
        """When the clock next has something to do for this request: a reminder
        before the deadline, or the deadline."""
        times = [t for t in (self.expires_at, self.remind_at) if t is not None]
        return min(times) if times else None

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "id": self.id,
            "prompt": self.prompt,
            "turn_id": self.turn_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "schema": self.schema,
            "answerers": [a.to_dict() for a in self.answerers],
            "kind": self.kind,
            "decision": self.decision.to_dict() if self.decision is not None else None,
            "asked_at": self.asked_at,
        }
        # Written only when set, so a request without a clock keeps its old form.
        for name in ("expires_at", "remind_every", "remind_at"):
            if (value := getattr(self, name)) is not None:
                out[name] = value
        if self.on_expiry is not None:
            out["on_expiry"] = self.on_expiry.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> InputRequest:
        if not isinstance(data, dict):
            raise MessageDecodeError("input request: expected a JSON object")
        try:
            schema, raw_kind = data.get("schema"), data.get("kind") or "input"
            if raw_kind not in ("input", "decision", "timer"):
                raise MessageDecodeError(f"input request: unknown kind {raw_kind!r}")
            kind = cast(RequestKind, raw_kind)  # one of its values, checked just above
            options = data.get("decision")
            expiry = data.get("on_expiry")
            return cls(
                id=str(data["id"]),
                prompt=str(data["prompt"]),
                turn_id=str(data["turn_id"]),
                call_id=str(data["call_id"]),
                tool=str(data["tool"]),
                schema=dict(schema) if schema is not None else None,
                answerers=tuple(Answerer.from_dict(a) for a in data.get("answerers") or ()),
                kind=kind,
                decision=DecisionOptions.from_dict(options) if options is not None else None,
                expires_at=_seconds(data, "expires_at"),
                on_expiry=Expiry.from_dict(expiry) if expiry is not None else None,
                remind_every=_seconds(data, "remind_every"),
                remind_at=_seconds(data, "remind_at"),
                asked_at=_seconds(data, "asked_at"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageDecodeError(f"input request: missing or malformed field {exc}") from None


def reminder_before_deadline(remind_at: float | None, expires_at: float | None) -> float | None:
    """``remind_at``, unless the question's deadline comes at or before it: then no
    reminder is given (the expiry says more than a reminder would)."""
    if remind_at is not None and expires_at is not None and remind_at >= expires_at:
        return None
    return remind_at


def _seconds(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MessageDecodeError(f"input request: {name} must be a number, got {value!r}")
    return float(value)


def as_answerers(value: Answerer | Sequence[Answerer] | None) -> tuple[Answerer, ...] | None:
    """Normalize ``request_input``'s ``answerers`` argument; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, Answerer):
        return (value,)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            "answerers must be Answerers.user(...), Answerers.policy(...) or a list of them, "
            f"got {value!r}"
        )
    out = tuple(value)
    for a in out:
        if not isinstance(a, Answerer):
            raise TypeError(f"answerers must be built with Answerers.user/policy, got {a!r}")
    if not out:
        raise TypeError("answerers must not be empty; pass None for the default answerer")
    return out


@dataclass(frozen=True, kw_only=True)
class AnswerCheck:
    """What ``authorize_answer`` decides on: may ``by`` (with ``principal``) answer for
    ``policy`` in ``scope``?"""

    policy: str
    scope: str | None
    by: str | None
    principal: Any = None


AuthorizeAnswer = Callable[[AnswerCheck], Awaitable[bool]]


def check_schema(schema: Any) -> None:
    """Refuse, at request time, a schema that is not a valid JSON Schema."""
    if not isinstance(schema, dict):
        raise TypeError(f"schema must be a JSON Schema object (a dict), got {schema!r}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise TypeError(f"schema is not a valid JSON Schema: {exc.message}") from None
