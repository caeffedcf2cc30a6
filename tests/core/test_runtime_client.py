"""``RuntimeClient``: a process that runs no turns submits, answers, cancels, resets
and follows turns that a worker in another process runs — on SQLite and PostgreSQL
(``shared_store_spec``), the worker being ``children/desk_worker_child.py``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from desk_worker_child import desk_agent
from postgres_support import store_at
from suite_paths import CHILDREN

import turnkit
from turnkit import TurnEvent, TurnOptions

CHILD = CHILDREN / "desk_worker_child.py"
#: How long any one exchange with the worker process may take.
DEADLINE = 60.0


class WorkerProcess:
    """The worker child: on SQLite, ``deliver()`` asks it to run what the store holds
    for a worker and waits until it has; on PostgreSQL its ``Worker`` claims each
    turn as it is stored, so ``deliver()`` has nothing to ask."""

    def __init__(self, proc: subprocess.Popen[str], claims: bool) -> None:
        self.proc = proc
        self.claims = claims
        self.lines: list[str] = []

    async def line(self) -> str:
        assert self.proc.stdout is not None
        read = asyncio.to_thread(self.proc.stdout.readline)
        got = (await asyncio.wait_for(read, DEADLINE)).rstrip("\n")
        assert got, f"the worker exited: {self.proc.wait(timeout=DEADLINE)}"
        self.lines.append(got)
        return got

    async def deliver(self) -> None:
        if self.claims:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write("sweep\n")
        self.proc.stdin.flush()
        while await self.line() != "swept":
            pass

    def ran(self) -> list[tuple[str, str]]:
        """Every turn the worker reported ending (or parking), with how."""
        out, err = self.proc.communicate(timeout=DEADLINE)  # closes its input: it stops
        assert self.proc.returncode == 0, err
        lines = self.lines + out.splitlines()
        return [(p[1], p[2]) for p in (line.split(" ") for line in lines) if p[0] == "ran"]


@asynccontextmanager
async def worker_process(spec: str) -> AsyncIterator[WorkerProcess]:
    store = store_at(spec)  # the schema exists before both processes open it
    await store.open()
    await store.close()
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker = WorkerProcess(proc, claims=spec.startswith("postgresql://"))
    try:
        assert await worker.line() == "ready"
        yield worker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE)


async def followed(stream: turnkit.TurnStream) -> list[TurnEvent]:
    return [event async for event in stream]


async def test_a_client_submits_answers_cancels_resets_and_follows_a_workers_turns(
    shared_store_spec: str,
) -> None:
    async with worker_process(shared_store_spec) as worker:
        store = store_at(shared_store_spec)
        async with turnkit.RuntimeClient(desk_agent(), store=store, poll=0.1) as client:
            session = client.session("desk", "front")
            assert isinstance(session, turnkit.SessionClient)
            assert not isinstance(session, turnkit.AgentSession)  # it can run nothing

            # Submit, and follow the turn's events as the worker logs them.
            hello = await session.submit("hello", TurnOptions(owner="ann", tenant="acme"))
            record = await session.turn_record(hello)
            assert record is not None and (record.status, record.tenant) == ("queued", "acme")
            following = asyncio.create_task(followed(session.observe(hello)))
            await worker.deliver()
            events = await asyncio.wait_for(following, DEADLINE)
            assert events[0].type == "turn.started"
            assert events[-1].type == "turn.completed"
            assert (await session.result(hello)).text == "echo: hello"

            # A turn that parks, answered here; the worker replays it.
            asked = await session.submit("ask once", owner="ann")
            await worker.deliver()
            parked = await session.result(asked)
            assert parked.status == "suspended" and parked.request is not None
            with pytest.raises(turnkit.SessionSuspendedError):
                await session.submit("not now", owner="ann")
            assert await session.resume(asked, "ok", "yes", by="ann") == asked
            await worker.deliver()
            assert (await session.result(asked)).text == "answered: yes"

            # A parked turn cancelled here is closed by the worker.
            again = await session.submit("ask twice", owner="ann")
            await worker.deliver()
            assert (await session.result(again)).status == "suspended"
            assert await session.cancel("changed my mind") == [again]
            await worker.deliver()
            cancelled = await session.result(again)
            assert (cancelled.status, cancelled.reason) == ("cancelled", "changed my mind")

            # A reset archives the generation here, once the worker has let it go.
            assert (await session.reset()).archived_generation == 0
            assert await session.messages() == [] and await session.generations() == [0]
            archived = {m.turn_id for m in await session.archived_messages(0)}
            assert archived == {hello, asked, again}
            fresh = await session.submit("after the reset", owner="ann")
            await worker.deliver()
            assert (await session.result(fresh)).text == "echo: after the reset"

        # Every delivery happened in the worker process, in the order asked.
        assert worker.ran() == [
            (hello, "turn.completed"),
            (asked, "input.requested"),
            (asked, "turn.completed"),
            (again, "input.requested"),
            (again, "turn.cancelled"),
            (fresh, "turn.completed"),
        ]


async def test_the_client_needs_the_agents_the_workers_run(tmp_path: Path) -> None:
    client = turnkit.RuntimeClient(desk_agent(), store=turnkit.stores.SqliteStore(tmp_path / "d"))
    with pytest.raises(turnkit.ConfigurationError, match="unknown agent 'ops'"):
        client.session("ops", "s1")
    with pytest.raises(turnkit.ConfigurationError, match="poll must be more than 0"):
        turnkit.RuntimeClient(desk_agent(), store=turnkit.stores.MemoryStore(), poll=0)
    with pytest.raises(turnkit.ConfigurationError, match="RuntimeClient is not open"):
        client.running_loop()
