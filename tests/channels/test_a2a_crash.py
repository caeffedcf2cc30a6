"""A2A across real processes: a serving node SIGKILLed mid-task, and a caller
SIGKILLed mid-call. Each node is ``tests/children/a2a_child.py`` on one store (a SQLite
file or PostgreSQL); the client is the official ``a2a-sdk`` one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from a2a.types import GetTaskRequest, SubscribeToTaskRequest, TaskState
from a2a_support import DEADLINE, a2a_client, message
from eventually import eventually
from postgres_support import store_at
from suite_paths import CHILDREN

CHILD = CHILDREN / "a2a_child.py"

pytestmark = pytest.mark.slow


class Node:
    """A child process running ``a2a_child.py``."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    async def line(self) -> str:
        assert self.process.stdout is not None
        try:
            raw = await asyncio.wait_for(self.process.stdout.readline(), DEADLINE * 3)
        except TimeoutError:
            raise AssertionError("the child said nothing in time") from None
        if not raw:
            assert self.process.stderr is not None
            raise AssertionError(f"the child ended: {(await self.process.stderr.read()).decode()}")
        return raw.decode().rstrip("\n")

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()  # SIGKILL: no cleanup, no goodbye
            await self.process.wait()


@asynccontextmanager
async def node(*args: str) -> AsyncIterator[Node]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    started = Node(process)
    try:
        yield started
    finally:
        await started.kill()


async def serving_url(started: Node) -> str:
    return str(json.loads(await started.line())["url"])


async def until_exists(path: Path) -> None:
    await eventually(path.exists, what=f"{path.name} written", timeout=DEADLINE * 3)


async def prepared(spec: str) -> None:
    """The store's schema made before children race to make it."""
    store = store_at(spec)
    await store.open()
    await store.close()


async def test_a_client_reconnects_to_a_running_task_after_its_node_was_killed(
    shared_store_spec: str, tmp_path: Path
) -> None:
    await prepared(shared_store_spec)
    async with node(shared_store_spec, str(tmp_path), "serve") as first:
        url = await serving_url(first)
        async with a2a_client(url, "ann", agent="helper") as (client, _):
            stream = client.send_message(message("pack", context_id="orders"))
            task_id = (await anext(stream)).task.id
            await until_exists(tmp_path / f"holding-{first.pid}")
            await first.kill()
            await stream.aclose()
    # Another node on the same store takes the task over and runs it on.
    async with node(shared_store_spec, str(tmp_path), "serve") as second:
        url = await serving_url(second)
        await until_exists(tmp_path / f"holding-{second.pid}")
        async with a2a_client(url, "ann", agent="helper") as (client, _):
            events = client.subscribe(SubscribeToTaskRequest(id=task_id))
            snapshot = (await anext(events)).task
            assert snapshot.id == task_id and snapshot.context_id == "orders"
            assert snapshot.status.state == TaskState.TASK_STATE_WORKING
            (tmp_path / "release").touch()
            rest = [e async for e in events]
            final = rest[-1].status_update.status
            assert final.state == TaskState.TASK_STATE_COMPLETED
            assert final.message.parts[0].text == "Helper says: pack done."
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
    store = store_at(shared_store_spec)
    await store.open()
    try:
        record = await store.session("orders").turn(task_id)
        assert record is not None and record.status == "completed"
        assert len(await store.unfinished_turns()) == 0
    finally:
        await store.close()


async def test_a_caller_killed_mid_call_follows_the_same_remote_task_which_runs_once(
    shared_store_spec: str, tmp_path: Path
) -> None:
    await prepared(shared_store_spec)
    caller_db = str(tmp_path / "caller.db")
    await prepared(caller_db)
    async with node(shared_store_spec, str(tmp_path), "serve") as remote:
        url = await serving_url(remote) + "/agents/helper/a2a"
        async with node(caller_db, str(tmp_path), "call", url) as caller:
            # The remote's tool runs, and the caller has kept the remote task's id.
            await until_exists(tmp_path / f"holding-{remote.pid}")
            held = await until_noted(caller_db)
            await caller.kill()
        async with node(caller_db, str(tmp_path), "call", url) as again:
            # The new caller recovers the turn and follows the same remote task.
            (tmp_path / "release").touch()
            line = await again.line()
            assert line.startswith("ask completed The helper answered: ")
            answered = json.loads(line.removeprefix("ask completed The helper answered: "))
            assert answered["task_id"] == held["task_id"]
            assert answered["text"] == "Helper says: ship it done."
    # The remote task ran once: one turn, one run of its tool. The new caller sent
    # no message: it read the task the killed one had kept, and followed it.
    assert (tmp_path / "ran").read_text().splitlines() == [f"{remote.pid} ship it"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.count("SendMessage") == 1 and calls[0] == "SendMessage", calls
    store = store_at(shared_store_spec)
    await store.open()
    try:
        [info] = await store.session_page(limit=10)
        snap = await store.session(info.session_id).load()
        assert [m.text for m in snap.messages if m.role == "user"] == ["ship it"]
        assert snap.turn is None or snap.turn.turn_id == held["task_id"]
    finally:
        await store.close()


async def until_noted(spec: str) -> dict[str, str]:
    """The remote task the caller's turn ``ask`` keeps with its call, once it does."""
    store = store_at(spec)
    await store.open()
    try:

        async def noted() -> list[Any]:
            steps = (await store.session("s").load(turn_id="ask")).steps
            return [v for k, v in steps.items() if k.startswith("note:")]

        found = await eventually(
            noted, what="the caller keeping the remote task", timeout=DEADLINE * 3
        )
        return dict(found[0])
    finally:
        await store.close()
