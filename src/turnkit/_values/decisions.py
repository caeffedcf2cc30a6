"""Decisions on a proposed tool call: what a person may decide, and what they decided.

An ``Approval`` around a tool parks the turn on an ``InputRequest`` of kind
``"decision"``; its ``DecisionOptions`` say which decisions the answer may take and
carry the call's proposed arguments (and the tool's input schema, against which
edited arguments are checked). The answer is a ``Decision``'s JSON form, so it is
checked and stored like every other answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

import jsonschema

from .._errors import MessageDecodeError
from .messages import JsonObject

DecisionKind: TypeAlias = Literal["approve", "edit", "reject", "respond"]
#: Every decision kind, in the order a front end offers them.
DECISION_KINDS: tuple[DecisionKind, ...] = ("approve", "edit", "reject", "respond")


def decision_kinds(allowed: Any) -> tuple[DecisionKind, ...]:
    """``allowed`` as a tuple of known kinds in canonical order; ``ValueError`` else."""
    if isinstance(allowed, str) or not isinstance(allowed, tuple | list | frozenset | set):
        raise ValueError(f"allowed must be a tuple of decision kinds, got {allowed!r}")
    unknown = [k for k in allowed if k not in DECISION_KINDS]
    if unknown or not allowed:
        raise ValueError(
            f"allowed takes one or more of {', '.join(DECISION_KINDS)}, got {tuple(allowed)!r}"
        )
    return tuple(k for k in DECISION_KINDS if k in allowed)


@dataclass(frozen=True, kw_only=True)
class DecisionOptions:
    """What a decision request offers: the ``allowed`` decisions, the ``arguments``
    the model proposed, and the tool's input schema (``arguments_schema``) that
    edited arguments must satisfy."""

    allowed: tuple[DecisionKind, ...]
    arguments: JsonObject
    arguments_schema: JsonObject | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", decision_kinds(self.allowed))

    def to_dict(self) -> JsonObject:
        return {
            "allowed": list(self.allowed),
            "arguments": self.arguments,
            "arguments_schema": self.arguments_schema,
        }

    @classmethod
    def from_dict(cls, data: Any) -> DecisionOptions:
        if not isinstance(data, dict):
            raise MessageDecodeError(f"decision options: expected a JSON object, got {data!r}")
        arguments, schema = data.get("arguments"), data.get("arguments_schema")
        if not isinstance(arguments, dict) or not (schema is None or isinstance(schema, dict)):
            raise MessageDecodeError("decision options: arguments and their schema are objects")
        try:
            allowed = tuple(data.get("allowed") or ())
            return cls(allowed=allowed, arguments=arguments, arguments_schema=schema)
        except ValueError as exc:
            raise MessageDecodeError(f"decision options: {exc}") from None

    def answer_schema(self) -> JsonObject:
        """The JSON Schema of an answer: one of the allowed decisions' shapes."""
        return {"oneOf": [_SHAPES[k] for k in self.allowed]}

    def check(self, value: Any) -> Decision:
        """The decision ``value`` holds if this request allows it, else ``ValueError``
        naming what is wrong (an edit's arguments are checked against the tool's
        input schema)."""
        decision = Decision.from_value(value)
        if decision.kind not in self.allowed:
            raise ValueError(
                f"the decision {decision.kind!r} is not allowed here; "
                f"allowed: {', '.join(self.allowed)}"
            )
        if decision.kind == "edit" and self.arguments_schema is not None:
            try:
                jsonschema.validate(decision.arguments, self.arguments_schema)
            except jsonschema.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path) or "the arguments"
                raise ValueError(
                    f"the edited arguments do not match the tool's input schema: "
                    f"{where}: {exc.message}"
                ) from None
        return decision


_TEXT = {"type": "string"}
_SHAPES: dict[str, JsonObject] = {
    "approve": {
        "type": "object",
        "properties": {"decision": {"const": "approve"}},
        "required": ["decision"],
        "additionalProperties": False,
    },
    "edit": {
        "type": "object",
        "properties": {"decision": {"const": "edit"}, "arguments": {"type": "object"}},
        "required": ["decision", "arguments"],
        "additionalProperties": False,
    },
    "reject": {
        "type": "object",
        "properties": {"decision": {"const": "reject"}, "reason": _TEXT},
        "required": ["decision"],
        "additionalProperties": False,
    },
    "respond": {
        "type": "object",
        "properties": {"decision": {"const": "respond"}, "message": {**_TEXT, "minLength": 1}},
        "required": ["decision", "message"],
        "additionalProperties": False,
    },
}


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One decision on a proposed call; its ``to_dict()`` is the answer a resume takes
    (``session.resume(turn_id, input_id, Decision.edit({...}), by=...)`` accepts the
    object itself too).

    ``arguments`` are an edit's replacement arguments, ``reason`` why a call was
    rejected (the model reads it), ``message`` what the model reads instead of the
    tool's result when a person responds.
    """

    kind: DecisionKind
    arguments: JsonObject | None = None
    reason: str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in DECISION_KINDS:
            raise ValueError(f"decision kind must be one of {DECISION_KINDS}, got {self.kind!r}")
        if (self.kind == "edit") != isinstance(self.arguments, dict):
            raise ValueError("an edit (and only an edit) carries arguments, as a dict")
        if self.reason is not None and (self.kind != "reject" or not isinstance(self.reason, str)):
            raise ValueError("only a reject carries a reason, as a str")
        if self.kind == "respond" and not (isinstance(self.message, str) and self.message):
            raise ValueError("a respond decision needs a non-empty message")
        if self.kind != "respond" and self.message is not None:
            raise ValueError("only a respond decision carries a message")

    @classmethod
    def approve(cls) -> Decision:
        """Run the call as the model proposed it."""
        return cls(kind="approve")

    @classmethod
    def edit(cls, arguments: JsonObject) -> Decision:
        """Run the call with ``arguments`` instead of the model's."""
        return cls(kind="edit", arguments=arguments)

    @classmethod
    def reject(cls, reason: str | None = None) -> Decision:
        """Do not run the call; the model reads that it was rejected, and why."""
        return cls(kind="reject", reason=reason)

    @classmethod
    def respond(cls, message: str) -> Decision:
        """Do not run the call; the model reads ``message`` as its result."""
        return cls(kind="respond", message=message)

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"decision": self.kind}
        if self.kind == "edit":
            out["arguments"] = self.arguments
        elif self.kind == "reject" and self.reason is not None:
            out["reason"] = self.reason
        elif self.kind == "respond":
            out["message"] = self.message
        return out

    @classmethod
    def from_value(cls, value: Any) -> Decision:
        """The decision an answer holds; ``ValueError`` naming what is wrong."""
        if not isinstance(value, dict) or value.get("decision") not in DECISION_KINDS:
            raise ValueError(
                'a decision is an object like {"decision": "approve"}, with "decision" one of '
                f"{', '.join(DECISION_KINDS)}; got {value!r}"
            )
        extra = set(value) - {"decision", "arguments", "reason", "message"}
        if extra:
            raise ValueError(f"a decision takes no {', '.join(sorted(extra))}")
        kind = cast(DecisionKind, value["decision"])
        return cls(
            kind=kind,
            arguments=value.get("arguments"),
            reason=value.get("reason"),
            message=value.get("message"),
        )

    def result_for_model(self, tool: str) -> str | None:
        """What the model reads instead of the tool's result, or ``None`` when the
        tool runs (approve, edit)."""
        if self.kind == "reject":
            why = f" Reason: {self.reason}" if self.reason else ""
            return f"{tool} did not run: the person reviewing the call rejected it.{why}"
        if self.kind == "respond":
            return f"{tool} did not run; the person reviewing the call says: {self.message}"
        return None
