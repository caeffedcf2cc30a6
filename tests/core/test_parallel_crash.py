"""SIGKILL at every commit of a three-call parallel batch, on SQLite and PostgreSQL.

``parallel_crash_child.py`` runs one turn whose model step asks for a slow remote
call, a local call writing an order row, and a quick remote call, all at once. A
reference run gives the commit count ``N`` and the answer; then for each commit
``k`` in ``1..N``, killed just before it (and once after the last), a fresh
database is crashed, read directly (which calls had committed), recovered by a new process,
and read again: every call has exactly one result, in the order asked; the local
call wrote its row once; a remote call whose result had committed never ran again,
and every run of one call carried the same idempotency key.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from parallel_crash_child import SESSION, TURN_ID
from postgres_support import drop_schema, postgres_dsn
from suite_paths import CHILDREN
from test_crash_recovery import Backend, child_output, remote_log_path

pytestmark = pytest.mark.slow

CHILD = CHILDREN / "parallel_crash_child.py"
CHILD_TIMEOUT = 120.0  # only so a wedged child cannot hang the suite
#: The opening, the model step asking for three calls, one commit per call, the answer.
EXPECTED_COMMITS = 1 + 1 + 3 + 1
CALLS = [("fetch", "a"), ("create_order", "b"), ("fetch", "c")]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = Backend(kind=request.param)
    if b.kind == "postgres":
        b.dsn = postgres_dsn()
    yield b
    for schema in b.schemas:
        drop_schema(b.dsn, schema)


def run_child(db: str, crash_at: int, when: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), db, str(crash_at), when, mode],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def remote_runs(db: str) -> list[tuple[str, str]]:
    """(label, idempotency key) per run of ``fetch``."""
    log = Path(remote_log_path(db))
    if not log.exists():
        return []
    return [(label, key) for label, key in (line.split() for line in log.read_text().splitlines())]


def committed_calls(backend: Backend, db: str) -> set[str]:
    """The call ids whose tool step is in the store (read right after the kill)."""
    try:
        rows = backend.query(
            db, "SELECT step_id FROM turnkit_steps WHERE session_id = ?", (SESSION,)
        )
    except Exception:  # killed before the tables existed
        return set()
    return {step.rsplit(":", 1)[1] for (step,) in rows if step.startswith("tool:")}


def check_database(backend: Backend, db: str, answer: str) -> dict[str, str]:
    """The turn as one uninterrupted run leaves it; returns call id -> label."""
    rows = backend.query(
        db, "SELECT idx, body FROM turnkit_messages WHERE session_id = ? ORDER BY idx", (SESSION,)
    )
    assert [r[0] for r in rows] == list(range(len(rows))), "transcript indexes have gaps"
    messages = [json.loads(body) for _, body in rows]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
    ]
    calls = messages[1]["tool_calls"]
    assert [(c["name"], c["input"].get("label") or c["input"].get("item")) for c in calls] == CALLS
    results = messages[2:5]
    assert [r["call_id"] for r in results] == [c["id"] for c in calls], "results out of order"
    assert not any(r.get("is_error") for r in results), results
    assert messages[5]["text"] == answer
    orders = backend.query(db, "SELECT item, turn_id, call_id FROM orders")
    assert orders == [("b", TURN_ID, calls[1]["id"])], f"the local call wrote {orders}"
    assert results[1]["result"]["item"] == "b"
    events = Counter(
        json.loads(body)["type"]
        for (body,) in backend.query(
            db, "SELECT body FROM turnkit_events WHERE session_id = ?", (SESSION,)
        )
    )
    assert events["action.requested"] == 3 and events["action.completed"] == 3, events
    assert events["turn.completed"] == 1 and events["turn.failed"] == 0, events
    turns = backend.query(db, "SELECT status FROM turnkit_turns WHERE session_id = ?", (SESSION,))
    assert turns == [("completed",)]
    return {c["id"]: c["input"].get("label", c["input"].get("item")) for c in calls}


@pytest.fixture(scope="module")
def answer(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> str:
    db = backend.spec(tmp_path_factory.mktemp("reference"), "turnkit")
    out = child_output(run_child(db, 0, "before", "run"))
    assert out["commits"] == EXPECTED_COMMITS
    assert out["turn"]["status"] == "completed"
    text: str = out["turn"]["text"]
    check_database(backend, db, text)
    assert sorted(label for label, _ in remote_runs(db)) == ["a", "c"]
    return text


def crash_and_recover(backend: Backend, tmp: Path, answer: str, k: int, when: str) -> None:
    db = backend.spec(tmp, f"crash-{k}-{when}")
    crashed = run_child(db, k, when, "run")
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected SIGKILL, got {crashed.returncode}\nstderr:\n{crashed.stderr}"
    )
    before = committed_calls(backend, db)
    ran_before = Counter(label for label, _ in remote_runs(db))
    out = child_output(run_child(db, 0, "before", "recover"))
    assert out["turn"]["text"] == answer
    labels = check_database(backend, db, answer)
    runs = remote_runs(db)
    for call_id, label in labels.items():
        if label == "b":
            continue
        mine = [key for run_label, key in runs if run_label == label]
        assert 1 <= len(mine) <= 2, runs
        assert len(set(mine)) == 1, f"{label} ran with different keys: {runs}"
        if call_id in before:
            # Committed before the kill: the recovery did not run it again.
            assert len(mine) == ran_before[label] == 1, (label, runs)


def test_kill_at_every_commit_of_a_parallel_batch(
    backend: Backend, answer: str, tmp_path: Path
) -> None:
    # Killed before each commit, and after the last: every state the store can be
    # left in (after commit k it holds what it holds before commit k + 1; the kill
    # before a commit also catches a remote call that finished but never committed).
    points = [("before", k) for k in range(1, EXPECTED_COMMITS + 1)]
    points.append(("after", EXPECTED_COMMITS))
    failures: list[str] = []
    for when, k in points:
        try:
            crash_and_recover(backend, tmp_path, answer, k, when)
        except AssertionError as exc:
            failures.append(f"killed {when} commit {k}: {exc}")
    assert not failures, "\n\n".join(failures)
