"""Child process for the scale-out reset tests (not collected).

Usage::

    python reset_child.py DSN SCHEMA SESSION

An HTTP node's ``RuntimeClient`` on the queue agent that resets
``SESSION``: it records the reset in the store, prints ``requested``, and waits
for the running turn to unwind, so the test can kill it in between.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually

import turnkit
from turnkit.stores import PostgresStore

AGENT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "queue_agent"


async def main(dsn: str, schema: str, session_id: str) -> None:
    agent = turnkit.load_agent(AGENT_DIR)
    store = PostgresStore(dsn, schema=schema)
    async with turnkit.RuntimeClient([agent], store=store) as runtime:
        reset = asyncio.ensure_future(runtime.session("queued", session_id).reset())
        raw = store.session(session_id)

        async def recorded() -> bool:
            return (await raw.load(from_index=2**31 - 1)).reset_requested

        await eventually(recorded, what="the reset recorded")
        print("requested", flush=True)
        done = await reset
        print("reset", done.archived_generation, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    asyncio.run(main(*sys.argv[1:]))
