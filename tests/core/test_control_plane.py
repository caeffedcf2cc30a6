"""The control plane across processes: what one process decides about a session
holds in every other process on the same store (SQLite file or PostgreSQL)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from eventually import eventually, eventually_blocking
from postgres_support import store_at
from suite_paths import CHILDREN

import turnkit
from turnkit import Runtime, SessionBusyError, ToolMessage, UserMessage
from turnkit.stores import SqliteStore, transcript

CHILD = CHILDREN / "shared_session_child.py"


async def test_two_processes_complete_every_turn_of_one_session_in_order(
    shared_store_spec: str, tmp_path: Path
) -> None:
    # The schema exists before the children race to create it.
    store = store_at(shared_store_spec)
    await store.open()
    await store.close()
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), shared_store_spec, name, "15", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p", "q")
    ]
    for child in children:  # both are ready to run turns, then both start
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.communicate(timeout=60)
    go.touch()
    outputs = [child.communicate(timeout=120) for child in children]
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        lines = out.split("\n")[:-1]
        assert [line.split(" ")[1] for line in lines] == ["completed"] * 15, out

    store = store_at(shared_store_spec)
    await store.open()
    try:
        session = store.session("shared")
        messages = await transcript(session)
        unfinished = await session.unfinished()
        turns = [await session.turn(f"{n}-{i:02d}") for n in "pq" for i in range(15)]
    finally:
        await store.close()
    assert unfinished == []
    assert [t.status if t else None for t in turns] == ["completed"] * 30
    # Each turn's four messages sit together (opening, call, result, answer), and
    # each process's turns follow one another in the order it started them.
    by_turn = [m.turn_id for m in messages]
    assert len(by_turn) == 120
    assert all(len(set(by_turn[i : i + 4])) == 1 for i in range(0, 120, 4))
    for name in "pq":
        mine = [t for t in by_turn[::4] if t.startswith(name)]
        assert mine == [f"{name}-{i:02d}" for i in range(15)]
    assert not any(isinstance(m, ToolMessage) and m.is_error for m in messages)
    assert sum(isinstance(m, UserMessage) for m in messages) == 30


HOLDER = """
import asyncio, sys
from turnkit.stores import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    await store.open()
    async with store.session("shared").writer():
        print("holding", flush=True)
        await asyncio.Event().wait()  # until the test kills this process

asyncio.run(main())
"""


async def test_a_sqlite_session_held_by_another_process_waits_then_is_released_by_its_death(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        store = SqliteStore(db, writer_timeout=0.2)
        await store.open()
        try:
            with pytest.raises(SessionBusyError, match="another process on this host"):
                async with store.session("shared").writer():
                    pass
            async with store.session("other").writer():
                pass  # other sessions are not held
            holder.kill()  # SIGKILL: no cleanup runs in the holder
            holder.wait(timeout=30)
            async with store.session("shared").writer():
                pass
        finally:
            await store.close()
    finally:
        holder.kill()
        holder.wait(timeout=30)


HELD_CHILD = CHILDREN / "held_turn_child.py"


def start_held_turn(spec: str, signals: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, str(HELD_CHILD), spec, str(signals)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def holding() -> bool:
        assert child.poll() is None, child.communicate()
        return (signals / "holding").exists()

    eventually_blocking(holding, what="the child in its tool", timeout=60)
    return child


@pytest.mark.parametrize("how", ["cancel", "replace"])
async def test_a_cancel_or_replace_from_another_process_stops_the_running_turn(
    shared_store_spec: str, tmp_path: Path, how: str
) -> None:
    store = store_at(shared_store_spec)
    await store.open()
    await store.close()
    child = start_held_turn(shared_store_spec, tmp_path)
    try:
        from held_turn_child import build_agent

        async with Runtime(build_agent(tmp_path), store=store_at(shared_store_spec)) as runtime:
            session = runtime.session("a", "shared")
            if how == "cancel":
                assert await session.cancel() == ["held"]
                (tmp_path / "release").touch()
            else:
                new = session.start("again", replace=True)
                # The replace is recorded in the background: release once it is.

                async def replaced() -> bool:
                    record = await session.turn_record("held")
                    return record is not None and record.cancel_reason is not None

                await eventually(replaced, what="the replace recorded")
                (tmp_path / "release").touch()
                assert (await session.result(new)).text == "answered again"
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            reason = "requested" if how == "cancel" else "replaced"
            assert out == f"cancelled {reason}\n"
            record = await session.turn_record("held")
            assert record is not None and record.status == "cancelled"
            # The tool's step committed before the boundary; the model was never
            # asked again for the cancelled turn.
            held = [m for m in await session.messages() if m.turn_id == "held"]
            assert [m.role for m in held] == ["user", "assistant", "tool"]
    finally:
        child.kill()
        child.wait(timeout=30)


async def test_a_turn_acknowledged_then_killed_before_it_ran_completes_after_restart(
    shared_store_spec: str, tmp_path: Path
) -> None:
    store = store_at(shared_store_spec)
    await store.open()
    await store.close()
    child = subprocess.Popen(
        [sys.executable, str(HELD_CHILD), shared_store_spec, str(tmp_path), "then-submit"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "acknowledged\n", child.communicate(timeout=60)
    finally:
        child.kill()  # SIGKILL: "after" was acknowledged and never ran
        child.wait(timeout=30)
    (tmp_path / "release").touch()

    from held_turn_child import build_agent

    async with Runtime(build_agent(tmp_path), store=store_at(shared_store_spec)) as runtime:
        record = await runtime.session("a", "shared").turn_record("after")
        assert record is not None and record.status == "queued"
        results = {r.turn_id: r for r in await runtime.recover()}
        assert sorted(results) == ["after", "held"]
        assert results["after"].text == "answered after"
        assert results["held"].text == "held and answered"
        messages = await runtime.session("a", "shared").messages()
    # The turn submitted second opened after the first one ended.
    assert [(m.turn_id, m.role) for m in messages] == [
        ("held", "user"),
        ("held", "assistant"),
        ("held", "tool"),
        ("held", "assistant"),
        ("after", "user"),
        ("after", "assistant"),
    ]


PARK_CHILD = CHILDREN / "park_child.py"


async def test_a_park_made_in_another_process_is_refused_here_over_python_and_http(
    shared_store_spec: str,
) -> None:
    # park_child names a PostgreSQL store postgres:SCHEMA:DSN.
    spec = shared_store_spec
    if shared_store_spec.startswith("postgresql://"):
        dsn, _, schema = shared_store_spec.partition("#")
        spec = f"postgres:{schema}:{dsn}"
    parked = subprocess.run(
        [sys.executable, str(PARK_CHILD), spec, "park"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert parked.stdout == "suspended approve\n", parked.stderr

    from park_child import refund, respond
    from server_support import serving, snapshot

    from turnkit import Agent, SessionSuspendedError
    from turnkit.testing import ScriptedModel

    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[refund])
    async with Runtime(agent, store=store_at(shared_store_spec)) as runtime:
        session = runtime.session("a", "s1")  # this process never saw the park
        before = await snapshot(runtime)
        with pytest.raises(SessionSuspendedError, match="waiting for input on turn t-1"):
            await session.submit("refund o-2")
        with pytest.raises(SessionSuspendedError):
            await session.turn("refund o-2")
        # The session was opened from code (no owner): an admin's authorize opens it.
        async with serving(runtime, authorize=lambda principal, access: True) as served:
            for verb in ("turns", "chat"):
                answer = await served.client.post(
                    served.path("a", "s1", verb),
                    json={"text": "refund o-2"},
                    headers={"X-User": "u"},
                )
                assert answer.status_code == 409, answer.text
                assert answer.json()["code"] == "session_suspended"
        assert await snapshot(runtime) == before  # nothing stored


PARKED_SUBAGENT_CHILD = CHILDREN / "parked_subagent_child.py"


@pytest.mark.parametrize("how", ["cancel", "reset"])
async def test_cancelling_or_resetting_a_parent_ends_its_child_parked_elsewhere(
    shared_store_spec: str, how: str
) -> None:
    parked = subprocess.run(
        [sys.executable, str(PARKED_SUBAGENT_CHILD), shared_store_spec],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert parked.stdout == "suspended\n", parked.stderr

    from parked_subagent_child import agents

    async with Runtime(agents(), store=store_at(shared_store_spec)) as runtime:
        children = [s for s in await runtime.sessions() if s.agent == "researcher"]
        assert [s.status for s in children] == ["suspended"]
        parent = runtime.session("boss", "s1")
        if how == "cancel":
            assert await parent.cancel() == ["parent"]
        else:
            await parent.reset()
        child = runtime.session("researcher", children[0].session_id)
        record = (await child.events())[0]  # the child turn's id is its first event's
        ended = await child.result(record.turn_id)
        assert ended.status == "cancelled"
        assert await child.pending() is None
        assert await child.status() == "idle"
        ended = [e for e in await child.events() if e.type == "turn.cancelled"]
        assert len(ended) == 1
        assert ended[0].reason == ("requested" if how == "cancel" else "reset")  # type: ignore[attr-defined]
        # The child's parked call got the synthetic cancelled result.
        tool_results = [m for m in await child.messages() if m.role == "tool"]
        assert [m.result for m in tool_results] == [
            {"cancelled": True, "reason": ended[0].reason}  # type: ignore[attr-defined]
        ]


async def test_a_turn_stored_while_a_reset_waits_runs_in_the_new_generation(
    shared_store_spec: str, tmp_path: Path
) -> None:
    # The child runs "held"; this process resets the session, which waits for the
    # held turn to unwind; meanwhile the child stores "after" and runs it as soon as
    # "held" ends. Whichever process takes the session next, "after" must run in the
    # new generation: the reset's barrier is in the store, not in this process.
    store = store_at(shared_store_spec)
    await store.open()
    await store.close()
    child = subprocess.Popen(
        [sys.executable, str(HELD_CHILD), shared_store_spec, str(tmp_path), "submit-on-signal"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def holding() -> bool:
            assert child.poll() is None, child.communicate()
            return (tmp_path / "holding").exists()

        await eventually(holding, what="the child in its tool", timeout=60)
        from held_turn_child import build_agent

        async with Runtime(build_agent(tmp_path), store=store_at(shared_store_spec)) as runtime:
            session = runtime.session("a", "shared")
            reset = asyncio.ensure_future(session.reset())
            raw = runtime.store.session("shared")

            async def reset_recorded() -> bool:
                return (await raw.load(from_index=2**31 - 1)).reset_requested

            await eventually(reset_recorded, what="the reset recorded")
            (tmp_path / "submit").touch()
            await eventually(lambda: raw.turn("after"), what="the child's turn stored")
            (tmp_path / "release").touch()
            done = await reset
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            assert out == "held cancelled reset\nafter completed \n"
            assert done.archived_generation == 0
            assert done.generation == 1
            live = await session.messages()
            assert [(m.turn_id, m.role) for m in live] == [
                ("after", "user"),
                ("after", "assistant"),
            ]
            archived = await session.archived_messages(0)
            assert {m.turn_id for m in archived} == {"held"}
            assert not (await raw.load(from_index=0)).reset_requested
    finally:
        child.kill()
        child.wait(timeout=30)


async def test_a_turn_left_running_by_a_killed_process_is_finished_before_the_next(
    shared_store_spec: str, tmp_path: Path
) -> None:
    """Issue 28 item 9: the survivor's next turn opened before recover() ran, and
    the dead process's acknowledged turn ended failed ("interrupted: a later turn
    started before it was recovered"). The survivor holds the session's lock, so it
    finishes that turn first, then runs its own."""
    store = store_at(shared_store_spec)
    await store.open()
    await store.close()
    child = start_held_turn(shared_store_spec, tmp_path)
    child.kill()  # SIGKILL, inside the held turn's tool
    child.communicate(timeout=60)
    (tmp_path / "release").touch()  # the replayed tool returns at once
    from held_turn_child import build_agent

    async with Runtime(build_agent(tmp_path), store=store_at(shared_store_spec)) as runtime:
        session = runtime.session("a", "shared")
        assert await session.turn("next") == "answered next"
        held = await session.result("held")
        assert (held.status, held.text) == ("completed", "held and answered")
        openings = [
            m.turn_id for m in await session.messages() if isinstance(m, turnkit.UserMessage)
        ]
        assert openings[0] == "held" and len(openings) == 2
