"""Child process for the multi-process tests of one session (not collected by pytest).

Usage::

    python shared_session_child.py STORE NAME TURNS GO_FILE

``STORE`` is a SQLite file path or ``postgresql://…#schema``. Runs ``TURNS`` turns,
one after another, on session ``shared`` of agent ``a``, each asking a tool that
sleeps a little (so the other process's turns fall in between), and prints one
line per turn: its id and how it ended. It opens the store, prints ``ready`` and
waits for ``GO_FILE`` to exist before the first turn, so both processes start
their turns together.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually

from turnkit import Agent, Runtime, UserMessage, tool
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


@tool
async def pause(label: str) -> str:
    """Sleeps a little, so two processes' turns interleave."""
    await asyncio.sleep(0.02)  # not a wait: the pause is the tool's work
    return f"paused for {label}"


def respond(messages: object) -> object:
    last = messages[-1]  # type: ignore[index]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("pause", {"label": last.text})])
    return f"done: {last.result}"  # type: ignore[union-attr]


def open_store(spec: str) -> Store:
    if spec.startswith("postgresql://"):
        from turnkit.stores import PostgresStore

        dsn, _, schema = spec.partition("#")
        return PostgresStore(dsn, schema=schema, busy_timeout=60.0)
    return SqliteStore(spec, writer_timeout=60.0)


async def main(spec: str, name: str, turns: int, go: Path) -> None:
    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[pause])
    async with Runtime(agent, store=open_store(spec)) as runtime:
        session = runtime.session("a", "shared")
        print("ready", flush=True)
        await eventually(go.exists, what="the go from the test")
        for i in range(turns):
            turn_id = f"{name}-{i:02d}"
            result = await session.result(session.start(f"{name} {i}", turn_id=turn_id))
            print(turn_id, result.status, result.error or "", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
