"""An HTTP node for ``chaos.py``, in a process of its own, its clock set back.

Usage: ``python _chaos_node.py DSN SCHEMA OFFSET_SECONDS``. Serves ``create_app``
over a ``RuntimeClient`` (it stores turns for the workers) on a free
loopback port, prints the port, and serves until killed. ``time.time`` in this
process runs ``OFFSET_SECONDS`` behind, as on a host whose clock drifted.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))
from scale_out import submitting_agent

import turnkit
from turnkit.server import Principal, create_app
from turnkit.stores import PostgresStore


async def main(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema, max_size=4)
    runtime = turnkit.RuntimeClient(submitting_agent(), store=store)
    app = create_app(runtime, authenticate=lambda request: Principal(id="bench"), own_runtime=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    print(sock.getsockname()[1], flush=True)
    await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    real = time.time
    offset = float(sys.argv[3])
    time.time = lambda: real() - offset
    asyncio.run(main(sys.argv[1], sys.argv[2]))
