"""The offline demo model: what ``from_env()`` and the CLI fall back to with nothing set.

It needs no key and no network, answers from the transcript alone (so replays agree),
and says how to configure a real model.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._values.messages import Message, ToolMessage, TriggerMessage, UserMessage
from ._scripted import ScriptedModel

HINT = "Set ANTHROPIC_API_KEY or OPENAI_API_KEY (or TURNKIT_MODEL) to talk to a real model."


def demo_model() -> ScriptedModel:
    """A ``Model`` that repeats what it was told, marked as the offline demo."""
    return ScriptedModel(respond=_reply, record_calls=False)


def _reply(transcript: Sequence[Message]) -> str:
    last = transcript[-1] if transcript else None
    if isinstance(last, UserMessage | TriggerMessage):
        return f"(offline demo model) You said: {last.text}\n{HINT}"
    if isinstance(last, ToolMessage):
        return f"(offline demo model) {last.name} returned: {last.result}"
    return f"(offline demo model) {HINT}"
