"""What the bare database charges for the rows turnkit writes, shared by the benchmarks.

``pair_rows`` builds the engine's exact rows for one model+tool step pair (pre-encoded
JSON bodies); the PostgreSQL helpers commit such rows with psycopg alone, in the shape
``PostgresStore`` uses (one pipeline: ``BEGIN``, the rows, ``COMMIT``), on a fresh
migrated schema, so a benchmark can set turnkit's cost beside the driver's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from turnkit import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    AssistantMessage,
    MessageCompletedEvent,
    ModelReply,
    StopReason,
    ToolCall,
    ToolMessage,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

SQL_STEP = "INSERT INTO turnkit_steps (session_id, step_id, turn_id, result) VALUES (?, ?, ?, ?)"
SQL_MSG = "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES (?, ?, ?, ?)"
SQL_EVENT = "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES (?, ?, ?, ?)"
DEFAULT_DSN = "postgresql://127.0.0.1:5432/test"

Row = tuple[str, tuple[Any, ...]]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def pair_rows(k: int, turn_id: str, session: str) -> tuple[list[Row], list[Row]]:
    """The rows the engine writes for pair ``k``: (model commit, tool commit).

    Bodies are the engine's own ``to_dict()`` encodings, pre-encoded here so a timed
    loop does SQL only. The model commit has two events (message.completed and
    action.requested); the tool commit has one (action.completed). Placeholders are
    SQLite's ``?``; ``pyformat`` rewrites them for psycopg.
    """
    idx = 1 + 2 * (k - 1)  # the opening is message 0
    seq = 2 + 3 * (k - 1)  # turn.started is seq 1
    call = ToolCall(id=f"c{idx}", name="noop", input={"k": idx})
    stop = StopReason(kind="tool_use")
    reply = ModelReply(text="ok", tool_calls=(call,), stop=stop)
    assistant = AssistantMessage(text="ok", turn_id=turn_id, tool_calls=(call,), stop=stop)
    completed = MessageCompletedEvent(
        turn_id=turn_id, session_id=session, message=assistant, seq=seq
    )
    requested = ActionRequestedEvent(turn_id=turn_id, session_id=session, call=call, seq=seq + 1)
    result = {"ok": True, "k": idx}
    tool_msg = ToolMessage(call_id=call.id, name=call.name, result=result, turn_id=turn_id)
    done = ActionCompletedEvent(
        turn_id=turn_id,
        session_id=session,
        call_id=call.id,
        name=call.name,
        result=result,
        seq=seq + 2,
    )
    model_rows: list[Row] = [
        (SQL_STEP, (session, f"model:{idx}", turn_id, _dumps(reply.to_dict()))),
        (SQL_MSG, (session, idx, turn_id, _dumps(assistant.to_dict()))),
        (SQL_EVENT, (session, seq, turn_id, _dumps(completed.to_dict()))),
        (SQL_EVENT, (session, seq + 1, turn_id, _dumps(requested.to_dict()))),
    ]
    tool_rows: list[Row] = [
        (
            SQL_STEP,
            (session, f"tool:{idx}:{call.id}", turn_id, _dumps({"result": result, "error": None})),
        ),
        (SQL_MSG, (session, idx + 1, turn_id, _dumps(tool_msg.to_dict()))),
        (SQL_EVENT, (session, seq + 2, turn_id, _dumps(done.to_dict()))),
    ]
    return model_rows, tool_rows


def bare_commits(pairs: int, turn_id: str, session: str) -> list[list[Row]]:
    """``2 * pairs`` commits of one step, one message and one event row each, the
    engine's bodies, alternating model and tool commits (the model commit minus its
    action.requested row)."""
    out: list[list[Row]] = []
    for k in range(1, pairs + 1):
        m, t = pair_rows(k, turn_id, session)
        out += [m[:3], t]
    return out


def pyformat(rows: Sequence[Row]) -> list[Row]:
    """The same rows with psycopg's ``%s`` placeholders."""
    return [(sql.replace("?", "%s"), params) for sql, params in rows]


# -- PostgreSQL ------------------------------------------------------------------


def fresh_schema(prefix: str = "bench") -> str:
    """A schema name no other run uses (dropped again by whoever creates it)."""
    return f"turnkit_{prefix}_{uuid.uuid4().hex[:12]}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def redact(dsn: str) -> str:
    """``dsn`` without its password, for printing and for result files."""
    dsn = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def server_info(dsn: str) -> dict[str, Any]:
    """Version and the settings that decide what a commit costs, plus free connections."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        settings = {}
        for name in ("synchronous_commit", "fsync", "wal_sync_method", "max_connections"):
            row = conn.execute(f"SHOW {name}").fetchone()
            settings[name] = row[0] if row else None
        row = conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()
        return {
            "version": conn.info.server_version,
            "settings": settings,
            "connections_in_use": int(row[0]) if row else None,
        }


def describe(info: dict[str, Any]) -> str:
    v = int(info["version"])
    s = info["settings"]
    return (
        f"PostgreSQL {v // 10000}.{v % 10000}, synchronous_commit={s['synchronous_commit']}, "
        f"fsync={s['fsync']}, wal_sync_method={s['wal_sync_method']}, "
        f"max_connections={s['max_connections']} ({info['connections_in_use']} in use)"
    )


@contextmanager
def floor_pool(dsn: str, size: int = 1) -> Iterator[ConnectionPool[Any]]:
    """A psycopg pool of ``size`` autocommit connections on a fresh migrated schema,
    connected the way ``PostgresStore`` connects; the schema is dropped afterwards."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from turnkit.stores.postgres._schema import migrate

    schema = fresh_schema("floor")
    kwargs: dict[str, Any] = {"autocommit": True, "options": f"-c search_path={schema},public"}
    try:
        with psycopg.connect(dsn, **kwargs) as conn:
            migrate(conn, schema)
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn, min_size=size, max_size=size, kwargs=kwargs, open=False
        )
        pool.open(wait=True, timeout=30)
        try:
            yield pool
        finally:
            pool.close()
    finally:
        drop_schema(dsn, schema)


def commit_pipelined(conn: psycopg.Connection[Any], rows: Sequence[Row]) -> None:
    """``BEGIN``, the rows and ``COMMIT`` in one pipeline: one round trip."""
    with conn.pipeline():
        conn.execute("BEGIN")
        for sql, params in rows:
            conn.execute(sql, params)
        conn.execute("COMMIT")


def commit_unpipelined(conn: psycopg.Connection[Any], rows: Sequence[Row]) -> None:
    """The same transaction with each statement its own round trip."""
    conn.execute("BEGIN")
    for sql, params in rows:
        conn.execute(sql, params)
    conn.execute("COMMIT")


def take_writer(conn: psycopg.Connection[Any], session: str) -> str:
    """Register a writer token for ``session``, as a delivery does, for fenced commits."""
    token = uuid.uuid4().hex
    conn.execute(
        "INSERT INTO turnkit_writers (session_id, token, holder, since) "
        "VALUES (%s, %s, 'bench', 0) ON CONFLICT (session_id) DO UPDATE SET token = %s",
        (session, token, token),
    )
    return token


def commit_fenced(
    conn: psycopg.Connection[Any], rows: Sequence[Row], session: str, token: str
) -> None:
    """``commit_pipelined`` plus the writer fence the store sends after ``BEGIN``."""
    with conn.pipeline():
        conn.execute("BEGIN")
        conn.execute("SELECT turnkit_fence(%s, %s)", (session, token))
        for sql, params in rows:
            conn.execute(sql, params)
        conn.execute("COMMIT")
