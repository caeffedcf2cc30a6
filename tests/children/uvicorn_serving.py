"""What the uvicorn children share: serve an app on a free local port, printing the
port first so the parent knows where to connect (uvicorn documents no way to stop a
server it runs in-process, so the child is killed instead)."""

from __future__ import annotations

import socket

import uvicorn
from starlette.types import ASGIApp


async def serve_until_killed(app: ASGIApp) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    await uvicorn.Server(config).serve(sockets=[sock])
