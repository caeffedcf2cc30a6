"""Finding the test PostgreSQL server and giving each test a schema of its own."""

from __future__ import annotations

import os
import uuid
from functools import cache

import pytest

from turnkit.stores import SqliteStore, Store

DSN_VARIABLE = "TURNKIT_TEST_POSTGRES_DSN"
REQUIRE_VARIABLE = "TURNKIT_REQUIRE_POSTGRES"
#: Every schema this run creates starts with this, so a crashed run's leftovers are
#: recognisable (and dropped by the next run's session cleanup).
SCHEMA_PREFIX = "turnkit_test_"
RUN_ID = uuid.uuid4().hex[:8]


@cache
def _server_problem(dsn: str) -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'turnkit[postgres]')"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"cannot connect to {dsn}: {str(exc).strip()}"
    return None


def postgres_dsn() -> str:
    """The DSN of the test server, or skip the test saying why (fail where required)."""
    dsn = os.environ.get(DSN_VARIABLE, "")
    problem = (
        f"{DSN_VARIABLE} is not set (e.g. postgresql://127.0.0.1:5432/test)"
        if not dsn
        else _server_problem(dsn)
    )
    if problem is None:
        return dsn
    message = f"PostgreSQL tests skipped: {problem}"
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{message}; {REQUIRE_VARIABLE}=1 requires them", pytrace=False)
    pytest.skip(message)


_counter = iter(range(1, 1_000_000))


def new_schema() -> str:
    return f"{SCHEMA_PREFIX}{RUN_ID}_{next(_counter)}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def store_at(spec: str) -> Store:
    """The store a spec names: ``DSN#schema`` for PostgreSQL, else a SQLite file
    (the form a test hands the processes it starts on one store)."""
    if spec.startswith("postgresql://"):
        from turnkit.stores import PostgresStore

        dsn, _, schema = spec.partition("#")
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)
