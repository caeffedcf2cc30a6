"""Child process for the live-relay test (not collected by pytest).

Usage::

    python relay_child.py DSN SCHEMA DIR

Runs a first quick turn on session ``live`` of agent ``a`` (owned by ``alice``),
prints ``ready``, waits for ``DIR/go``, then runs a second turn whose model streams
slowly: a tool-call step saying ``Checking.``, then an answer whose pieces wait,
each, for a file the parent writes once its feed showed the piece before (so the
turn cannot end before the other process saw it live). The second piece is larger
than one notification. Prints the second turn's status.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually

from turnkit import (
    Agent,
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    Runtime,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    UserMessage,
    tool,
)
from turnkit.stores import PostgresStore

#: The answer's pieces; the second is larger than NOTIFY's 8000-byte payload.
PIECES = ["Hello, ", "é€😀 " * 1500 + "big ", "done."]
#: How long a piece waits for the parent's word before it goes on anyway.
PATIENCE = 30.0


@tool
async def look(what: str) -> str:
    """Looks something up."""
    return f"found {what}"


class SlowModel:
    """Streams its answer piece by piece, each after the parent saw the one before."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.text == "warm up":
            yield ModelDone(reply=ModelReply(text="warm"))
            return
        if isinstance(last, UserMessage):
            yield TextDelta(text="Checking.")
            call = ToolCall(id="c1", name="look", input={"what": "x"})
            yield ModelDone(reply=ModelReply(text="Checking.", tool_calls=[call]))
            return
        assert isinstance(last, ToolMessage)
        for i, piece in enumerate(PIECES):
            if i:
                await self._wait(self.folder / f"seen-{i - 1}")
            yield TextDelta(text=piece)
        yield ModelDone(reply=ModelReply(text="".join(PIECES)))

    async def _wait(self, path: Path) -> None:
        await eventually(path.exists, what=f"{path.name} from the test", timeout=PATIENCE)


async def main(dsn: str, schema: str, folder: Path) -> None:
    agent = Agent(name="a", model=SlowModel(folder), tools=[look])
    async with Runtime(agent, store=PostgresStore(dsn, schema=schema)) as runtime:
        session = runtime.session("a", "live")
        await session.result(session.start("warm up", owner="alice"))
        print("ready", flush=True)
        await eventually((folder / "go").exists, what="the go from the test")
        result = await session.result(session.start("look it up", owner="alice"))
        print(result.status, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
