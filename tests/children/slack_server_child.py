"""A Slack app served by uvicorn in a process of its own, so a test can read the
server's peak memory (VmHWM) around what it sends. Prints the port, then serves
until killed. Usage: python slack_server_child.py DB_PATH"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from starlette.applications import Starlette
from uvicorn_serving import serve_until_killed

import turnkit
from turnkit.slack import slack_channel
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel


async def main(db: Path) -> None:
    agent = turnkit.Agent(name="ops", model=ScriptedModel(["ok"]), instructions=".")
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        slack = slack_channel(
            signing_secret="test-signing-secret",
            bot_token="xoxb-test",
            base_url="http://127.0.0.1:9/api/",  # never called: nothing here is signed
        )
        app = Starlette()
        app.mount("/slack", slack.app(turnkit.mount_agent(agent, runtime, channels=[slack])))
        await serve_until_killed(app)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
