"""Workers by version on one PostgreSQL: old and new workers each take only their
versions' turns, a held turn drains on the version it was recorded under, the
metric of turns no live worker serves, and an upgrade of turnkit itself from the
previous release's schema with an old node running turns through the migration."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_support import OFFLINE_ENV
from cli_support import turnkit as turnkit_cli
from eventually import eventually
from suite_paths import FIXTURES, ROOT
from worker_support import pg_node, pg_worker

import turnkit
from turnkit import ToolContext, UserMessage, tool
from turnkit.server._metrics import metrics_for
from turnkit.stores import PostgresStore
from turnkit.stores.postgres import _schema as pg_migrations
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

QUEUE_AGENT = FIXTURES / "queue_agent"
#: The last commit before issue 33's schema migration: the previous release's
#: turnkit, run as the old node of an upgrade.
PREVIOUS_RELEASE = "3ea947dada585eab0aae61cc643bda7ed2241241"


def versioned(version: str, *, ask: bool = False, keep_ask: bool = True) -> turnkit.Agent:
    """Agent ``a`` at ``version``: it answers saying which version answered; with
    ``ask``, a turn first calls ``ask`` (parks for approval), which ``keep_ask=False``
    versions no longer have."""

    @tool
    async def approve(ctx: ToolContext, what: str) -> str:
        """Ask a person to approve."""
        return str(await ctx.request_input("ok", f"Approve {what}?", schema={"type": "string"}))

    def reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and ask:
            return ScriptedReply(tool_calls=[tool_call("approve", {"what": last.text})])
        said = last.text if isinstance(last, UserMessage) else getattr(last, "result", "")
        return f"{version}: {said}"

    return turnkit.Agent(
        name="a",
        model=ScriptedModel(respond=reply, record_calls=False),
        tools=[approve] if keep_ask else [],
        version=version,
    )


async def statuses(rt: turnkit.Runtime, turns: dict[str, str]) -> dict[str, str]:
    found = {}
    for session, turn_id in turns.items():
        record = await rt.store.session(session).turn(turn_id)
        found[session] = record.status if record is not None else "missing"
    return found


async def test_old_and_new_workers_each_take_only_their_versions(
    pg_dsn: str, pg_schema: str
) -> None:
    v1, v2 = versioned("v1"), versioned("v2")
    async with pg_node(pg_dsn, pg_schema, v1) as old, pg_node(pg_dsn, pg_schema, v2) as new:
        turns: dict[str, str] = {}
        for n in range(6):  # interleaved, so the queue holds both at once
            turns[f"old-{n}"] = await old.session("a", f"old-{n}").submit(f"hi {n}")
            turns[f"new-{n}"] = await new.session("a", f"new-{n}").submit(f"hi {n}")
        async with (
            pg_worker(pg_dsn, pg_schema, v1, serve_versions=["v1"]) as w1,
            pg_worker(pg_dsn, pg_schema, v2, serve_versions=["v2"]) as w2,
        ):

            async def all_done() -> bool:
                return set((await statuses(new, turns)).values()) == {"completed"}

            await eventually(all_done, what="every turn to complete")
            assert (w1.claimed, w2.claimed) == (6, 6)
        for session, turn_id in turns.items():
            record = await new.store.session(session).turn(turn_id)
            assert record is not None
            mine = session.split("-")[0]
            version = {"old": "v1", "new": "v2"}[mine]
            assert record.version == version and record.text == f"{version}: hi {session[-1]}"
            events = await new.store.session(session).events(turn_id=turn_id)
            assert not [e for e in events if e.type == "turn.version_changed"]


async def test_turns_of_a_version_nobody_serves_are_counted_until_a_worker_takes_them(
    pg_dsn: str, pg_schema: str
) -> None:
    v1, v2 = versioned("v1"), versioned("v2")
    async with pg_node(pg_dsn, pg_schema, v1) as old:
        store = old.store
        assert isinstance(store, PostgresStore)
        metrics = metrics_for(old)
        async with pg_worker(pg_dsn, pg_schema, v2, serve_versions=["v2"]) as w2:
            await eventually(lambda: _registered(store), what="the v2 worker to register")
            turn_id = await old.session("a", "waits").submit("left over")
            assert await store.unserved_turns() == [("a", "v1", 1)]
            text = (await metrics.scrape()).decode()
            assert 'turnkit_turns_unserved{agent="a",version="v1"} 1.0' in text
            assert w2.claimed == 0
        # A new worker that also serves v1 takes it on, and runs it as v2.
        async with pg_worker(pg_dsn, pg_schema, v2, serve_versions=["v1", "v2"]):

            async def done() -> bool:
                record = await store.session("waits").turn(turn_id)
                return record is not None and record.status == "completed"

            await eventually(done, what="the v1 turn to run on the v1+v2 worker")
        record = await store.session("waits").turn(turn_id)
        assert record is not None and record.version == "v2" and record.text == "v2: left over"
        [changed] = [
            e
            for e in await store.session("waits").events(turn_id=turn_id)
            if e.type == "turn.version_changed"
        ]
        assert isinstance(changed, turnkit.TurnVersionChangedEvent)
        assert (changed.from_version, changed.to_version) == ("v1", "v2")
        assert await store.unserved_turns() == []
        assert (
            'turnkit_turns_unserved{agent="a",version="v1"}'
            not in (await metrics.scrape()).decode()
        )


async def _registered(store: PostgresStore) -> bool:
    rows = await store._select("workers", "SELECT holder FROM turnkit_workers", (), tuple)
    return bool(rows)


async def test_a_held_turn_drains_on_a_worker_of_its_own_version(
    pg_dsn: str, pg_schema: str
) -> None:
    v1 = versioned("v1", ask=True)
    v2 = versioned("v2", ask=True, keep_ask=False)  # the tool the turn called is gone
    async with pg_node(pg_dsn, pg_schema, v1) as old:
        session = old.session("a", "parked")
        turn_id = await session.submit("the refund")
        async with pg_worker(pg_dsn, pg_schema, v1, serve_versions=["v1"]):

            async def parked() -> bool:
                record = await session._store.turn(turn_id)
                return record is not None and record.status == "suspended"

            await eventually(parked, what="the turn to park under v1")
        # v1's workers are gone; the answer comes in and a v2 worker (serving every
        # version) meets the turn: it holds it.
        await session.resume(turn_id, "ok", "yes")
        async with pg_worker(pg_dsn, pg_schema, v2) as w2:

            async def held() -> bool:
                record = await session._store.turn(turn_id)
                return record is not None and record.held_by == "v2"

            await eventually(held, what="v2 to hold the turn")
            claims = w2.claimed
        record = await session._store.turn(turn_id)
        assert record is not None and record.status == "suspended"
        assert "'approve'" in (record.error or "") and record.version == "v1"
        # A v1 worker brought back to drain its turns sweeps for held ones and runs it.
        async with pg_worker(pg_dsn, pg_schema, v1, serve_versions=["v1"]):

            async def done() -> bool:
                record = await session._store.turn(turn_id)
                return record is not None and record.status == "completed"

            await eventually(done, what="the v1 worker to run the held turn")
        record = await session._store.turn(turn_id)
        assert record is not None and record.text == "v1: yes" and record.held_by is None
        assert claims == 1  # v2 tried it once, and not again after holding it


# -- upgrading turnkit itself ---------------------------------------------------------


def previous_release(into: Path) -> Path:
    """The previous release's ``src``, unpacked from git into ``into``; skipped when
    this checkout has no history to read it from (a shallow clone)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "src"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the previous release is not in this checkout's history: {exc}")
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into / "src"


def run_env(src: Path, hold: Path) -> dict[str, str]:
    return {
        **OFFLINE_ENV,
        "PYTHONPATH": str(src),
        "PYTHONUNBUFFERED": "1",
        "TURNKIT_TEST_HOLD_DIR": str(hold),
    }


SUBMIT = """
import asyncio, json, sys
import turnkit
from turnkit.stores import PostgresStore

async def main():
    agent = turnkit.load_agent(sys.argv[1])
    store = PostgresStore(sys.argv[2], schema=sys.argv[3], busy_timeout=30.0)
    # A node of the previous release has no RuntimeClient: it only stored turns
    # through a Runtime told not to run them.
    if hasattr(turnkit, "RuntimeClient"):
        node = turnkit.RuntimeClient([agent], store=store)
    else:
        node = turnkit.Runtime([agent], store=store, run_turns=False)
    async with node as rt:
        print("ready", flush=True)
        for line in sys.stdin:
            ids = {}
            for session in line.split():
                ids[session] = await rt.session(agent.name, session).submit(session)
            print(json.dumps(ids), flush=True)

asyncio.run(main())
"""


class Submitter:
    """An HTTP node of one release, in a process of its own that stays open (a node of
    the old release keeps running through the upgrade): it submits one turn per
    session it is given, the text being the session id."""

    def __init__(self, src: Path, hold: Path, dsn: str, schema: str, log: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUBMIT, str(QUEUE_AGENT), dsn, schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            env=run_env(src, hold),
        )
        self.log = log
        assert self.readline() == "ready\n", log.read_text()

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def submit(self, sessions: list[str]) -> dict[str, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(sessions) + "\n")
        self.proc.stdin.flush()
        line = self.readline()
        assert line, self.log.read_text()
        return dict(json.loads(line))


POLL = ("--poll", "0.3")


def start_worker(src: Path, hold: Path, dsn: str, schema: str, log: Path) -> Any:
    store = f"{dsn}?options=-csearch_path%3D{schema}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "worker", str(QUEUE_AGENT), "--store", store, *POLL],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env=run_env(src, hold),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("turnkit worker: running queued"), (line, log.read_text())
    return proc


def sql(dsn: str, schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


COMPLETED = "SELECT count(*) FROM turnkit_turns WHERE status = 'completed'"


@pytest.mark.slow
async def test_an_upgrade_from_the_previous_schema_loses_nothing_while_both_nodes_run(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    old_src = previous_release(tmp_path / "previous")
    new_src = ROOT / "src"
    hold = tmp_path / "hold"
    hold.mkdir()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(
            f'CREATE TABLE "{pg_schema}".scale_effects '
            "(session_id text, turn_id text, label text, pid integer)"
        )
    workers: list[Any] = []
    try:
        # The old release alone: its worker makes the schema (at its version) and runs
        # a turn that stays inside its tool step, across the upgrade.
        old_worker = start_worker(old_src, hold, pg_dsn, pg_schema, tmp_path / "old.log")
        workers.append(old_worker)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            before = pg_migrations.stored_version(conn, pg_schema)[0]
        assert before == 15
        old_node = Submitter(old_src, hold, pg_dsn, pg_schema, tmp_path / "old-node.log")
        workers.append(old_node.proc)
        turns = old_node.submit(["hold-1"])
        await eventually(
            lambda: list(hold.glob("started-*")),
            what=lambda: "the held turn's tool step: " + (tmp_path / "old.log").read_text(),
            timeout=60,
        )
        turns |= old_node.submit([f"a-{n}" for n in range(8)])
        # The new release opens the store: it migrates, online, with the old worker
        # mid-step and claiming.
        new_store = PostgresStore(pg_dsn, schema=pg_schema, busy_timeout=30.0)
        await new_store.open()
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                after = pg_migrations.stored_version(conn, pg_schema)
            assert after == (pg_migrations.SCHEMA_VERSION, pg_migrations.READABLE_FROM)
            workers.append(start_worker(new_src, hold, pg_dsn, pg_schema, tmp_path / "new.log"))
            new_node = Submitter(new_src, hold, pg_dsn, pg_schema, tmp_path / "new-node.log")
            workers.append(new_node.proc)
            turns |= new_node.submit([f"b-{n}" for n in range(8)])
            turns |= old_node.submit([f"c-{n}" for n in range(8)])
            (hold / "release").touch()

            def completed() -> int:
                query = "SELECT count(*) FROM turnkit_turns WHERE status = 'completed'"
                return int(sql(pg_dsn, pg_schema, query)[0][0])

            await eventually(
                lambda: completed() == len(turns),
                what=lambda: (
                    "every turn completed; logs: "
                    + (tmp_path / "old.log").read_text()
                    + (tmp_path / "new.log").read_text()
                ),
                timeout=120,
            )
        finally:
            await new_store.close()
        effects = sql(pg_dsn, pg_schema, "SELECT turn_id, pid FROM scale_effects")
        # Every turn ran its step exactly once, whichever release ran it.
        assert sorted(t for t, _ in effects) == sorted(turns.values())
        by_turn = dict(effects)
        assert by_turn[turns["hold-1"]] == old_worker.pid  # committed after the migration
        versions = dict(sql(pg_dsn, pg_schema, "SELECT turn_id, version FROM turnkit_turns"))
        fingerprint = turnkit.load_agent(QUEUE_AGENT).turn_version
        # The new release records its version on what it submits; the old one, none
        # (such turns run unchecked), unless a new worker opened them.
        assert {versions[turns[f"b-{n}"]] for n in range(8)} == {fingerprint}
        assert all(versions[turns[f"a-{n}"]] in (None, fingerprint) for n in range(8))
    finally:
        (hold / "release").touch()
        for proc in workers:
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- turnkit migrate -----------------------------------------------------------------


async def test_turnkit_migrate_checks_and_applies_on_sqlite(tmp_path: Path) -> None:
    from turnkit.stores import SqliteStore
    from turnkit.stores import _sqlite_schema as sqlite_migrations

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    previous = sqlite_migrations.MIGRATIONS[: _before_readable_from(sqlite_migrations.MIGRATIONS)]
    sqlite_migrations.migrate(conn, previous)  # as the previous release left it
    conn.execute(
        "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, created_at) "
        "VALUES ('s1', 't1', 'a', 'queued', '{\"role\": \"user\", \"text\": \"hi\", "
        '"turn_id": "t1"}\', 1.0)'
    )
    conn.close()
    check = turnkit_cli("migrate", "--check", "--store", str(db), cwd=tmp_path)
    assert check.returncode == 1, check.stderr
    first, last = len(previous) + 1, len(sqlite_migrations.MIGRATIONS)
    assert f"is at schema version {len(previous)}; this turnkit's is {last}" in check.stdout
    assert f"  {first}: ALTER TABLE turnkit_schema ADD COLUMN readable_from INTEGER" in check.stdout
    applied = turnkit_cli("migrate", "--apply", "--store", str(db), cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    numbers = ", ".join(str(n) for n in range(first, last + 1))
    assert f"applied migration(s) {numbers}; now at schema version {last}" in applied.stdout
    again = turnkit_cli("migrate", "--check", "--json", "--store", str(db), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    state = json.loads(again.stdout)
    assert (state["version"], state["pending"], state["usable"]) == (last, [], True)
    store = SqliteStore(db)
    await store.open()
    try:
        record = await store.session("s1").turn("t1")  # kept, with no version
        assert record is not None and record.status == "queued" and record.version is None
    finally:
        await store.close()


def _before_readable_from(migrations: list[tuple[str, ...]]) -> int:
    """How many migrations came before the one that records ``readable_from``: the
    previous release's schema, which these tests upgrade from."""
    return next(i for i, m in enumerate(migrations) if "readable_from" in m[0])


def test_turnkit_migrate_checks_and_applies_on_postgresql(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    previous = pg_migrations.MIGRATIONS[: _before_readable_from(pg_migrations.MIGRATIONS)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        pg_migrations.migrate(conn, pg_schema, previous)
    dsn = f"{pg_dsn}?options=-csearch_path%3D{pg_schema}"
    check = turnkit_cli("migrate", "--check", "--json", "--store", dsn, cwd=tmp_path)
    assert check.returncode == 1, check.stderr
    state = json.loads(check.stdout)
    assert state["version"] == len(previous) and state["readable_from"] is None
    pending = list(range(len(previous) + 1, len(pg_migrations.MIGRATIONS) + 1))
    assert [p["version"] for p in state["pending"]] == pending
    assert "CREATE TABLE turnkit_workers" in state["pending"][0]["statements"]
    applied = turnkit_cli("migrate", "--apply", "--store", dsn, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert pg_migrations.stored_version(conn, pg_schema) == (
            pg_migrations.SCHEMA_VERSION,
            pg_migrations.READABLE_FROM,
        )
        # A newer turnkit that says this one may not use its schema: refused (exit 2).
        conn.execute(f'UPDATE "{pg_schema}".turnkit_schema SET version = 99, readable_from = 98')
    newer = turnkit_cli("migrate", "--check", "--store", dsn, cwd=tmp_path)
    assert newer.returncode == 2 and "this turnkit may not use it" in newer.stdout


def test_serve_versions_must_name_versions(tmp_path: Path) -> None:
    bad = turnkit_cli(
        "worker",
        str(QUEUE_AGENT),
        "--store",
        "postgresql://x/y",
        "--serve-versions",
        "v1,,v2",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "expected agent versions separated by commas" in bad.stderr
    with pytest.raises(turnkit.ConfigurationError, match="serve_versions"):
        turnkit.Worker(
            turnkit.Runtime(versioned("v1"), store=PostgresStore("postgresql://x/y")),
            serve_versions="v1",
        )
