"""Opening the store a command names with ``--store``, for the command line.

``run`` opens (and creates) its store as the runtime does. ``sessions`` and ``show``
only read, so a SQLite path that does not exist is an error naming the file, never a
fresh empty database that would make a typo look like "no sessions". Every failure
becomes a ``CliError``: one line, any password in a DSN redacted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from .._errors import TurnkitError
from .._seams.store import Store
from ..stores import Takeover
from ._open import cell_dsns, dsn_schema, is_cells_spec, is_postgres_dsn, open_store, redact_dsn

DEFAULT_STORE = os.path.join(".turnkit", "sessions.db")

#: Adds ``--store`` to a subcommand's parser, as every command that opens a store has it.
StoreOption = Callable[[argparse.ArgumentParser], None]

#: The stores' own prefixes, dropped because the CLI's message already names the store.
_STORE_PREFIX = re.compile(
    r"^(?:PostgresStore: cannot (?:open the database|connect)|SqliteStore: cannot open '[^']*'):\s*"
)


class CliError(Exception):
    """A problem to report as one ``turnkit: error: …`` line (exit status 2)."""


def describe_store(spec: str) -> str:
    """How messages name the store: the file path, or the DSN without its password."""
    return redact_dsn(spec) if is_postgres_dsn(spec) or is_cells_spec(spec) else spec


def one_line(text: str) -> str:
    """``text`` on one line (psycopg's errors run over several) with passwords redacted."""
    return " ".join(redact_dsn(text).split())


@asynccontextmanager
async def reading_store(spec: str) -> AsyncIterator[Store]:
    """The store ``spec`` names, open for reading, closed afterwards."""
    if is_cells_spec(spec):
        store = _store_for(spec)
        for dsn in cell_dsns(spec).values():
            await asyncio.to_thread(_check_postgres_tables, dsn)
    elif is_postgres_dsn(spec):
        store = _store_for(spec)  # first: it says so if psycopg is not installed
        await asyncio.to_thread(_check_postgres_tables, spec)
    else:
        await asyncio.to_thread(_check_sqlite_file, spec)  # before open_store makes folders
        store = _store_for(spec)
    try:
        await store.open()
    except TurnkitError as exc:
        raise _cannot_open(spec, exc) from None
    try:
        yield store
    finally:
        await store.close()


async def check_store_exists(spec: str) -> None:
    """Refuse a store that holds no turnkit tables (a typo would otherwise make an
    empty one), as ``reading_store`` does, without opening it."""
    if is_cells_spec(spec):
        _store_for(spec)
        for dsn in cell_dsns(spec).values():
            await asyncio.to_thread(_check_postgres_tables, dsn)
    elif is_postgres_dsn(spec):
        _store_for(spec)  # says so if psycopg is not installed
        await asyncio.to_thread(_check_postgres_tables, spec)
    else:
        await asyncio.to_thread(_check_sqlite_file, spec)


async def writable_store(
    spec: str, *, takeover: Takeover | None = None, pool_size: int | None = None
) -> Store:
    """The store ``turnkit run`` runs on, already open (a SQLite file is created), so
    a store that cannot be opened is reported before anything else happens. The
    runtime's own ``open()`` is then a no-op, and its exit closes the store."""
    store = _store_for(spec, takeover=takeover, pool_size=pool_size)
    try:
        await store.open()
    except TurnkitError as exc:
        raise _cannot_open(spec, exc) from None
    return store


def _store_for(
    spec: str, *, takeover: Takeover | None = None, pool_size: int | None = None
) -> Store:
    try:
        return open_store(spec, takeover=takeover, pool_size=pool_size)
    except TurnkitError as exc:
        raise CliError(one_line(str(exc))) from None


def _check_sqlite_file(path: str) -> None:
    """Refuse a path that is no turnkit store before the store opens it: opening
    creates a missing file, and adds turnkit's tables to any other SQLite file."""
    if not os.path.exists(path):
        raise CliError(f"store {path!r} does not exist (no sessions were ever stored there)")
    if not os.path.isfile(path):
        raise CliError(f"store {path!r} is not a file")
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turnkit_sessions'"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise CliError(f"cannot open the SQLite file {path!r}: {one_line(str(exc))}") from None
    if found is None:
        raise CliError(f"{path!r} is not a turnkit store (it has no turnkit tables)")


def _check_postgres_tables(dsn: str) -> None:
    """Refuse a database (or schema) holding no turnkit tables: opening the store would
    create them, and a mistyped DSN would look like a store with no sessions. Also
    the place a DSN that cannot connect is reported, in one line."""
    import psycopg
    from psycopg import sql

    schema = dsn_schema(dsn)
    table = f"{sql.Identifier(schema).as_string(None)}.turnkit_sessions"
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    except psycopg.Error as exc:
        raise CliError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)!r}: {one_line(str(exc))}"
        ) from None
    if row is None or row[0] is None:
        raise CliError(
            f"no turnkit tables in schema {schema!r} of {redact_dsn(dsn)!r} "
            "(no sessions were ever stored there)"
        )


def _cannot_open(spec: str, exc: BaseException) -> CliError:
    detail = _STORE_PREFIX.sub("", one_line(str(exc)))
    kind = "PostgreSQL database" if is_postgres_dsn(spec) else "SQLite file"
    if is_cells_spec(spec):
        kind = "cells"
    return CliError(f"cannot open the {kind} {describe_store(spec)!r}: {detail}")
