"""Crash safety for real: SIGKILL a process at every commit boundary, recover in a new one.

``crash_child.py`` runs one turn (a batch of three local ``create_order`` calls, one
remote call, a final answer built from the tool results) over
``CrashingStore(SqliteStore(db))``, and again over ``PostgresStore``. A reference
run without a crash gives the number of commits ``N`` and the expected answers.
Then, for every commit ``k`` in ``1..N``, killed just before and just after it, a
fresh child on a fresh database is killed and a second fresh process recovers the
turn, once by redelivering it and once with ``runtime.recover()``, and runs a
second turn. The database is then read directly (``sqlite3`` or psycopg) and must
hold exactly what one uninterrupted run would have written.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crash_child import (
    ITEMS,
    SECOND_ITEM,
    SECOND_TEXT,
    SECOND_TURN_ID,
    SESSION,
    TURN_ID,
    TURN_TEXT,
    remote_log_path,
)
from postgres_support import drop_schema, new_schema, postgres_dsn
from suite_paths import CHILDREN

from turnkit import Usage

pytestmark = pytest.mark.slow

CHILD = CHILDREN / "crash_child.py"
#: Only there so a wedged child cannot hang the suite; never a performance bound.
CHILD_TIMEOUT = 120.0
WHENS = ("before", "after")
RECOVERY_MODES = ("redeliver", "recover")
#: One commit opens the turn, then one per model step (3) and one per tool call (4).
EXPECTED_COMMITS = 1 + 3 + 4


@dataclass
class Backend:
    """Where a crash run keeps its data: a SQLite file, or a PostgreSQL schema."""

    kind: str
    dsn: str = ""
    schemas: list[str] = field(default_factory=list)

    def spec(self, tmp: Path, name: str) -> str:
        if self.kind == "sqlite":
            return str(tmp / f"{name}.db")
        schema = new_schema()
        self.schemas.append(schema)
        return f"postgres:{schema}:{tmp}"

    def query(self, spec: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One read of the run's tables, straight from the database."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(spec)
            try:
                return conn.execute(sql, tuple(params)).fetchall()
            finally:
                conn.close()
        import psycopg

        from turnkit.stores.postgres import qmark_to_pyformat

        schema = spec.split(":", 2)[1]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            return conn.execute(qmark_to_pyformat(sql), tuple(params)).fetchall()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = Backend(kind=request.param)
    if b.kind == "postgres":
        b.dsn = postgres_dsn()
    yield b
    for schema in b.schemas:
        drop_schema(b.dsn, schema)


@dataclass(frozen=True)
class Reference:
    backend: Backend
    commits: int
    turn1: dict[str, Any]
    turn2: dict[str, Any]
    #: The number of the commit that records the remote tool's result.
    remote_commit: int


def remote_runs(db: str) -> list[tuple[str, int]]:
    """What ``check_orders`` logged: (idempotency key, commits before it) per run."""
    log = Path(remote_log_path(db))
    if not log.exists():
        return []
    return [(key, int(n)) for key, n in (line.split() for line in log.read_text().splitlines())]


def run_child(db: str, crash_at: int, when: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), db, str(crash_at), when, mode],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def child_output(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"child printed nothing\nstderr:\n{proc.stderr}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


@pytest.fixture(scope="module")
def reference(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    db = backend.spec(tmp_path_factory.mktemp("reference"), "turnkit")
    out = child_output(run_child(db, 0, "before", "run"))
    runs = remote_runs(db)
    assert len(runs) == 1, runs
    ref = Reference(
        backend=backend,
        commits=out["commits"],
        turn1=out["turn1"],
        turn2=out["turn2"],
        remote_commit=runs[0][1] + 1,
    )
    # The checker must accept an uninterrupted run, or it proves nothing below.
    check_database(db, ref)
    return ref


# -- reading the database directly --------------------------------------------------


def read_messages(db: str, ref: Reference) -> list[dict[str, Any]]:
    rows = ref.backend.query(
        db, "SELECT idx, body FROM turnkit_messages WHERE session_id = ? ORDER BY idx", (SESSION,)
    )
    assert [r[0] for r in rows] == list(range(len(rows))), "transcript indexes have gaps"
    return [json.loads(r[1]) for r in rows]


def check_transcript_valid(messages: list[dict[str, Any]]) -> None:
    """What the next model call needs: each assistant's calls answered, in order, at once.

    Every turn is an opening, then assistant messages; an assistant with tool calls
    is followed by exactly one tool message per call in the order asked, and
    nothing else comes before the next assistant message.
    """
    i = 0
    while i < len(messages):
        opening = messages[i]
        assert opening["role"] == "user", f"message {i} should open a turn: {opening}"
        turn = opening["turn_id"]
        i += 1
        while True:
            assert i < len(messages), f"turn {turn} ends without a final assistant message"
            assistant = messages[i]
            assert assistant["role"] == "assistant", f"message {i} should be assistant: {assistant}"
            assert assistant["turn_id"] == turn, f"message {i} belongs to another turn"
            i += 1
            calls = assistant["tool_calls"]
            if not calls:
                break
            for call in calls:
                assert i < len(messages), f"call {call['id']} of turn {turn} has no result"
                result = messages[i]
                assert result["role"] == "tool", f"message {i} should answer {call}: {result}"
                assert (result["call_id"], result["name"], result["turn_id"]) == (
                    call["id"],
                    call["name"],
                    turn,
                ), f"message {i} answers the wrong call: {result} for {call}"
                i += 1


def check_database(db: str, ref: Reference) -> None:
    query = ref.backend.query
    messages = read_messages(db, ref)
    check_transcript_valid(messages)

    first = [m for m in messages if m["turn_id"] == TURN_ID]
    second = [m for m in messages if m["turn_id"] == SECOND_TURN_ID]
    assert messages == first + second, "the transcript holds something besides the two turns"
    roles = Counter(m["role"] for m in first)
    assert roles == {"user": 1, "assistant": 3, "tool": 4}, roles
    assert first[0] == {"role": "user", "turn_id": TURN_ID, "text": TURN_TEXT}
    assert [m["role"] for m in second] == ["user", "assistant", "tool", "assistant"]
    assert second[0]["text"] == SECOND_TEXT
    assert not any(m.get("is_error") for m in messages), "a tool result is an error"

    orders = query(db, "SELECT id, item, turn_id, call_id FROM orders ORDER BY id")
    by_turn = {t: [o for o in orders if o[2] == t] for t in (TURN_ID, SECOND_TURN_ID)}
    assert sorted(o[1] for o in by_turn[TURN_ID]) == sorted(ITEMS), orders
    assert [o[1] for o in by_turn[SECOND_TURN_ID]] == [SECOND_ITEM], orders
    assert len(orders) == len(ITEMS) + 1, orders
    assert len({(o[2], o[3]) for o in orders}) == len(orders), f"duplicate call: {orders}"
    # Each create_order result names the row its own transaction wrote.
    written = {
        (m["turn_id"], m["call_id"]): (m["result"]["order_id"], m["result"]["item"])
        for m in messages
        if m["role"] == "tool" and m["name"] == "create_order"
    }
    assert written == {(o[2], o[3]): (o[0], o[1]) for o in orders}

    turns = {
        row[0]: tuple(row[1:])
        for row in query(
            db, "SELECT turn_id, status, text FROM turnkit_turns WHERE session_id = ?", (SESSION,)
        )
    }
    assert turns == {
        TURN_ID: ("completed", ref.turn1["text"]),
        SECOND_TURN_ID: ("completed", ref.turn2["text"]),
    }

    events = Counter(
        json.loads(body)["type"]
        for (body,) in query(
            db,
            "SELECT body FROM turnkit_events WHERE session_id = ? AND turn_id = ?",
            (SESSION, TURN_ID),
        )
    )
    # Events commit with their step, so a replay never logs one twice.
    assert events["turn.started"] == 1, events
    assert events["message.completed"] == 3, events
    assert events["action.completed"] == 4, events
    assert events["turn.completed"] == 1, events
    assert events["turn.failed"] == 0, events


# -- the tests -------------------------------------------------------------------------


def test_reference_run(reference: Reference) -> None:
    assert reference.commits == EXPECTED_COMMITS
    # The remote call is the last tool step: only the final model step comes after it.
    assert reference.remote_commit == EXPECTED_COMMITS - 1
    assert reference.turn1["status"] == "completed"
    assert reference.turn1["text"] == "Ordered: #1 a (packed), #2 b (shipped), #3 c (packed)."
    assert reference.turn2 == {
        "turn_id": SECOND_TURN_ID,
        "status": "completed",
        "text": "Also ordered #4 d.",
        "error": None,
        "request": None,
        "reason": None,
        "usage": Usage().to_dict(),  # the scripted model reports none
        "output": None,
        "requests": [],
    }


def crash_and_recover(tmp: Path, ref: Reference, k: int, when: str, mode: str) -> None:
    db = ref.backend.spec(tmp, f"crash-{k}-{when}-{mode}")
    crashed = run_child(db, k, when, "run")
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected SIGKILL, got {crashed.returncode}\nstdout:\n{crashed.stdout}\n"
        f"stderr:\n{crashed.stderr}"
    )
    assert crashed.stdout == "", "the killed child got past its first turn"

    out = child_output(run_child(db, 0, "before", mode))
    assert out["turn1"] == ref.turn1
    assert out["turn2"] == ref.turn2
    if mode == "recover":
        never_opened = k == 1 and when == "before"
        already_done = k == ref.commits and when == "after"
        assert out["fallback"] is never_opened, out
        expected = [] if never_opened or already_done else [ref.turn1]
        assert out["recovered"] == expected, out
    check_database(db, ref)
    # The remote tool is at-least-once: it runs again only when the kill came after it
    # ran but before its result committed, and every run carries the same key: the
    # one its committed result records. (Each database is a store of its own, whose
    # identity is in the key, so it is not the reference run's key.)
    runs = remote_runs(db)
    rerun = k == ref.remote_commit and when == "before"
    assert len(runs) == (2 if rerun else 1), runs
    (committed,) = [
        m["result"]["request_key"]
        for m in read_messages(db, ref)
        if m["role"] == "tool" and m["name"] == "check_orders"
    ]
    assert {key for key, _ in runs} == {committed}, runs


@pytest.mark.parametrize("mode", RECOVERY_MODES)
@pytest.mark.parametrize("when", WHENS)
def test_kill_at_every_commit_then_recover(
    reference: Reference, tmp_path: Path, when: str, mode: str
) -> None:
    failures: list[str] = []
    for k in range(1, reference.commits + 1):
        try:
            crash_and_recover(tmp_path, reference, k, when, mode)
        except AssertionError as exc:
            failures.append(f"killed {when} commit {k}, recovered by {mode}: {exc}")
    assert not failures, "\n\n".join(failures)
