"""A Slack app served by uvicorn in a process of its own, so a test can read the
server's peak memory (VmHWM) around what it sends. Prints the port, then serves
until killed. Usage: python slack_server_child.py DB_PATH"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

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
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
