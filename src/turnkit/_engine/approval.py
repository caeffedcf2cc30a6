"""``Approval``: a person decides on a tool call before it runs.

``define_action(approval=...)`` and ``@tool(approval=...)`` wrap a tool's ``run``:
when ``when`` says the proposed arguments need it, the turn parks on a decision
request, and once answered the tool runs as proposed (approve), with the edited
arguments (edit), or not at all, the model reading a rejection or a person's
message as its result instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

import jsonschema
from pydantic_core import from_json, to_json

from .._errors import ToolDefinitionError
from .._seams.model import ToolSpec
from .._values.checkpoints import InputAnswer
from .._values.decisions import Decision, DecisionKind, DecisionOptions, decision_kinds
from .._values.inputs import (
    Answerer,
    Expiry,
    InputRequest,
    as_answerers,
    reminder_before_deadline,
)
from .._values.messages import JsonObject
from .._values.step_ids import input_step_id
from .context import ToolContext, TurnParked
from .input_errors import ToolInputError

#: What ``Approval.allowed`` is when not given: a yes or a no, nothing rewritten.
DEFAULT_ALLOWED: tuple[DecisionKind, ...] = ("approve", "reject")


@dataclass(frozen=True, kw_only=True)
class Approval:
    """Ask a person to decide on a call before the tool runs.

    ``allowed`` are the decisions the answer may take (``approve``, ``edit``,
    ``reject``, ``respond``; default approve or reject). ``when(arguments)`` says
    whether a proposed call needs a decision (default: every call). ``answerers``
    say who may decide, as for ``request_input`` (default: the turn's speaker, if
    attested). ``prompt`` is the question, a string or a function of the arguments.
    """

    allowed: Sequence[DecisionKind] = DEFAULT_ALLOWED
    when: Callable[[JsonObject], bool] | None = None
    answerers: Answerer | Sequence[Answerer] | None = None
    prompt: str | Callable[[JsonObject], str] | None = None
    #: A deadline for the decision (a ``timedelta`` or seconds), with ``on_expiry``
    #: what happens then: ``Decision.reject(...)`` or another allowed decision taken
    #: for nobody (recorded as by ``"deadline"``), or ``"cancel"`` / ``"fail"``.
    expires_in: timedelta | float | None = None
    on_expiry: Decision | Literal["cancel", "fail"] | None = None
    #: A reminder that often until the decision comes (see ``request_input``).
    remind_every: timedelta | float | None = None
    _answerers: tuple[Answerer, ...] | None = field(init=False, repr=False, compare=False)
    _expiry: Expiry | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "allowed", decision_kinds(self.allowed))
        except ValueError as exc:
            raise ToolDefinitionError(f"Approval: {exc}") from None
        if self.when is not None and not callable(self.when):
            raise ToolDefinitionError(f"Approval.when must be callable, got {self.when!r}")
        if self.prompt is not None and not (isinstance(self.prompt, str) or callable(self.prompt)):
            raise ToolDefinitionError(
                f"Approval.prompt must be a str or a function, got {self.prompt!r}"
            )
        try:
            object.__setattr__(self, "_answerers", as_answerers(self.answerers))
        except TypeError as exc:
            raise ToolDefinitionError(f"Approval: {exc}") from None
        object.__setattr__(self, "_expiry", self._checked_expiry())

    def _checked_expiry(self) -> Expiry | None:
        """``on_expiry`` as the request's ``Expiry``, checked when declared."""
        for name in ("expires_in", "remind_every"):
            value = getattr(self, name)
            seconds = _seconds_of(value)
            if value is not None and (seconds is None or not 0 < seconds < float("inf")):
                raise ToolDefinitionError(
                    f"Approval.{name} must be a timedelta or seconds, more than zero; got {value!r}"
                )
        if self.expires_in is None:
            if self.on_expiry is not None:
                raise ToolDefinitionError("Approval.on_expiry needs expires_in (a deadline)")
            return None
        if self.on_expiry in ("cancel", "fail"):
            return Expiry(action=self.on_expiry)
        if not isinstance(self.on_expiry, Decision):
            raise ToolDefinitionError(
                "Approval.expires_in needs on_expiry: a Decision (Decision.reject(...), say), "
                f"'cancel' or 'fail'; got {self.on_expiry!r}"
            )
        if self.on_expiry.kind not in self.allowed or self.on_expiry.kind == "edit":
            raise ToolDefinitionError(
                f"Approval.on_expiry: the decision {self.on_expiry.kind!r} cannot be taken at "
                f"the deadline (allowed: {', '.join(self.allowed)}; an edit needs a person)"
            )
        return Expiry(action="answer", value=self.on_expiry.to_dict())

    def question(self, tool: str, arguments: JsonObject) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if self.prompt is not None:
            return str(self.prompt(arguments))
        return f"Allow {tool} with these arguments?"


def _copy(value: JsonObject) -> JsonObject:
    """A private copy of JSON arguments, so neither ``when`` nor the tool can change
    what the request shows or the answer stored."""
    copied: JsonObject = from_json(to_json(value))
    return copied


def decision_id(tool: str, call_id: str) -> str:
    """The id of the decision a call waits on: ``approve-<tool>@<call id>``, one per call."""
    return f"approve-{tool}@{call_id}"


def approved_run(
    inner: Callable[[Any, ToolContext], Any], *, local: bool, spec: ToolSpec, approval: Approval
) -> Callable[[Any, ToolContext], Awaitable[Any]]:
    """``inner`` (a tool's ``run``), behind a decision on each call ``approval`` says
    needs one; a plain ``def`` ``inner`` runs off the event loop, as it would alone."""

    async def run(data: Any, ctx: ToolContext) -> Any:
        proposed: JsonObject = data if isinstance(data, dict) else {}
        if approval.when is None or approval.when(_copy(proposed)):
            decision = await _decide(ctx, approval, spec.name, spec.input_schema, proposed)
            instead = decision.result_for_model(spec.name)
            if instead is not None:
                return instead
            if decision.arguments is not None:
                data = _copy(decision.arguments)
        if local:
            return await asyncio.to_thread(inner, data, ctx)
        return await inner(data, ctx)

    return run


async def _decide(
    ctx: ToolContext, approval: Approval, tool: str, schema: JsonObject, proposed: JsonObject
) -> Decision:
    """The stored decision on this call, or park the turn to ask for one."""
    input_id = decision_id(tool, ctx.call_id)
    stored = ctx._steps.get(input_step_id(ctx.turn_id, input_id))
    if stored is not None:
        return Decision.from_value(InputAnswer.from_dict(stored).value)
    try:  # a call the tool would refuse is not worth a person's time
        jsonschema.validate(proposed, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "input"
        raise ToolInputError(f"invalid input: {where}: {exc.message}") from None
    except jsonschema.SchemaError:
        pass  # the tool's own schema is its author's business; the tool still checks
    who = approval._answerers
    if who is None:
        who = ctx._default_answerers(input_id)  # (a FatalToolError fails the turn)
    options = DecisionOptions(
        allowed=tuple(approval.allowed),
        arguments=_copy(proposed),
        arguments_schema=schema,
    )
    now = time.time()
    expires = _seconds_of(approval.expires_in)
    every = _seconds_of(approval.remind_every)
    expires_at = None if expires is None else now + expires
    remind_at = reminder_before_deadline(None if every is None else now + every, expires_at)
    raise TurnParked(
        InputRequest(
            id=input_id,
            prompt=approval.question(tool, proposed),
            turn_id=ctx.turn_id,
            call_id=ctx.call_id,
            tool=tool,
            schema=options.answer_schema(),
            answerers=who,
            kind="decision",
            decision=options,
            expires_at=expires_at,
            on_expiry=approval._expiry,
            remind_every=every,
            remind_at=remind_at,
            asked_at=now,
        )
    )


def _seconds_of(value: object) -> float | None:
    """A duration as seconds (``None`` for none, or for what is not a duration)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


async def ask_again(ctx: ToolContext, input_id: str, request: InputRequest) -> None:
    """Ask ``request`` (another turn's decision, a subagent's) as ``ctx``'s own question
    ``input_id``, keeping its kind and options, so the answer is offered and checked as
    a decision here too; returns once this turn holds an answer to it."""
    if ctx._steps.get(input_step_id(ctx.turn_id, input_id)) is not None:
        return
    who = request.answerers or ctx._default_answerers(input_id)
    raise TurnParked(
        replace(
            request,
            id=input_id,
            turn_id=ctx.turn_id,
            call_id=ctx.call_id,
            tool=ctx.tool_name,
            answerers=who,
            asked_at=time.time(),
        )
    )
