"""Typed answers: the contract ``Agent(output_type=...)`` puts on a turn's final
answer, and the pure judgement of one reply against it.

A reply answers either by calling the output tool or, calling no tool, with the
answer's JSON as its text; pydantic's ``TypeAdapter`` validates both. A refused
reply comes back to the model as an error it can correct, and how many a turn has
had is read off the transcript, so a replay in another process counts the same.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_json

from .._errors import ConfigurationError, TurnError
from .._seams.model import Model, OutputModel, OutputSpec
from .._values.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    ToolCall,
    ToolMessage,
    TriggerMessage,
)
from .._values.turns import TurnFailure, TurnResult
from .tool_results import MAX_ERROR_CHARS, error_result

#: The tool a model answers with when its adapter has no structured output of its own.
OUTPUT_TOOL = "final_answer"
#: Who the message showing a refused text answer to the model is from.
FEEDBACK_BY = "turnkit:output"
#: The result the output tool's accepted call gets.
ACCEPTED = "answer accepted"
#: How many validation errors a refusal lists before it says how many more there were.
_SHOWN_ERRORS = 10
_FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL | re.IGNORECASE)
_DESCRIPTION = (
    "Give the final answer of this turn by calling this tool with it, once you have "
    "everything you need; nothing else you write is read as the answer."
)


@dataclass(frozen=True)
class OutputContract:
    """What an agent's answers must be: the type, its validator and its schema."""

    type: Any
    adapter: TypeAdapter[Any]
    spec: OutputSpec
    #: Refused answers a turn may have corrected before it fails.
    retries: int

    @classmethod
    def build(cls, output_type: Any, retries: object, where: str) -> OutputContract:
        """The contract for ``output_type``, or ``ConfigurationError`` saying what is wrong."""
        retries = check_retries(retries, where)
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(output_type)
            schema = adapter.json_schema()
        except Exception as exc:
            raise ConfigurationError(
                f"{where}: output_type {output_type!r} has no JSON schema pydantic can make: {exc}"
            ) from None
        if schema.get("type") != "object":
            raise ConfigurationError(
                f"{where}: output_type must be a pydantic model, a dataclass or a TypedDict "
                f"(an answer is a JSON object), got {output_type!r}"
            )
        spec = OutputSpec(name=OUTPUT_TOOL, description=_DESCRIPTION, schema=schema)
        return cls(type=output_type, adapter=adapter, spec=spec, retries=retries)

    @property
    def type_name(self) -> str:
        return str(getattr(self.type, "__name__", self.type))

    def validate(self, text: str) -> Any:
        """The answer ``text`` holds, parsed; ``ValidationError`` when it does not fit."""
        return self.adapter.validate_json(answer_json(text))

    def parse(self, text: str, turn_id: str) -> Any:
        """The answer a completed turn stored, parsed again (the same input validates
        the same way, so this gives what the turn's own delivery gave)."""
        try:
            return self.validate(text)
        except ValidationError as exc:
            raise TurnError(
                f"turn {turn_id}: its stored answer does not fit {self.type_name} "
                f"(was the output type changed since?): {describe(exc)}"
            ) from None


def check_retries(retries: object, where: str) -> int:
    """``output_retries`` if it is a count, else ``ConfigurationError``."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(
            f"{where}: output_retries must be an int of at least 0, got {retries!r}"
        )
    return retries


@dataclass(frozen=True)
class Answer:
    """The reply is the turn's answer; ``text`` is its JSON, as the turn keeps it."""

    text: str
    #: The output tool's call the answer came in, or ``None`` for a text answer.
    call: ToolCall | None


@dataclass(frozen=True)
class Refusal:
    """The reply tried to answer and failed; the model is shown ``feedback``."""

    error: str
    feedback: str
    #: Output tool calls, each answered with ``feedback`` as its error result; none
    #: for a text answer, which is followed by a message carrying the feedback.
    calls: tuple[ToolCall, ...]


def judge(contract: OutputContract, reply: ModelReply, *, as_tool: bool) -> Answer | Refusal | None:
    """What ``reply`` is: the answer, a refused answer, or (``None``) neither, because
    it only asks for tools and the turn goes on. ``as_tool``: the output was offered
    as a tool rather than asked of the provider natively, which the feedback names."""
    name = contract.spec.name
    answers = tuple(c for c in reply.tool_calls if c.name == name)
    if not reply.tool_calls:
        return _judged(contract, reply.text, None, as_tool)
    if not answers:
        return None
    if len(answers) == 1 and len(reply.tool_calls) == 1:
        return _judged(contract, to_json(answers[0].input).decode(), answers[0], as_tool)
    error = f"{name} was called together with other tools, or more than once"
    feedback = (
        f"not accepted: call {name} once and alone, after the results of your other "
        "tool calls have come back"
    )
    return Refusal(error=error, feedback=feedback, calls=answers)


def _judged(
    contract: OutputContract, text: str, call: ToolCall | None, as_tool: bool
) -> Answer | Refusal:
    try:
        contract.validate(text)
    except ValidationError as exc:
        error = describe(exc)
        name = contract.spec.name
        if call is not None:
            feedback = (
                f"The answer does not fit the required schema: {error}. "
                f"Call {name} again with a corrected answer."
            )
            return Refusal(error=error, feedback=feedback, calls=(call,))
        how = (
            f"Call the {name} tool with it"
            if as_tool
            else f"Give it as its JSON alone, or by calling {name} if you have that tool"
        )
        feedback = (
            f"That reply is not a valid final answer: {error}. {how}, fitting the required schema."
        )
        return Refusal(error=error, feedback=feedback[:MAX_ERROR_CHARS], calls=())
    return Answer(text=text, call=call)


def answer_json(text: str) -> str:
    """The JSON of a text answer: the text, trimmed, unwrapped from a Markdown fence."""
    stripped = text.strip()
    fenced = _FENCED.fullmatch(stripped)
    return fenced.group(1) if fenced else stripped


def describe(exc: ValidationError) -> str:
    """The validation errors on one line, each as ``where: what``, without doc links."""
    errors = exc.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
        for e in errors[:_SHOWN_ERRORS]
    ]
    if len(errors) > _SHOWN_ERRORS:
        parts.append(f"and {len(errors) - _SHOWN_ERRORS} more")
    return "; ".join(parts)[: MAX_ERROR_CHARS // 2]


def refusals(transcript: Sequence[Message], turn_id: str, name: str) -> int:
    """How many answers ``turn_id`` has had refused: its output calls answered with an
    error and its feedback messages. Walks back through that turn only."""
    count = 0
    for i in range(len(transcript) - 1, -1, -1):
        msg = transcript[i]
        if msg.turn_id != turn_id:
            break
        if isinstance(msg, ToolMessage):
            count += msg.name == name and msg.is_error
        elif isinstance(msg, TriggerMessage):
            count += msg.by == FEEDBACK_BY
    return count


def takes_output(model: Model) -> TypeGuard[OutputModel]:
    """Whether ``model.stream`` takes the ``output`` keyword (native structured output)."""
    try:
        parameters = inspect.signature(model.stream).parameters
    except (TypeError, ValueError):
        return False
    param = parameters.get("output")
    return param is not None and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)


def with_output(contract: OutputContract | None, result: TurnResult) -> TurnResult:
    """``result`` with its parsed ``output`` when the agent's answers are typed."""
    if contract is None or result.status != "completed" or result.output is not None:
        return result
    return replace(result, output=contract.parse(result.text or "", result.turn_id))


def answer_tail(
    contract: OutputContract | None,
    reply: ModelReply,
    transcript: Sequence[Message],
    turn_id: str,
    model: Model,
) -> tuple[list[Message], str | None]:
    """What a model step commits after ``reply``'s own message, and the turn's answer
    text if the step ends the turn (``None``: the turn goes on).

    An answer given as the output tool's call gets its accepted result and then an
    assistant message holding the answer's JSON, so the transcript ends like any
    answered turn. A refused answer gets its error shown to the model, or fails the
    turn with ``TurnFailure`` once the turn has used its retries.
    """
    if contract is None:
        return [], None if reply.tool_calls else reply.text
    verdict = judge(contract, reply, as_tool=not takes_output(model))
    if verdict is None:
        return [], None
    if isinstance(verdict, Answer):
        if verdict.call is None:
            return [], verdict.text
        call = verdict.call
        accepted = ToolMessage(call_id=call.id, name=call.name, result=ACCEPTED, turn_id=turn_id)
        return [accepted, AssistantMessage(text=verdict.text, turn_id=turn_id)], verdict.text
    used = refusals(transcript, turn_id, contract.spec.name)
    if used >= contract.retries:
        raise TurnFailure(
            f"the answer does not fit {contract.type_name} "
            f"({used} of {contract.retries} retries used): {verdict.error}"
        )
    if verdict.calls:
        shown = error_result(verdict.feedback)
        return [
            ToolMessage(call_id=c.id, name=c.name, result=shown, turn_id=turn_id, is_error=True)
            for c in verdict.calls
        ], None
    return [TriggerMessage(text=verdict.feedback, turn_id=turn_id, by=FEEDBACK_BY)], None
