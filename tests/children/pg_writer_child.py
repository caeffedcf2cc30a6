"""Child process for the cross-process single-writer test (not collected by pytest).

Usage::

    python pg_writer_child.py DSN SCHEMA SIGNAL_DIR

Runs one turn on session ``s1`` whose remote tool creates ``SIGNAL_DIR/holding`` and
then waits for ``SIGNAL_DIR/release`` before returning, so the parent can try the
same session while this process is in the middle of the turn. Prints the turn's
text when done.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually

from turnkit import Agent, Runtime, UserMessage, tool
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def build_agent(signal_dir: Path) -> Agent:
    @tool
    async def hold() -> str:
        """Holds the turn open until the parent releases it."""
        (signal_dir / "holding").touch()
        await eventually((signal_dir / "release").exists, what="the release", timeout=120)
        return "released"

    def respond(messages: object) -> object:
        last = messages[-1]  # type: ignore[index]
        if isinstance(last, UserMessage):
            if last.text == "child":
                return ScriptedReply(text="holding", tool_calls=[tool_call("hold")])
            return f"parent saw {len(messages)} messages"  # type: ignore[arg-type]
        return "child done"

    return Agent(name="a", model=ScriptedModel(respond=respond), tools=[hold])


async def main(dsn: str, schema: str, signal_dir: Path) -> None:
    store = PostgresStore(dsn, schema=schema)
    async with Runtime(build_agent(signal_dir), store=store) as runtime:
        print(await runtime.session("a", "s1").turn("child"), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
