"""``ScriptedModel``: a ``Model`` that plays back replies you wrote, for tests and demos.

Each call to ``stream`` takes the next entry of the script. An entry is a reply
(``str``, ``ScriptedReply`` or ``ModelReply``), an exception to raise, or a
callable that sees the transcript and returns one of those.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ModelError
from .._seams.model import ModelDelta, ModelDone, ReasoningDelta, TextDelta, ToolSpec
from .._values.messages import JsonObject, Message, ModelReply, StopReason, ToolCall
from .._values.usage import Usage


def tool_call(name: str, input: JsonObject | None = None, *, id: str = "") -> ToolCall:
    """A call for a script; an empty ``id`` is filled in as ``call_<k>`` when played."""
    return ToolCall(id=id, name=name, input=dict(input or {}))


@dataclass(frozen=True, kw_only=True)
class ScriptedReply:
    """One scripted model step.

    ``text`` streams as ``chunks`` deltas (by default one per word), after the
    ``reasoning`` deltas. ``stop`` defaults to ``tool_use`` or ``end_turn``.
    ``usage`` is reported as the step's token usage, as a provider would.
    """

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str = ""
    stop: StopReason | None = None
    chunks: int | None = None
    provider_state: JsonObject | None = None
    usage: Usage | None = None


@dataclass(frozen=True, kw_only=True)
class ScriptedCall:
    """What the engine passed to one ``stream`` call, kept for assertions."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    system: str | None


def _split(text: str, chunks: int | None) -> list[str]:
    if not text:
        return []
    if chunks is None:
        return re.findall(r"\S+\s*|\s+", text)
    size = max(1, -(-len(text) // max(1, chunks)))
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedModel:
    """Plays a script of replies; ``calls`` records every request it received.

    ``ScriptedModel(["hello"])`` answers once. ``ScriptedModel(respond=fn)`` answers
    every call with ``fn(transcript)``, which keeps a replay in a fresh process
    deterministic because the answer depends only on the transcript.
    """

    def __init__(
        self,
        script: Iterable[Any] = (),
        *,
        respond: Callable[[Sequence[Message]], Any] | None = None,
        record_calls: bool = True,
    ) -> None:
        self.script = list(script)
        self.respond = respond
        self.record_calls = record_calls
        self.calls: list[ScriptedCall] = []
        self._next = 0

    def _entry(self, messages: Sequence[Message]) -> Any:
        if self.respond is not None:
            return self.respond(messages)
        if self._next >= len(self.script):
            raise ModelError(
                f"ScriptedModel ran out of replies: the script has {len(self.script)} "
                f"and this is call {self._next + 1}"
            )
        entry = self.script[self._next]
        self._next += 1
        if callable(entry) and not isinstance(entry, BaseException | type):
            return entry(messages)
        return entry

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[ModelDelta]:
        if self.record_calls:
            self.calls.append(
                ScriptedCall(messages=tuple(messages), tools=tuple(tools), system=system)
            )
        entry = self._entry(messages)
        if isinstance(entry, BaseException):
            raise entry
        reply = _as_scripted(entry)
        for piece in _split(reply.reasoning, None):
            yield ReasoningDelta(text=piece)
        for piece in _split(reply.text, reply.chunks):
            yield TextDelta(text=piece)
        calls = tuple(
            c if c.id else ToolCall(id=f"call_{k}", name=c.name, input=c.input)
            for k, c in enumerate(reply.tool_calls, start=1)
        )
        stop = reply.stop or StopReason(kind="tool_use" if calls else "end_turn")
        yield ModelDone(
            reply=ModelReply(
                text=reply.text,
                tool_calls=calls,
                stop=stop,
                provider_state=reply.provider_state,
                usage=reply.usage,
            )
        )


def _as_scripted(entry: Any) -> ScriptedReply:
    if isinstance(entry, str):
        return ScriptedReply(text=entry)
    if isinstance(entry, ScriptedReply):
        return entry
    if isinstance(entry, ModelReply):
        return ScriptedReply(
            text=entry.text,
            tool_calls=entry.tool_calls,
            stop=entry.stop,
            provider_state=entry.provider_state,
            usage=entry.usage,
        )
    raise ModelError(f"ScriptedModel: script entry {entry!r} is not a reply, exception or callable")
