"""Encryption at rest (``turnkit.crypto``): envelopes bound to their session and field,
rotation, crypto-shredding, and stores that keep no plaintext at rest.

The store tests run on every built-in store (``store_kind``); the at-rest checks read
the SQLite file's bytes and PostgreSQL's ``pg_dump`` of the schema.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from erasure_support import MARK, leave_marks, marked_agent

import turnkit
from turnkit import Codec, StoreError
from turnkit.crypto import EnvelopeCodec, KeyRing
from turnkit.stores import SqliteStore, Store, transcript

ACME, GLOBEX = "acme:s1", "globex:s1"


def tenant_of(session_id: str) -> str:
    return session_id.split(":", 1)[0]


def ring(**keys: bytes) -> KeyRing:
    """A key ring whose tenants are the session ids' prefixes, one key each:
    ``ring(acme=...)`` gives tenant ``acme`` the key ``acme-1``."""
    out = KeyRing(tenant_of)
    for tenant, key in keys.items():
        out.add(tenant, f"{tenant}-1", key)
    return out


@pytest.fixture
def tenant_keys() -> dict[str, bytes]:
    return {"acme": os.urandom(32), "globex": os.urandom(32)}


@pytest.fixture
def keys(tenant_keys: dict[str, bytes]) -> KeyRing:
    return ring(**tenant_keys)


@pytest.fixture
def store_codec(keys: KeyRing) -> Codec:
    """Every store ``make_store`` makes here seals its payloads."""
    return EnvelopeCodec(keys)


# -- the envelope ------------------------------------------------------------------------


def test_an_envelope_reads_back_and_never_repeats(keys: KeyRing) -> None:
    codec = EnvelopeCodec(keys)
    one = codec.encode(ACME, "message", b'{"text": "hello"}')
    two = codec.encode(ACME, "message", b'{"text": "hello"}')
    assert one != two and b"hello" not in one  # a fresh nonce each time
    assert codec.decode(ACME, "message", one) == b'{"text": "hello"}'
    assert codec.key_id(ACME, "message", one) == "acme-1"
    # Another process holding the same keys reads it: the data key is derived.
    assert EnvelopeCodec(keys).decode(ACME, "message", two) == b'{"text": "hello"}'


def test_an_envelope_is_bound_to_its_session_and_field(keys: KeyRing) -> None:
    codec = EnvelopeCodec(keys)
    sealed = codec.encode(ACME, "step", b"42")
    with pytest.raises(StoreError, match="session acme:s2: a stored step does not decrypt"):
        codec.decode("acme:s2", "step", sealed)
    with pytest.raises(StoreError, match=f"session {ACME}: a stored message does not decrypt"):
        codec.decode(ACME, "message", sealed)
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    with pytest.raises(StoreError, match="altered"):
        codec.decode(ACME, "step", bytes(flipped))
    with pytest.raises(StoreError, match="cut short"):
        codec.decode(ACME, "step", sealed[:20])
    with pytest.raises(StoreError, match="not an envelope"):
        codec.decode(ACME, "step", b"\x07" + sealed[1:])


def test_rotation_seals_new_writes_under_the_new_key_and_old_ones_still_read(
    keys: KeyRing,
) -> None:
    codec = EnvelopeCodec(keys)
    old = codec.encode(ACME, "event", b"{}")
    keys.add("acme", "acme-2", os.urandom(32))
    new = codec.encode(ACME, "event", b"{}")
    assert codec.key_id(ACME, "event", old) == "acme-1"
    assert codec.key_id(ACME, "event", new) == "acme-2"
    assert codec.decode(ACME, "event", old) == codec.decode(ACME, "event", new) == b"{}"
    moved = codec.reseal(ACME, "event", old)
    assert moved is not None and codec.reseal(ACME, "event", new) is None
    keys.forget("acme-1")
    assert codec.decode(ACME, "event", moved) == b"{}"
    with pytest.raises(StoreError, match="key 'acme-1', which the key provider no longer has"):
        codec.decode(ACME, "event", old)


def test_forgetting_a_tenants_keys_makes_its_data_unreadable(keys: KeyRing) -> None:
    codec = EnvelopeCodec(keys)
    acme = codec.encode(ACME, "opening", b'{"text": "x"}')
    globex = codec.encode(GLOBEX, "opening", b'{"text": "y"}')
    assert codec.decode(ACME, "opening", acme)  # its data key is cached now
    keys.forget_tenant("acme")
    with pytest.raises(StoreError, match=f"session {ACME}: .*key 'acme-1'.*cannot be read"):
        codec.decode(ACME, "opening", acme)
    with pytest.raises(StoreError, match="tenant 'acme' has no key to encrypt with"):
        codec.encode(ACME, "opening", b"{}")
    assert codec.decode(GLOBEX, "opening", globex) == b'{"text": "y"}'


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_never_repeats_its_parents_nonces() -> None:
    from turnkit.crypto import _nonces

    _nonces.take()  # the batch is made before the fork
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, _nonces.take())
        os._exit(0)
    os.close(write)
    theirs = os.read(read, 12)
    os.close(read)
    os.waitpid(child, 0)
    ours = [_nonces.take() for _ in range(600)]  # past the end of a batch
    assert len(theirs) == 12 and theirs not in ours and len(set(ours)) == 600


def test_threads_sealing_at_once_never_share_a_nonce(keys: KeyRing) -> None:
    """Every thread draws from one pool of nonces: across threads and past the end of
    several batches, no two envelopes carry the same nonce, and each one opens."""
    codec = EnvelopeCodec(keys)
    threads, each = 8, 700  # 5,600 nonces: ten batches of 512 and more
    start = threading.Barrier(threads)
    sealed: list[list[bytes]] = [[] for _ in range(threads)]

    def seal(mine: list[bytes]) -> None:
        start.wait(timeout=30)
        mine.extend(codec.encode(ACME, "step", b"%d" % n) for n in range(each))

    workers = [threading.Thread(target=seal, args=(mine,)) for mine in sealed]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert not worker.is_alive(), "a sealing thread never finished"
    header = 2 + len("acme-1")
    nonces = {envelope[header : header + 12] for mine in sealed for envelope in mine}
    assert len(nonces) == threads * each
    for mine in sealed:
        assert [codec.decode(ACME, "step", e) for e in mine] == [b"%d" % n for n in range(each)]


def test_a_sealer_frames_each_envelope_behind_its_prefix(keys: KeyRing) -> None:
    """``sealer`` (what a store asks for once per commit) makes what ``encode`` makes,
    behind the store's prefix in one bytearray: a fresh nonce each payload, and each
    bound to its session and field."""
    codec = EnvelopeCodec(keys)
    seal = codec.sealer(ACME, b"\x00")
    one, two = seal("step", b"42"), seal("step", b"42")
    assert isinstance(one, bytearray) and one[:1] == b"\x00" and one != two
    assert codec.decode(ACME, "step", bytes(one[1:])) == b"42"
    assert codec.key_id(ACME, "step", bytes(one[1:])) == "acme-1"
    with pytest.raises(StoreError, match="does not decrypt"):
        codec.decode(ACME, "event", bytes(one[1:]))
    keys.add("acme", "acme-2", os.urandom(32))
    assert codec.key_id(ACME, "step", bytes(codec.sealer(ACME, b"")("step", b"1"))) == "acme-2"


class CountingRing(KeyRing):
    """A key ring that counts how often a store asks which key is current."""

    def __init__(self) -> None:
        super().__init__(tenant_of)
        self.asked = 0

    def current(self, session_id: str) -> str:
        self.asked += 1
        return super().current(session_id)


async def test_a_store_asks_the_key_provider_once_per_commit_not_per_payload(
    tmp_path: Path,
) -> None:
    keys = CountingRing()
    keys.add("acme", "acme-1", os.urandom(32))
    store = SqliteStore(tmp_path / "t.db", codec=EnvelopeCodec(keys))
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        session = rt.session("a", ACME)
        await session.result(session.start(f"hello {MARK}"))
    with sqlite3.connect(tmp_path / "t.db") as conn:
        (payloads,) = conn.execute(
            "SELECT (SELECT count(*) FROM turnkit_messages) + (SELECT count(*) FROM "
            "turnkit_steps) + (SELECT count(*) FROM turnkit_events)"
        ).fetchone()
    # Each commit seals several payloads (a message, a step, its events) and asks once.
    assert 0 < keys.asked <= payloads // 2, (keys.asked, payloads)


class Reversed:
    """A third party's codec with the two verbs alone (no ``sealer``)."""

    def encode(self, session_id: str, kind: str, plaintext: bytes) -> bytes:
        return b"rev:" + plaintext[::-1]

    def decode(self, session_id: str, kind: str, stored: bytes) -> bytes:
        if not stored.startswith(b"rev:"):
            raise StoreError(f"session {session_id}: not reversed")
        return stored[4:][::-1]


async def test_a_codec_without_a_sealer_seals_every_payload_through_encode(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    await marked_history(SqliteStore(db, codec=Reversed()), ACME)
    store = SqliteStore(db, codec=Reversed())
    async with turnkit.Runtime(marked_agent(), store=store):
        texts = [getattr(m, "text", "") or "" for m in await transcript(store.session(ACME))]
    assert any(MARK in t for t in texts)
    with sqlite3.connect(db) as conn:
        bodies = [r[0] for r in conn.execute("SELECT body FROM turnkit_messages")]
    assert bodies and all(b[:5] == b"\x00rev:" for b in bodies)
    assert sqlite_files_hold(db, MARK) == []


def test_a_key_ring_refuses_what_is_not_a_key() -> None:
    keys = KeyRing()
    with pytest.raises(turnkit.ConfigurationError, match="16, 24 or 32 bytes"):
        keys.add("t", "k", b"short")
    with pytest.raises(turnkit.ConfigurationError, match="1 to 255 bytes"):
        keys.add("t", "", os.urandom(32))
    keys.add("t", "k", os.urandom(32))
    with pytest.raises(turnkit.ConfigurationError, match="already another tenant's"):
        keys.add("u", "k", os.urandom(32))
    with pytest.raises(turnkit.ConfigurationError, match="already names another key"):
        keys.add("t", "k", os.urandom(32))
    with pytest.raises(turnkit.ConfigurationError, match="needs a KeyProvider"):
        EnvelopeCodec(object())  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="needs encode and decode"):
        SqliteStore(":memory:", codec=object())  # type: ignore[arg-type]


# -- sealed stores -----------------------------------------------------------------------


async def marked_history(store: Store, session_id: str) -> None:
    """Two generations of ``MARK``ed history on ``session_id`` (see ``leave_marks``)."""
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        await leave_marks(rt.session("a", session_id))


async def test_a_sealed_store_reads_back_everything_it_keeps(
    make_store: Any, keys: KeyRing, store_kind: str
) -> None:
    await marked_history(make_store(), ACME)
    store = make_store()
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        session = rt.session("a", ACME)
        texts = [getattr(m, "text", "") or "" for m in await transcript(store.session(ACME))]
        assert any(MARK in t for t in texts)
        archived = await store.session(ACME).archived_messages(0)
        assert any(MARK in (getattr(m, "text", "") or "") for m in archived)
        pending = await session.pending()
        assert pending is not None and MARK in str(pending)
        events = await store.session(ACME).events()
        assert any(MARK in str(e.to_dict()) for e in events)
        (info,) = await store.session_page(limit=10)
        assert info.preview is not None and MARK in info.preview
        unfinished = await store.session(ACME).unfinished()
        assert unfinished and MARK in str(unfinished[-1].opening)
        done = await session.result(await session.resume(pending.turn_id, "ok", "fine"))
        assert done.status == "completed" and MARK in (done.text or "")
        record = await store.session(ACME).turn(done.turn_id)
        assert record is not None and record.text == done.text and MARK in str(record.opening)


async def test_forgetting_a_tenants_key_leaves_its_sessions_unreadable_on_every_store(
    make_store: Any, keys: KeyRing
) -> None:
    await marked_history(make_store(), ACME)
    await marked_history(make_store(), GLOBEX)
    keys.forget_tenant("acme")
    store = make_store()
    async with turnkit.Runtime(marked_agent(), store=store):
        with pytest.raises(StoreError, match=f"session {ACME}: .*key 'acme-1'"):
            await store.session(ACME).load()
        with pytest.raises(StoreError, match=f"session {ACME}: .*key 'acme-1'"):
            await store.session(ACME).events()
        with pytest.raises(StoreError, match=f"session {ACME}: .*key 'acme-1'"):
            await store.session(ACME).unfinished()
        texts = [getattr(m, "text", "") or "" for m in await transcript(store.session(GLOBEX))]
        assert any(MARK in t for t in texts)


async def test_after_rotation_a_store_reads_both_keys_and_writes_the_new_one(
    make_store: Any, keys: KeyRing
) -> None:
    store = make_store()
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        session = rt.session("a", ACME)
        first = await session.result(session.start(f"first {MARK}"))
        await session.result(await session.resume(first.turn_id, "ok", "yes"))
        keys.add("acme", "acme-2", os.urandom(32))
        second = await session.result(session.start(f"second {MARK}"))
        assert second.status == "suspended"
        assert len(await transcript(store.session(ACME))) > 4  # both keys read
        keys.forget("acme-1")
        # The new turn's rows were sealed under the new key alone.
        assert [e.type for e in await store.session(ACME).events(turn_id=second.turn_id)]
        with pytest.raises(StoreError, match="key 'acme-1'"):
            await store.session(ACME).events(turn_id=first.turn_id)


async def test_plain_rows_still_read_once_a_store_is_sealed_and_sealed_ones_need_the_codec(
    tmp_path: Path, keys: KeyRing
) -> None:
    db = tmp_path / "t.db"
    await marked_history(SqliteStore(db), ACME)
    sealed = SqliteStore(db, codec=EnvelopeCodec(keys))
    async with turnkit.Runtime(marked_agent(), store=sealed) as rt:
        session = rt.session("a", ACME)
        parked = (await session.pending()) or pytest.fail("the plain turn is parked")
        done = await session.result(await session.resume(parked.turn_id, "ok", f"yes {MARK}"))
        assert done.status == "completed"
        texts = [getattr(m, "text", "") or "" for m in await transcript(sealed.session(ACME))]
        assert sum(MARK in t for t in texts) >= 3  # the plain rows and the sealed ones
    # Its first message was stored in the clear, so the list shows its preview.
    await refused_without_the_codec(SqliteStore(db), preview=MARK)


async def refused_without_the_codec(plain: Store, preview: str | None = None) -> None:
    """A store opened without the codec lists the sealed session (its ids and status are
    clear), with no preview if its first message is sealed, and refuses to read it."""
    async with turnkit.Runtime(marked_agent(), store=plain):
        infos = {i.session_id: i for i in await plain.session_page(limit=10)}
        shown = infos[ACME].preview
        assert shown is None if preview is None else preview in (shown or "")
        with pytest.raises(StoreError, match="encrypted, and this store was opened without a"):
            await plain.session(ACME).load()
        with pytest.raises(StoreError, match="encrypted, and this store was opened without a"):
            await plain.session(ACME).events()


# -- nothing in the clear at rest --------------------------------------------------------


def sqlite_files_hold(db: Path, text: str) -> list[str]:
    """The files of the SQLite store (the database, its WAL, its lock file) whose
    bytes hold ``text``."""
    return [p.name for p in db.parent.iterdir() if text.encode() in p.read_bytes()]


async def test_a_sealed_sqlite_file_holds_no_plaintext(tmp_path: Path, keys: KeyRing) -> None:
    db = tmp_path / "t.db"
    for sid in (ACME, GLOBEX):
        await marked_history(SqliteStore(db, codec=EnvelopeCodec(keys)), sid)
    assert sqlite_files_hold(db, MARK) == []
    for fragment in ("Refund", "refunded", "order", "yes "):  # the question, the answers
        assert sqlite_files_hold(db, fragment) == [], fragment
    assert "t.db" in sqlite_files_hold(db, ACME)  # ids stay clear, for the queries
    await refused_without_the_codec(SqliteStore(db))
    # The same history without a codec is there in the clear (the test can see it).
    plain = tmp_path / "plain" / "t.db"
    plain.parent.mkdir()
    await marked_history(SqliteStore(plain), ACME)
    assert sqlite_files_hold(plain, MARK)


async def test_a_sealed_sqlite_row_is_a_blob_of_nul_and_an_envelope(
    tmp_path: Path, keys: KeyRing
) -> None:
    """The binary form on disk: each payload column a BLOB, NUL and then the envelope,
    which the codec opens to the payload's JSON (the form rows already kept have)."""
    db = tmp_path / "t.db"
    codec = EnvelopeCodec(keys)
    await marked_history(SqliteStore(db, codec=codec), ACME)
    columns = {
        "message": "SELECT body FROM turnkit_messages",
        "step": "SELECT result FROM turnkit_steps",
        "event": "SELECT body FROM turnkit_events",
        "opening": "SELECT opening FROM turnkit_turns",
        "text": "SELECT text FROM turnkit_turns WHERE text IS NOT NULL",
    }
    with sqlite3.connect(db) as conn:
        for kind, query in columns.items():
            rows = [r[0] for r in conn.execute(query)]
            assert rows and all(isinstance(r, bytes) and r[:1] == b"\x00" for r in rows), kind
            opened = [codec.decode(ACME, kind, r[1:]) for r in rows]
            if kind != "text":  # a turn's answer is text; every other payload JSON
                assert all(json.loads(o) is not None for o in opened), kind
            if kind in ("message", "event", "opening"):
                assert any(MARK.encode() in o for o in opened), kind


async def test_a_sealed_postgres_schema_dumps_no_plaintext(
    pg_dsn: str, pg_schema: str, keys: KeyRing
) -> None:
    from turnkit.stores import PostgresStore

    pg_dump = shutil.which("pg_dump") or pytest.skip("pg_dump is not installed")
    for sid in (ACME, GLOBEX):
        store = PostgresStore(pg_dsn, schema=pg_schema, codec=EnvelopeCodec(keys))
        await marked_history(store, sid)
    dump = subprocess.run(
        [pg_dump, "--dbname", pg_dsn, "--schema", pg_schema, "--data-only"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "turnkit_messages" in dump and ACME in dump  # the rows are there, ids clear
    assert MARK not in dump
    for fragment in ("Refund", "refunded", "order", "yes "):
        assert fragment not in dump, fragment
    await refused_without_the_codec(PostgresStore(pg_dsn, schema=pg_schema))


async def test_a_worker_claims_a_sealed_queued_turn_and_reads_its_opening(
    pg_dsn: str, pg_schema: str, keys: KeyRing
) -> None:
    from turnkit.stores import PostgresStore, TurnRecord

    store = PostgresStore(pg_dsn, schema=pg_schema, codec=EnvelopeCodec(keys))
    async with turnkit.RuntimeClient(marked_agent(), store=store) as rt:
        turn_id = await rt.session("a", ACME).submit(f"order {MARK}")
        (claimed,) = await store.claim(["a"], limit=5)
        assert isinstance(claimed, TurnRecord) and claimed.turn_id == turn_id
        assert claimed.status == "queued" and MARK in str(claimed.opening)
        store.unclaim(ACME)
