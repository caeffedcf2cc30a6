"""Child process for the Anthropic restart test (not collected by pytest).

Usage::

    python -m fakes.thinking_child DB_PATH BASE_URL

Runs one thinking, tool-using turn against the fake server at ``BASE_URL`` over
``CrashingStore(SqliteStore(DB_PATH))``, which SIGKILLs the process right after
commit 3 (1 opens the turn, 2 is the model step, 3 the tool step): the process dies
with the thinking reply stored and the second model call not yet made.
"""

from __future__ import annotations

import asyncio
import sys

from turnkit import Agent, Runtime, tool
from turnkit.models import anthropic
from turnkit.stores import SqliteStore
from turnkit.testing import CrashingStore

AGENT = "scout"
SESSION = "s1"
TURN_ID = "turn-1"
CRASH_AT = 3


@tool
def forecast(city: str) -> dict[str, str]:
    """The weather for a city."""
    return {"city": city, "sky": "clear"}


def build_agent(base_url: str) -> Agent:
    model = anthropic("claude-test", thinking=True, api_key="test-key", base_url=base_url)
    return Agent(name=AGENT, model=model, instructions="Be brief.", tools=[forecast])


async def main(db: str, base_url: str) -> None:
    store = CrashingStore(SqliteStore(db), crash_at=CRASH_AT, when="after")
    async with Runtime([build_agent(base_url)], store=store) as runtime:
        session = runtime.session(AGENT, SESSION)
        await session.result(session.start("weather in Oslo?", turn_id=TURN_ID))
    print("the child was not killed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
