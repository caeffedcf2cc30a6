"""Shared fixtures: every engine test runs on each store (memory, SQLite, PostgreSQL).

PostgreSQL tests use the server named by ``TURNKIT_TEST_POSTGRES_DSN``; each test gets
a schema of its own, dropped afterwards. Without the variable (or the server) they
are skipped with a message saying so, unless ``TURNKIT_REQUIRE_POSTGRES=1`` (set by
``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from postgres_support import drop_schema, new_schema, postgres_dsn

import turnkit
from turnkit import Codec
from turnkit.stores import (
    AppendMessage,
    MemoryStore,
    SqliteStore,
    Store,
    TurnRecord,
    transcript,
    turn_rules,
)
from turnkit.testing import RecordingSink

StoreFactory = Callable[[], Store]


def pytest_configure(config: pytest.Config) -> None:
    """A suite started with SIGINT ignored (a background job, ``nohup``, some CI
    runners) would hand the ignored signal to every child it starts, and the
    tests that stop a child with Ctrl-C would wait in vain: restore the default
    here, so children start with it too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pg_dsn() -> str:
    """The test server's DSN; skips (or, in CI, fails) when there is none."""
    return postgres_dsn()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh, empty schema for one test, dropped with everything in it afterwards."""
    schema = new_schema()
    yield schema
    drop_schema(pg_dsn, schema)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A durable store for several processes to share, as ``postgres_support.store_at``
    opens it: a SQLite file, or a fresh PostgreSQL schema (``DSN#schema``)."""
    if request.param == "sqlite":
        return str(tmp_path / "shared.db")
    dsn = request.getfixturevalue("pg_dsn")
    schema = request.getfixturevalue("pg_schema")
    return f"{dsn}#{schema}"


@pytest.fixture
def store_codec() -> Codec | None:
    """The codec the stores ``make_store`` makes seal their payloads with: none here;
    a module that tests encrypted stores overrides it."""
    return None


@pytest.fixture
def make_store(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, store_codec: Codec | None
) -> StoreFactory:
    """A factory so a test can reopen the same durable store as a "new process" would."""
    memory = MemoryStore(codec=store_codec)
    db = tmp_path / "turnkit.db"
    if store_kind == "postgres":
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")

    def factory() -> Store:
        if store_kind == "memory":
            return memory
        if store_kind == "sqlite":
            return SqliteStore(db, codec=store_codec)
        from turnkit.stores import PostgresStore

        return PostgresStore(dsn, schema=schema, busy_timeout=10.0, codec=store_codec)

    return factory


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
async def open_runtime(make_store: StoreFactory, sink: RecordingSink) -> AsyncIterator[Any]:
    """``rt = await open_runtime(agent)`` opens a runtime closed after the test."""
    opened: list[turnkit.Runtime] = []

    async def open_(*agents: turnkit.Agent, store: Store | None = None) -> turnkit.Runtime:
        runtime = turnkit.Runtime(list(agents), store=store or make_store(), sink=sink)
        await runtime.__aenter__()
        opened.append(runtime)
        return runtime

    yield open_
    for runtime in reversed(opened):
        await runtime.__aexit__(None, None, None)


async def plant_open_turn(
    db: Path,
    *,
    session_id: str = "s1",
    turn_id: str = "t1",
    agent: str = "a",
    text: str = "go",
    after: Sequence[turnkit.Message] = (),
) -> None:
    """Leave ``db`` as a process that died mid-turn would: the turn opened (and
    perhaps committed ``after``), with no terminal state."""
    store = SqliteStore(db)
    await store.open()
    opening = turnkit.UserMessage(text=text, turn_id=turn_id)
    existing = len(await transcript(store.session(session_id)))

    record = TurnRecord(
        session_id=session_id,
        turn_id=turn_id,
        agent=agent,
        status="running",
        opening=opening,
    )
    writes = [
        AppendMessage(existing, opening),
        turn_rules.new_turn(record),
        *(AppendMessage(offset, m) for offset, m in enumerate(after, start=existing + 1)),
    ]
    await store.session(session_id).commit(writes)
    await store.close()
