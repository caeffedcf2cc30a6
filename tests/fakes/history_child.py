"""Child process for the history-summary crash test (not collected by pytest).

Usage::

    python -m fakes.history_child DB_PATH BASE_URL TURNS [CRASH_AT WHEN]

Runs turns ``t1`` … ``tTURNS`` of session ``s1`` (each a redelivery if the store has
it already) with a ``SummarizeOlder`` policy against the fake Anthropic server at
``BASE_URL``. With ``CRASH_AT``, the store is a ``CrashingStore`` that SIGKILLs the
process just before or after (``WHEN``) that commit. Prints the usage it read back.
"""

from __future__ import annotations

import asyncio
import json
import sys

from turnkit import Agent, Runtime, SummarizeOlder
from turnkit.models import anthropic
from turnkit.stores import SqliteStore
from turnkit.testing import CrashingStore

AGENT = "keeper"
SESSION = "s1"
POLICY = SummarizeOlder(max_tokens=120, keep_tokens=60)


def text_of(turn: int) -> str:
    return f"Note {turn}: the meeting moved to room {turn * 7} at {turn % 12 + 1} o'clock."


def build_agent(base_url: str) -> Agent:
    model = anthropic("claude-test", api_key="test-key", base_url=base_url, max_retries=0)
    return Agent(name=AGENT, model=model, instructions="Keep notes.", history=POLICY)


async def main(db: str, base_url: str, turns: int, crash_at: int, when: str) -> None:
    inner = SqliteStore(db)
    store = CrashingStore(inner, crash_at=crash_at, when=when) if crash_at else inner
    async with Runtime([build_agent(base_url)], store=store) as runtime:
        session = runtime.session(AGENT, SESSION)
        for n in range(1, turns + 1):
            result = await session.result(session.start(text_of(n), turn_id=f"t{n}"))
            if result.status != "completed":
                raise SystemExit(f"turn t{n} ended {result.status}: {result.error}")
        print(json.dumps((await session.usage()).to_dict()))


if __name__ == "__main__":
    crash = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    asyncio.run(
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), crash, sys.argv[5] if crash else "")
    )
