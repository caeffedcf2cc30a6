"""Shared fixtures: every engine test runs on each store that supports it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import turnkit
from turnkit.stores import MemoryStore, SqliteStore, Store, TurnRecord
from turnkit.testing import RecordingSink

StoreFactory = Callable[[], Store]


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path) -> StoreFactory:
    """A factory so a test can reopen the same durable store as a "new process" would."""
    memory = MemoryStore()
    db = tmp_path / "turnkit.db"

    def factory() -> Store:
        return memory if store_kind == "memory" else SqliteStore(db)

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
    existing = len(await store.session(session_id).messages())

    def write(tx: Any) -> None:
        tx.append_message(existing, opening)
        tx.open_turn(
            TurnRecord(
                session_id=session_id,
                turn_id=turn_id,
                agent=agent,
                status="running",
                opening=opening.to_dict(),
            )
        )
        for offset, message in enumerate(after, start=existing + 1):
            tx.append_message(offset, message)

    await store.session(session_id).commit(write)
    await store.close()
