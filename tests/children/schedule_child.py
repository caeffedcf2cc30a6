"""Child process for the elected-scheduler test (not collected by pytest).

Usage::

    python schedule_child.py DSN SCHEMA

Runs ``schedule`` for one entry firing every second on session ``s`` of agent
``a``, on PostgreSQL, and prints ``delivered <turn id>`` each time its channel
renders a turn: only the elected process fires, so only it prints them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from turnkit import Agent, Runtime, ScheduledTurn, TurnEvent, mount_agent, schedule
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel


class PrintingChannel:
    source = "tick"

    def to_event(self, payload: Any) -> None:
        return None

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> None:
        seen = [event async for event in events]
        print("delivered", seen[-1].turn_id, seen[-1].type, flush=True)


async def main(dsn: str, schema: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(respond=lambda m: "tick"))
    entry = ScheduledTurn(name="tick", seed="tick", session="s", every=timedelta(seconds=1))
    async with Runtime(agent, store=PostgresStore(dsn, schema=schema)) as runtime:
        print("started", flush=True)
        await schedule(PrintingChannel(), mount_agent(agent, runtime), entry, catch_up=False)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
