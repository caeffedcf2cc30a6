"""turnkit's HTTP app served by uvicorn in a process of its own (uvicorn documents no
way to stop a server it runs in-process), for tests that hold behaviour to both
servers. Prints the port, then serves until killed.
Usage: python uvicorn_app_child.py DB_PATH MAX_BODY_BYTES"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from starlette.requests import Request
from uvicorn_serving import serve_until_killed

import turnkit
from turnkit.server import Principal, ServerLimits, create_app
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


async def main(db: Path, max_body_bytes: int) -> None:
    agent = turnkit.Agent(name="shop", model=ScriptedModel(respond=lambda m: "ok"))
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        limits = ServerLimits(max_body_bytes=max_body_bytes)
        app = create_app(runtime, authenticate=by_header, limits=limits)
        await serve_until_killed(app)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
