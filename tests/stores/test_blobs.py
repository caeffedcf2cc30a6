"""Large payloads (``blobs``): a tool result, message or event over the store's
threshold is kept once per turn outside its rows, read back on every path, refused
with a clear error when missing or damaged, sealed by the store's codec, and deleted
with its session (erasure, retention) or its archived generation."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from erasure_support import pg_rows_with, sqlite_rows_with

import turnkit
from turnkit import StoreError, ToolContext, ToolMessage, UserMessage, tool
from turnkit.crypto import EnvelopeCodec, KeyRing
from turnkit.stores import FileBlobStore, MemoryBlobStore, MemoryStore, SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

#: The tests' threshold: small, so a payload of a few kilobytes spills.
THRESHOLD = 4096
MARK = "zq-blob-marker-77"
DAY = 86400.0
#: How many blob deletions a SQLite file owes (row 0 only marks one that kept blobs).
OWED = "SELECT count(*) FROM turnkit_blob_deletions WHERE id > 0"
#: Where the SQL stores keep payloads that may spill.
PAYLOAD_COLUMNS = (
    ("turnkit_messages", "body"),
    ("turnkit_steps", "result"),
    ("turnkit_events", "body"),
    ("turnkit_turns", "opening"),
    ("turnkit_turns", "pending"),
)


def big(tag: str, size: int = 20_000) -> str:
    """A payload well over ``THRESHOLD`` that carries ``MARK`` and ``tag``."""
    head = f"{MARK} {tag} "
    return head + "y" * (size - len(head))


def blob_agent() -> turnkit.Agent:
    """``fetch <tag>``: a tool returns a large result, and the answer says how long
    the result the model saw was; ``ask <tag>`` fetches, then parks on a question."""

    @tool
    async def fetch(tag: str) -> dict[str, Any]:
        """A large document."""
        return {"tag": tag, "body": big(tag)}

    @tool
    async def ask(what: str, ctx: ToolContext) -> str:
        """Ask a person."""
        return str(await ctx.request_input("ok", what, schema={"type": "string"}))

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            tag = last.text.split(" ", 1)[1][:12]
            return ScriptedReply(tool_calls=[tool_call("fetch", {"tag": tag})])
        assert isinstance(last, ToolMessage)
        if last.name == "fetch":
            first = next(m for m in messages if isinstance(m, UserMessage))
            if first.text.startswith("ask") and not any(
                isinstance(m, ToolMessage) and m.name == "ask" for m in messages
            ):
                return ScriptedReply(tool_calls=[tool_call("ask", {"what": "go on?"})])
        fetched = [m.result for m in messages if isinstance(m, ToolMessage) and m.name == "fetch"]
        return f"saw {len(fetched[-1]['body'])} chars of {fetched[-1]['tag']}"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[fetch, ask])


class Kept:
    """Where one kind of store keeps its blobs, as the tests inspect them."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.db = tmp_path / "t.db"
        self.dir = tmp_path / "blobs"
        self.memory_blobs = MemoryBlobStore()
        self.codec: Any = None
        self._memory: MemoryStore | None = None
        if kind == "postgres":
            self.dsn = request.getfixturevalue("pg_dsn")
            self.schema = request.getfixturevalue("pg_schema")

    def store(self) -> Store:
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryStore(
                    codec=self.codec, blobs=self.memory_blobs, blob_threshold=THRESHOLD
                )
            return self._memory
        if self.kind == "sqlite":
            return SqliteStore(
                self.db, codec=self.codec, blobs=FileBlobStore(self.dir), blob_threshold=THRESHOLD
            )
        from turnkit.stores import PostgresStore

        return PostgresStore(
            self.dsn, schema=self.schema, codec=self.codec, blobs=True, blob_threshold=THRESHOLD
        )

    def _pg(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path = {self.schema}")
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def blobs(self, session_id: str | None = None) -> list[bytes]:
        """Every blob's stored bytes (of one session, or of all)."""
        if self.kind == "memory":
            held = self.memory_blobs._blobs
            sessions = [held.get(session_id, {})] if session_id else list(held.values())
            return [b for turns in sessions for names in turns.values() for b in names.values()]
        if self.kind == "sqlite":
            root = self.dir
            if session_id is not None:
                root = FileBlobStore(self.dir)._session_dir(session_id)
            return [p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()]
        where, params = ("WHERE session_id = %s", (session_id,)) if session_id else ("", ())
        return [r[0].encode() for r in self._pg(f"SELECT data FROM turnkit_blobs {where}", params)]

    def change_blobs(self, session_id: str, change: Callable[[bytes], bytes | None]) -> None:
        """Rewrite (or, when ``change`` returns ``None``, delete) each blob of a session."""
        if self.kind == "memory":
            for names in self.memory_blobs._blobs[session_id].values():
                for name, data in list(names.items()):
                    if (new := change(data)) is None:
                        del names[name]
                    else:
                        names[name] = new
        elif self.kind == "sqlite":
            for path in FileBlobStore(self.dir)._session_dir(session_id).rglob("*"):
                if path.is_file():
                    if (new := change(path.read_bytes())) is None:
                        path.unlink()
                    else:
                        path.write_bytes(new)
        else:
            for turn_id, name, data in self._pg(
                "SELECT turn_id, name, data FROM turnkit_blobs WHERE session_id = %s",
                (session_id,),
            ):
                key = (session_id, turn_id, name)
                if (new := change(data.encode())) is None:
                    self._pg(
                        "DELETE FROM turnkit_blobs WHERE session_id = %s AND turn_id = %s "
                        "AND name = %s",
                        key,
                    )
                else:
                    self._pg(
                        "UPDATE turnkit_blobs SET data = %s WHERE session_id = %s "
                        "AND turn_id = %s AND name = %s",
                        (new.decode(), *key),
                    )

    def longest_row(self) -> int:
        """The longest message, step, event or turn payload in the store's tables."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.db) as conn:
                return max(
                    conn.execute(f"SELECT coalesce(max(length({col})), 0) FROM {table}").fetchone()[
                        0
                    ]
                    for table, col in PAYLOAD_COLUMNS
                )
        assert self.kind == "postgres"
        return max(
            self._pg(f"SELECT coalesce(max(length({col})), 0) FROM {table}")[0][0]
            for table, col in PAYLOAD_COLUMNS
        )

    def rows_with(self, marker: str) -> list[tuple[str, str]]:
        if self.kind == "sqlite":
            return sqlite_rows_with(self.db, marker)
        assert self.kind == "postgres"
        return pg_rows_with(self.dsn, self.schema, marker)


@pytest.fixture
def kept(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Kept:
    return Kept(store_kind, tmp_path, request)


async def test_a_large_result_is_kept_once_outside_its_rows_and_reads_back(kept: Kept) -> None:
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store) as rt:
        session = rt.session("a", "s1")
        done = await session.result(session.start("fetch alpha"))
        assert done.status == "completed" and done.text == "saw 20000 chars of alpha"
        # One blob for the result's three copies (its step, message and event).
        assert len(kept.blobs("s1")) == 1
        snap = await store.session("s1").load(done.turn_id)
        (tool_message,) = [m for m in snap.messages if isinstance(m, ToolMessage)]
        assert tool_message.result == {"tag": "alpha", "body": big("alpha")}
        (step,) = [v for v in snap.steps.values() if isinstance(v, dict) and "result" in v]
        assert step["result"] == tool_message.result
        (completed,) = [
            e for e in await store.session("s1").events() if e.type == "action.completed"
        ]
        assert completed.to_dict()["result"] == tool_message.result
        small = rt.session("a", "s2")
        await small.result(small.start("fetch beta"))
        assert len(kept.blobs("s2")) == 1  # its own, though the bytes differ only by tag
        if kept.kind != "memory":
            assert kept.longest_row() < THRESHOLD  # only references in the rows


async def test_a_parked_turn_resumes_in_a_new_runtime_from_its_blobs(kept: Kept) -> None:
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        parked = await session.result(session.start("ask gamma"))
        assert parked.status == "suspended"
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:  # as a new process
        session = rt.session("a", "s1")
        done = await session.result(await session.resume(parked.turn_id, "ok", "yes"))
        assert done.status == "completed" and done.text == "saw 20000 chars of gamma"


async def test_small_payloads_stay_in_their_rows(kept: Kept) -> None:
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda _: "short"))
    async with turnkit.Runtime(agent, store=kept.store()) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("hello " * 100))
    assert kept.blobs() == []


async def test_a_missing_blob_is_a_clear_error(kept: Kept) -> None:
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch delta"))
    kept.change_blobs("s1", lambda _: None)
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store):
        missing = "session s1: a stored (message|step|event) of turn .* refers to blob [0-9a-f]{64}"
        with pytest.raises(StoreError, match=missing):
            await store.session("s1").load()
        with pytest.raises(StoreError, match=missing):
            await store.session("s1").events()


async def test_a_damaged_blob_is_refused(kept: Kept) -> None:
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch epsilon"))
    kept.change_blobs("s1", lambda data: data.replace(b"y", b"z", 1))
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store):
        with pytest.raises(StoreError, match=r"session s1: blob [0-9a-f]{64} .* is damaged"):
            await store.session("s1").load()


async def test_erasure_deletes_every_blob_of_the_session(kept: Kept) -> None:
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        for sid in ("s1", "kept"):
            session = rt.session("a", sid)
            await session.result(session.start("fetch zeta"))
            await session.reset()
            await session.result(session.start("fetch eta"))
        assert len(kept.blobs("s1")) == 2  # one per generation's turn
        await rt.session("a", "s1").erase(by="alice")
        assert kept.blobs("s1") == []
        if kept.kind == "sqlite":  # nothing left owed
            with sqlite3.connect(kept.db) as conn:
                owed = conn.execute(OWED).fetchone()
            assert owed == (0,)
        assert len(kept.blobs("kept")) == 2
        if kept.kind != "memory":
            left = [row for row in kept.rows_with(MARK) if "s1" in row[1]]
            assert left == []
        assert all(MARK.encode() not in b for b in kept.blobs("s1"))
        other = await kept_transcript(rt, "kept")
        assert sum(MARK in str(m) for m in other) == 2  # the other session reads on


async def kept_transcript(rt: turnkit.Runtime, session_id: str) -> list[Any]:
    snap = await rt.store.session(session_id).load()
    archived = await rt.store.session(session_id).archived_messages(0)
    return [m.to_dict() for m in [*archived, *snap.messages]]


async def test_retention_deletes_an_archived_generations_blobs_and_an_idle_sessions(
    kept: Kept,
) -> None:
    keep = turnkit.Retention(archives_for=timedelta(days=30), sessions_idle_for=timedelta(days=90))
    async with turnkit.Runtime(blob_agent(), store=kept.store(), retention=keep) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch theta"))
        await session.reset()
        await session.result(session.start("fetch iota"))
        idle = rt.session("a", "idle")
        await idle.result(idle.start("fetch kappa"))
        assert (len(kept.blobs("s1")), len(kept.blobs("idle"))) == (2, 1)
        report = await rt.prune(now=time.time() + 31 * DAY)
        assert report.generations == 1 and report.sessions == 0
        assert [b for b in kept.blobs("s1") if b"theta" in b] == []
        assert len(kept.blobs("s1")) == 1
        done = await session.result(session.start("fetch lambda"))  # the live one reads on
        assert done.text == "saw 20000 chars of lambda"
        report = await rt.prune(now=time.time() + 91 * DAY)
        assert report.sessions == 2
        assert kept.blobs() == []


async def test_a_sealed_store_seals_its_blobs(kept: Kept) -> None:
    keys = KeyRing(lambda sid: "acme")
    keys.add("acme", "acme-1", os.urandom(32))
    kept.codec = EnvelopeCodec(keys)
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store) as rt:
        session = rt.session("a", "s1")
        done = await session.result(session.start("fetch mu"))
        assert done.text == "saw 20000 chars of mu"
        (blob,) = kept.blobs("s1")
        assert MARK.encode() not in blob and b"yyyy" not in blob
        snap = await store.session("s1").load()
        assert any(isinstance(m, ToolMessage) and m.result["tag"] == "mu" for m in snap.messages)
    keys.forget("acme-1")
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store):
        with pytest.raises(StoreError, match="session s1"):
            await store.session("s1").load()


async def test_a_reference_copied_to_another_session_does_not_read_its_blob(
    tmp_path: Path,
) -> None:
    kept = Kept("sqlite", tmp_path, None)  # type: ignore[arg-type]
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        for sid in ("alice", "mallory"):
            session = rt.session("a", sid)
            await session.result(session.start("fetch nu" if sid == "alice" else "fetch xi"))
    with sqlite3.connect(kept.db) as conn:  # mallory's tool message now names alice's blob
        conn.execute(
            "UPDATE turnkit_messages SET body = (SELECT body FROM turnkit_messages "
            "WHERE session_id = 'alice' AND idx = 2) WHERE session_id = 'mallory' AND idx = 2"
        )
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store):
        with pytest.raises(StoreError, match=r"session mallory: .* refers to blob"):
            await store.session("mallory").load()


def test_a_file_blob_store_puts_once_and_refuses_a_bad_name(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "b", fsync=False)
    name = "a" * 64
    blobs.put("../s", "t/1", name, b"one")
    blobs.put("../s", "t/1", name, b"two")  # the name is the content: kept as it was
    assert blobs.get("../s", "t/1", name) == b"one"
    assert blobs.get("../s", "t/2", name) is None
    assert all(p.is_relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*"))
    with pytest.raises(StoreError, match="not a blob name"):
        blobs.get("s", "t", "../../etc/passwd")
    blobs.delete_turns("../s", ["t/1", "never"])
    assert blobs.get("../s", "t/1", name) is None
    blobs.delete_session("never seen")


def test_stores_refuse_a_bad_blob_setting(tmp_path: Path) -> None:
    with pytest.raises(turnkit.ConfigurationError, match="blob_threshold"):
        SqliteStore(tmp_path / "t.db", blobs=tmp_path / "b", blob_threshold=0)
    with pytest.raises(turnkit.ConfigurationError, match="blobs must be"):
        SqliteStore(tmp_path / "t.db", blobs=3)  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="blobs must be"):
        MemoryStore(blobs="dir")  # type: ignore[arg-type]


async def test_a_large_first_message_spills_and_its_session_still_lists(kept: Kept) -> None:
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: f"{len(m[0].text)}"))
    store = kept.store()
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        done = await session.result(session.start(big("nu")))
        assert done.text == "20000"
        # One blob: the message's text, which the turn's opening shares.
        assert len(kept.blobs("s1")) == 1
        if kept.kind != "memory":  # the memory store keeps a turn's record whole
            assert kept.longest_row() < THRESHOLD
        (info,) = await store.session_page(limit=10)
        assert info.session_id == "s1"
        # Listed from the reference's start of the text, without reading the blob.
        assert info.preview is not None and info.preview.startswith(f"{MARK} nu yyy")
        (first, _) = (await store.session("s1").load()).messages
        assert first.to_dict()["text"] == big("nu")


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])  # memory is never reopened
async def test_a_store_opened_without_blobs_says_so_or_reads_them_from_its_table(
    kept: Kept,
) -> None:
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch omicron"))
    plain: Store
    if kept.kind == "sqlite":
        plain = SqliteStore(kept.db)
    else:
        from turnkit.stores import PostgresStore

        plain = PostgresStore(kept.dsn, schema=kept.schema)  # the table is the schema's
    async with turnkit.Runtime(blob_agent(), store=plain):
        if kept.kind == "sqlite":
            with pytest.raises(StoreError, match="this store was opened without blobs"):
                await plain.session("s1").load()
        else:
            snap = await plain.session("s1").load()
            assert any(MARK in str(m.to_dict()) for m in snap.messages)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])  # memory is never reopened
async def test_a_parked_turn_with_a_large_opening_reads_it_back_in_a_new_process(
    kept: Kept,
) -> None:
    text = "ask " + big("pi")
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        parked = await session.result(session.start(text))
        assert parked.status == "suspended"
        assert kept.longest_row() < THRESHOLD  # the opening and the checkpoint spilled too
    store = kept.store()
    async with turnkit.Runtime(blob_agent(), store=store) as rt:
        (record,) = await store.session("s1").unfinished()
        assert record.opening.text == text
        session = rt.session("a", "s1")
        done = await session.result(await session.resume(parked.turn_id, "ok", "yes"))
        assert done.status == "completed" and done.text == f"saw 20000 chars of {MARK[:12]}"


async def test_the_command_line_reads_blobs_where_turnkit_blobs_says(tmp_path: Path) -> None:
    kept = Kept("sqlite", tmp_path, None)  # type: ignore[arg-type]
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch rho"))

    def export(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "turnkit.cli", "export", "s1", "--store", str(kept.db)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "TURNKIT_BLOBS"} | env,
        )

    found = export({"TURNKIT_BLOBS": str(kept.dir)})
    assert found.returncode == 0, found.stderr
    assert big("rho") in found.stdout
    refused = export({})
    assert refused.returncode != 0 and "opened without blobs" in refused.stderr


class _DeletesFail(FileBlobStore):
    """A blob directory that cannot delete (as a process killed right after the
    erasure's commit would leave it: rows gone, blobs still there)."""

    def delete_session(self, session_id: str) -> None:
        raise StoreError("the directory is read-only")

    def delete_turns(self, session_id: str, turn_ids: Any) -> None:
        raise StoreError("the directory is read-only")


async def test_blob_deletions_left_owed_are_carried_out_when_the_store_next_opens(
    tmp_path: Path,
) -> None:
    db, folder = tmp_path / "t.db", tmp_path / "blobs"
    failing = SqliteStore(db, blobs=_DeletesFail(folder), blob_threshold=THRESHOLD)
    async with turnkit.Runtime(blob_agent(), store=failing) as rt:
        session = rt.session("a", "s1")
        await session.result(session.start("fetch sigma"))
        with pytest.raises(StoreError, match="its rows are deleted, but not all its blobs yet"):
            await session.erase(by="alice")
        kept = Kept("sqlite", tmp_path, None)  # type: ignore[arg-type]
        assert [b for b in kept.blobs("s1") if b"sigma" in b]  # still there, and owed
        done = await session.result(session.start("fetch tau"))  # the session goes on
        assert done.text == "saw 20000 chars of tau"
    with sqlite3.connect(db) as conn:
        assert conn.execute(OWED).fetchone() == (1,)
    store = SqliteStore(db, blobs=FileBlobStore(folder), blob_threshold=THRESHOLD)
    async with turnkit.Runtime(blob_agent(), store=store):  # the next process to open it
        assert [b for b in kept.blobs("s1") if b"sigma" in b] == []
        snap = await store.session("s1").load()  # what came after the erasure stays
        assert any(isinstance(m, ToolMessage) and m.result["tag"] == "tau" for m in snap.messages)
    with sqlite3.connect(db) as conn:
        assert conn.execute(OWED).fetchone() == (0,)


def test_a_references_start_gives_the_preview_however_the_row_is_cut() -> None:
    from pydantic_core import to_json

    from turnkit.stores import _spill as spill

    text = 'a "quoted" \\ line\nand é' + "z" * 50_000
    spilled = [("text", "0" * 64, 50_000, "0" * 64)]
    ref = spill.reference("t1", spilled, {"text": None}, {"text": text})
    stored = to_json(ref).decode()  # the column's JSON text
    assert spill.head(ref) == text[: spill.HEAD_CHARS]
    heads = {spill.head_of_stored(stored[:n]) for n in range(140, 320)}
    assert heads == {text[: spill.HEAD_CHARS]}  # every cut past the head reads it
    assert spill.head_of_stored(stored[:40]) is None  # cut inside the head: none


async def test_a_store_opened_without_its_blobs_leaves_their_deletion_owed(
    tmp_path: Path,
) -> None:
    kept = Kept("sqlite", tmp_path, None)  # type: ignore[arg-type]
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:
        for sid in ("s1", "s2"):
            session = rt.session("a", sid)
            await session.result(session.start(f"fetch {sid}"))
    plain = SqliteStore(kept.db)  # as the command line without TURNKIT_BLOBS
    async with turnkit.Runtime(blob_agent(), store=plain) as rt:
        await rt.session("a", "s1").erase(by="ops")
    assert len(kept.blobs("s1")) == 1  # this store could not reach them
    async with turnkit.Runtime(blob_agent(), store=kept.store()) as rt:  # one that can
        assert kept.blobs("s1") == [] and len(kept.blobs("s2")) == 1
    with sqlite3.connect(kept.db) as conn:
        assert conn.execute(OWED).fetchone() == (0,)
