"""The ops agent in Slack, next to its chat page: one process, one store.

    SLACK_SIGNING_SECRET=… SLACK_BOT_TOKEN=xoxb-… python examples/slack/app.py

Slack calls the public app on port 3000 (put a tunnel or your proxy in front of
it): its request URLs are ``https://<public host>/slack/events`` and
``https://<public host>/slack/interactivity`` (the manifest is in docs/slack.md).
The chat page is a second app on http://127.0.0.1:8000/, for this machine only,
as with ``turnkit dev``: it answers loopback names only, so a tunnel in front of
port 3000 never exposes it. Both drive the same runtime, so a conversation
started in Slack can be read on the page by the session id Slack's thread gets.
"""

from __future__ import annotations

import asyncio
import os
from importlib import resources

import uvicorn
from starlette.applications import Starlette

import turnkit
from turnkit.server import create_app, loopback_only
from turnkit.slack import slack_channel
from turnkit.stores import SqliteStore

LOOPBACK = ["localhost", "127.0.0.1", "::1"]


def build(
    store: str, *, signing_secret: str, bot_token: str, base_url: str = "https://slack.com/api/"
) -> tuple[turnkit.Runtime, Starlette, Starlette]:
    """The runtime, the public Slack app and the loopback chat page app."""
    agent = turnkit.load_agent(str(resources.files("turnkit") / "examples" / "ops"))
    runtime = turnkit.Runtime([agent], store=SqliteStore(store))
    slack = slack_channel(signing_secret=signing_secret, bot_token=bot_token, base_url=base_url)
    public = Starlette()
    public.mount("/slack", slack.app(turnkit.mount_agent(agent, runtime, channels=[slack])))
    page = create_app(runtime, authenticate=loopback_only, allowed_hosts=LOOPBACK, chat_page=True)
    return runtime, public, page


async def main() -> None:
    runtime, public, page = build(
        os.environ.get("TURNKIT_STORE", "slack.db"),
        signing_secret=os.environ["SLACK_SIGNING_SECRET"],
        bot_token=os.environ["SLACK_BOT_TOKEN"],
    )
    servers = [
        uvicorn.Server(uvicorn.Config(public, host="0.0.0.0", port=3000, lifespan="off")),
        uvicorn.Server(
            uvicorn.Config(
                page, host="127.0.0.1", port=8000, lifespan="off", timeout_graceful_shutdown=2
            )
        ),
    ]
    async with runtime:
        await runtime.recover()
        await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    asyncio.run(main())
