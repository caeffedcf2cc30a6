"""The ``Model`` seam: what the engine asks of any language model, and what it streams back.

A model streams ``TextDelta`` and ``ReasoningDelta`` pieces as they arrive and ends
with exactly one ``ModelDone`` carrying the whole reply. Deltas are shown live and
never stored; only the ``ModelDone`` reply is checkpointed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from .._values.frozen import quick_init
from .._values.messages import JsonObject, Message, ModelReply


@quick_init
@dataclass(frozen=True, kw_only=True)
class TextDelta:
    """A piece of the reply's visible text."""

    text: str
    type: Literal["text"] = "text"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ReasoningDelta:
    """A piece of the model's reasoning (thinking) text."""

    text: str
    type: Literal["reasoning"] = "reasoning"


@quick_init
@dataclass(frozen=True, kw_only=True)
class ModelDone:
    """The end of a model step: the complete reply."""

    reply: ModelReply
    type: Literal["done"] = "done"


ModelDelta: TypeAlias = TextDelta | ReasoningDelta | ModelDone


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """What a model is told about one tool: its name, description and JSON input schema."""

    name: str
    description: str
    input_schema: JsonObject

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


@dataclass(frozen=True, kw_only=True)
class OutputSpec:
    """The shape a turn's final answer must have (``Agent(output_type=...)``).

    ``schema`` is the JSON schema of the answer, always an object. A model that
    answers by calling a tool calls the one named ``name`` with the answer as its
    input; a model that answers in text replies with the answer's JSON alone.
    """

    name: str
    description: str
    schema: JsonObject

    def tool(self) -> ToolSpec:
        """The answer as a tool the model calls, for models without native support."""
        return ToolSpec(name=self.name, description=self.description, input_schema=self.schema)


@runtime_checkable
class Model(Protocol):
    """A language model the engine can drive.

    ``stream`` must yield zero or more deltas and then one ``ModelDone``. Raising
    fails the model step before anything is committed, so redelivering the turn
    asks the model again. Adapters translate their SDK's errors into ``ModelError``.

    A model that can ask its provider for structured output declares it by taking
    one more keyword, ``output: OutputSpec | None = None`` (see ``OutputModel``);
    the engine then passes the agent's ``OutputSpec`` there. A model without it
    is offered the answer as one more tool, ``output.tool()``.
    """

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[ModelDelta]: ...


@runtime_checkable
class OutputModel(Protocol):
    """A ``Model`` with native structured output: ``stream`` takes ``output``.

    With an ``OutputSpec`` the reply carries the answer either as a call to the
    tool ``output.name`` (tool-forced output) or as its text, the answer's JSON
    (a provider's JSON-schema response format). The engine validates either form.
    """

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[ModelDelta]: ...
