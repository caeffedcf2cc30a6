"""One model call: stream the reply, pass deltas on live, and check what came back.

A broken or empty reply raises ``TurnFailure`` before anything is committed, so a
redelivery asks the model again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import from_json, to_json

from .._errors import ContextWindowError, ModelError, ModelOverloadedError
from .._seams.model import ModelDelta, ModelDone, ReasoningDelta, TextDelta, ToolSpec
from .._values.messages import JsonObject, Message, ModelReply, StopReason, ToolCall
from .._values.turns import TurnCancelled, TurnFailure
from .._values.usage import Usage
from .agent import Agent
from .output import takes_output
from .tool_results import error_text


@dataclass(frozen=True)
class Sent:
    """What one model call is sent: the messages (the transcript, or the part of it a
    history policy chose) and the system prompt (with the summary of what was left
    out, if there is one)."""

    messages: Sequence[Message]
    system: str | None


#: The remedy a context-window failure names.
WINDOW_REMEDY = (
    "give the agent a history policy that sends less of the transcript, e.g. "
    "Agent(history=turnkit.LastTurns(20)), TokenBudget(...) or SummarizeOlder(...) "
    "(or a smaller budget for the one it has), then redeliver the turn or send the next one"
)


def window_failure(detail: str) -> TurnFailure:
    """The failure of a turn whose request did not fit the model's context window."""
    return TurnFailure(
        f"model error: the request exceeded the model's context window ({detail}); " + WINDOW_REMEDY
    )


async def ask_model(
    agent: Agent,
    sent: Sent,
    on_text: Callable[[str], None],
    on_reasoning: Callable[[str], None],
    cancelled: Callable[[], str | None] = lambda: None,
    *,
    tools: Sequence[ToolSpec],
) -> tuple[ModelReply, JsonObject]:
    """Stream one reply from ``agent.model``, offering it ``tools`` (the turn's, as its
    policy allows); deltas go to the callbacks as they arrive. Returns the reply in
    its stored form and the record its step stores (see ``stored_form``).

    ``cancelled`` is asked after every delta: a reason stops the stream there (the
    adapter's iterator is closed) and raises ``TurnCancelled``; nothing is kept.
    """
    reply = await stream_reply(
        lambda: _stream(agent, sent, tools), cancelled, _step_failure, on_text, on_reasoning
    )
    if reply is None:
        raise TurnFailure("model error: the stream ended without ModelDone")
    check_reply(reply)
    return stored_form(reply)


async def stream_reply(
    open_stream: Callable[[], AsyncIterator[ModelDelta]],
    cancelled: Callable[[], str | None],
    failure: Callable[[Exception], TurnFailure],
    on_text: Callable[[str], None] = lambda _: None,
    on_reasoning: Callable[[str], None] = lambda _: None,
) -> ModelReply | None:
    """Drive one model stream to its ``ModelDone``: the reply, or None if the stream
    ended without one. Shared by model steps and history summary calls.

    ``cancelled`` is asked after every delta (a reason raises ``TurnCancelled``); the
    adapter's iterator is always closed; any other failure, opening the stream
    included, becomes the ``TurnFailure`` that ``failure`` words for its caller.
    """
    reply: ModelReply | None = None
    try:
        stream = open_stream()
        try:
            async for delta in stream:
                if isinstance(delta, TextDelta):
                    on_text(delta.text)
                elif isinstance(delta, ReasoningDelta):
                    on_reasoning(delta.text)
                elif isinstance(delta, ModelDone):
                    reply = delta.reply
                    break
                else:
                    raise ModelError(f"the model yielded {delta!r}, which is not a ModelDelta")
                why = cancelled()
                if why is not None:
                    raise TurnCancelled(why)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
    except TurnCancelled:
        raise
    except Exception as exc:
        raise failure(exc) from exc
    return reply


class ModelBusy(TurnFailure):
    """A model step the provider refused for load (``ModelOverloadedError``): the
    step parks on a timer and asks again, while its ``Retry`` allows."""

    def __init__(self, message: str, error: ModelOverloadedError) -> None:
        super().__init__(message)
        self.error = error


def _step_failure(exc: Exception) -> TurnFailure:
    """A model step's wording for a failed call."""
    if isinstance(exc, ModelOverloadedError):
        return ModelBusy(f"model error: {exc}", exc)
    if isinstance(exc, ContextWindowError):
        return window_failure(str(exc))
    if isinstance(exc, ModelError):
        return TurnFailure(f"model error: {exc}")
    return TurnFailure(f"model error: {error_text(exc)}")


def _stream(agent: Agent, sent: Sent, tools: Sequence[ToolSpec]) -> AsyncIterator[ModelDelta]:
    """The model's stream, asked for a typed answer natively where the model can
    give one, else with the answer offered as one more tool."""
    model, spec = agent.model, agent.output_spec
    messages, system = sent.messages, sent.system
    if spec is None:
        return model.stream(messages, tools, system=system)
    if takes_output(model):
        return model.stream(messages, tools, system=system, output=spec)
    return model.stream(messages, (*tools, spec.tool()), system=system)


def check_reply(reply: object) -> None:
    """Refuse, before it is committed, a reply the transcript could not hold or replay."""
    if not isinstance(reply, ModelReply):
        raise TurnFailure(f"model error: ModelDone.reply must be a ModelReply, got {reply!r}")
    if not isinstance(reply.text, str):
        raise TurnFailure(f"model error: reply text must be a str, got {type(reply.text).__name__}")
    if reply.usage is not None and not isinstance(reply.usage, Usage):
        raise TurnFailure(f"model error: reply usage must be a Usage, got {reply.usage!r}")
    empty = reply.empty
    if empty and reply.stop is not None and reply.stop.kind == "context_window":
        raw = f" ({reply.stop.raw})" if reply.stop.raw else ""
        raise window_failure(f"the model stopped with context_window{raw} and an empty reply")
    if reply.model is not None and not isinstance(reply.model, str):
        raise TurnFailure(f"model error: reply model must be a str, got {reply.model!r}")
    if empty and reply.stop is not None and reply.stop.abnormal:
        raw = f" ({reply.stop.raw})" if reply.stop.raw else ""
        raise TurnFailure(
            f"model error: the model stopped with {reply.stop.kind}{raw} and an empty reply"
        )
    seen: set[str] = set()
    for call in reply.tool_calls:
        _check_call(call, seen)


def stored_form(reply: ModelReply) -> tuple[ModelReply, JsonObject]:
    """The reply exactly as a replay will read it back, and its ``to_dict()`` (the
    record its step stores); or ``TurnFailure`` if it cannot be stored: what is
    committed must decode again, or the session would be unreadable.

    A reply whose fields have the types a replay decodes and whose JSON reads back
    equal (the usual case: adapters build replies from JSON) already is that form and
    is kept; any other is rebuilt from its JSON, which also checks it. A reply whose
    free-form parts (inputs, provider state) hold only what JSON decodes to is known
    to read back equal without the round trip.
    """
    try:
        data = reply.to_dict()
        if _decoded_types(reply) and _free_form_decoded(reply):
            return reply, data
        stored = from_json(to_json(data))
        if stored == data and _decoded_types(reply):
            return reply, data
        rebuilt = ModelReply.from_dict(stored)
        return rebuilt, rebuilt.to_dict()
    except Exception as exc:
        for call in reply.tool_calls:  # (the reply's one JSON pass checked their inputs)
            _check_input(call)
        raise TurnFailure(f"model error: the reply cannot be stored: {error_text(exc)}") from exc


def _decoded_types(reply: ModelReply) -> bool:
    """True when each field of ``reply`` has exactly the type ``from_dict`` gives it."""
    if not (
        type(reply.text) is str
        and type(reply.tool_calls) is tuple
        and (reply.stop is None or type(reply.stop) is StopReason)
        and (reply.provider_state is None or type(reply.provider_state) is dict)
        and (reply.usage is None or type(reply.usage) is Usage)
        and (reply.model is None or type(reply.model) is str)
    ):
        return False
    for c in reply.tool_calls:  # (a loop, not all() over a generator: once a step)
        if not (
            type(c) is ToolCall
            and type(c.id) is str
            and type(c.name) is str
            and type(c.input) is dict
            and (c.provider_state is None or type(c.provider_state) is dict)
        ):
            return False
    return True


#: How deep ``_decoded_json`` looks before leaving the answer to a JSON round trip
#: (deeper than the encoder goes is refused there, with its own words).
_DECODED_DEPTH = 64


def _free_form_decoded(reply: ModelReply) -> bool:
    """Whether every free-form JSON part of ``reply`` holds only what JSON decodes to."""
    if reply.provider_state is not None and not _decoded_json(reply.provider_state):
        return False
    for c in reply.tool_calls:
        if not _decoded_json(c.input) or (
            c.provider_state is not None and not _decoded_json(c.provider_state)
        ):
            return False
    return True


def _decoded_json(value: object) -> bool:
    """Whether ``value`` is made only of the exact types JSON decodes to (dicts with
    str keys, lists, str, int, bool, None and finite floats), at most
    ``_DECODED_DEPTH`` levels deep: then its JSON reads back equal to it. False only
    means "not known": a tuple, a str subclass or an infinity may still encode."""
    level: list[Any] = [value]  # (Any: each kind is told apart by its exact type)
    for _ in range(_DECODED_DEPTH):
        deeper: list[Any] = []
        for v in level:
            kind = type(v)
            if kind is str or kind is int or kind is bool or v is None:
                continue
            if kind is float:
                if v - v != 0.0:  # (inf and nan: not finite)
                    return False
            elif kind is dict:
                for key in v:
                    if type(key) is not str:
                        return False
                deeper.extend(v.values())
            elif kind is list:
                deeper.extend(v)
            else:
                return False
        if not deeper:
            return True
        level = deeper
    return False


def _check_call(call: object, seen: set[str]) -> None:
    if not isinstance(call, ToolCall):
        raise TurnFailure(f"model error: tool calls must be ToolCall objects, got {call!r}")
    if not isinstance(call.id, str) or not call.id or call.id in seen:
        raise TurnFailure(f"model error: tool call id {call.id!r} is empty or repeated")
    if not isinstance(call.name, str) or not isinstance(call.input, dict):
        raise TurnFailure(
            f"model error: tool call {call.id!r} needs a str name and a dict input, got "
            f"{type(call.name).__name__} and {type(call.input).__name__}"
        )
    seen.add(call.id)


def _check_input(call: ToolCall) -> None:
    """Refuse a call whose input is not JSON, naming it (``stored_form``'s wording)."""
    try:
        to_json(call.input)
    except Exception as exc:
        raise TurnFailure(f"model error: tool call {call.id!r} input is not JSON: {exc}") from exc
