"""A submitting node whose clock runs behind (not collected by pytest).

Usage::

    python skewed_node_child.py DSN SCHEMA SESSION TEXT OFFSET_SECONDS

Sets this process's ``time.time`` back by ``OFFSET_SECONDS`` (as a host with a
drifting clock would have it), submits one turn of agent ``e`` on ``SESSION``
through a ``RuntimeClient`` (an HTTP node's) and prints its id
once the store acknowledged it.
"""

from __future__ import annotations

import asyncio
import sys
import time

import turnkit
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel


async def main(dsn: str, schema: str, session: str, text: str) -> None:
    agent = turnkit.Agent(name="e", model=ScriptedModel([]), instructions=".")
    store = PostgresStore(dsn, schema=schema)
    async with turnkit.RuntimeClient([agent], store=store) as node:
        print(await node.session("e", session).submit(text), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    real = time.time
    offset = float(sys.argv[5])
    time.time = lambda: real() - offset  # this node's clock, behind the others'
    asyncio.run(main(*sys.argv[1:5]))
