"""The HTTP node of the local deployment: accepts turns and serves feeds, runs none.

    DATABASE_URL=postgresql://127.0.0.1:5432/test uvicorn http_node:app --port 8000

Its runtime has ``run_turns=False``: a turn posted here is stored (queued) and the
workers run it; ``GET …/events`` streams it from the store's log, its text live
through the PostgreSQL relay. Anyone who sends an ``X-User`` header is that user:
put your own ``authenticate`` here before this leaves your machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.requests import Request

import turnkit
from turnkit.server import Principal, create_app
from turnkit.stores import PostgresStore


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


agent = turnkit.load_agent(Path(__file__).with_name("agent"))
store = PostgresStore(os.environ["DATABASE_URL"], schema=os.environ.get("TURNKIT_SCHEMA", "public"))
runtime = turnkit.Runtime(agent, store=store, run_turns=False)
app = create_app(runtime, authenticate=by_header, own_runtime=True)
