"""The HTTP node of the local deployment: accepts turns and serves feeds, runs none.

    DATABASE_URL=postgresql://127.0.0.1:5432/test uvicorn http_node:app --port 8000

It serves a ``turnkit.RuntimeClient``: a turn posted here is stored (queued) and the
workers run it; ``GET …/events`` streams it from the store's log, its text live
through the PostgreSQL relay. Anyone who sends an ``X-User`` header is that user:
put your own ``authenticate`` here before this leaves your machine.

When it starts it creates the tool's own table if it is missing (the app's
migration, in one process: workers only write to it). ``TURNKIT_SCHEMA`` names
the schema (default ``public``), ``TURNKIT_POOL_SIZE`` the node's connections to
PostgreSQL (default 10).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psycopg
from psycopg import errors, sql
from starlette.requests import Request

import turnkit
from turnkit.server import Principal, create_app
from turnkit.stores import PostgresStore


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


DSN = os.environ["DATABASE_URL"]
SCHEMA = os.environ.get("TURNKIT_SCHEMA", "public")
POOL_SIZE = int(os.environ.get("TURNKIT_POOL_SIZE", "10"))


def create_once(conn: psycopg.Connection, statement: sql.Composed) -> None:
    """Run a CREATE ... IF NOT EXISTS that another process (a worker migrating the
    same schema, another HTTP node) may be running at the same moment: PostgreSQL's
    IF NOT EXISTS is not atomic, and the loser's unique violation means it exists."""
    with contextlib.suppress(errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable):
        conn.execute(statement)


with psycopg.connect(DSN, autocommit=True) as conn:
    schema = sql.Identifier(SCHEMA)
    create_once(conn, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    create_once(
        conn,
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.order_lookups "
            "(session_id text, turn_id text, order_id text, pid integer)"
        ).format(schema),
    )

agent = turnkit.load_agent(Path(__file__).with_name("agent"))
store = PostgresStore(DSN, schema=SCHEMA, max_size=POOL_SIZE)
runtime = turnkit.RuntimeClient(agent, store=store)
app = create_app(runtime, authenticate=by_header, own_runtime=True)
