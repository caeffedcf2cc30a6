"""The agent of the local deployment example: a scripted model (no key needed) that
looks an order up with a local tool, then streams its answer slowly, so a feed on
the HTTP node shows the text growing while a worker writes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from turnkit import (
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    UserMessage,
)

agent = {"name": "orders"}


class SlowScript:
    """Asks for ``lookup`` once, then answers word by word, a little apart."""

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        last = messages[-1]
        if isinstance(last, UserMessage):
            call = ToolCall(id="lookup-1", name="lookup", input={"order": last.text})
            yield ModelDone(reply=ModelReply(text="", tool_calls=[call]))
            return
        result = last.result if isinstance(last, ToolMessage) else None
        if isinstance(result, dict) and "state" in result:
            words = (
                f"Order {result['order']} is {result['state']}, handled by worker {result['pid']}."
            )
        else:  # the lookup failed: say what the tool said instead of guessing
            words = f"I could not look the order up: {result}"
        for word in words.split(" "):
            await asyncio.sleep(0.05)
            yield TextDelta(text=word + " ")
        yield ModelDone(reply=ModelReply(text=words))


model = SlowScript()
