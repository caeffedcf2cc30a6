"""The ``Model`` seam: what the engine asks of any language model, and what it streams back.

A model streams ``TextDelta`` and ``ReasoningDelta`` pieces as they arrive and ends
with exactly one ``ModelDone`` carrying the whole reply. Deltas are shown live and
never stored; only the ``ModelDone`` reply is checkpointed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from .._values.messages import JsonObject, Message, ModelReply


@dataclass(frozen=True, kw_only=True)
class TextDelta:
    """A piece of the reply's visible text."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, kw_only=True)
class ReasoningDelta:
    """A piece of the model's reasoning (thinking) text."""

    text: str
    type: Literal["reasoning"] = "reasoning"


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


@runtime_checkable
class Model(Protocol):
    """A language model the engine can drive.

    ``stream`` must yield zero or more deltas and then one ``ModelDone``. Raising
    fails the model step before anything is committed, so redelivering the turn
    asks the model again. Adapters translate their SDK's errors into ``ModelError``.
    """

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[ModelDelta]: ...
