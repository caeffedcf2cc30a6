"""Opening the store a command names with ``--store``, for the command line.

``run`` opens (and creates) its store as the runtime does. ``sessions`` and ``show``
only read, so a SQLite path that does not exist is an error naming the file, never a
fresh empty database that would make a typo look like "no sessions". Every failure
becomes a ``CliError``: one line, any password in a DSN redacted.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ._errors import TurnkitError
from ._store import Store
from .stores import is_postgres_dsn, open_store
from .stores._open import redact_dsn

DEFAULT_STORE = os.path.join(".turnkit", "sessions.db")

#: The stores' own prefixes, dropped because the CLI's message already names the store.
_STORE_PREFIX = re.compile(
    r"^(?:PostgresStore: cannot (?:open the database|connect)|SqliteStore: cannot open '[^']*'):\s*"
)


class CliError(Exception):
    """A problem to report as one ``turnkit: error: …`` line (exit status 2)."""


def describe_store(spec: str) -> str:
    """How messages name the store: the file path, or the DSN without its password."""
    return redact_dsn(spec) if is_postgres_dsn(spec) else spec


def one_line(text: str) -> str:
    """``text`` on one line (psycopg's errors run over several) with passwords redacted."""
    return " ".join(redact_dsn(text).split())


@asynccontextmanager
async def reading_store(spec: str) -> AsyncIterator[Store]:
    """The store ``spec`` names, open for reading, closed afterwards."""
    if not is_postgres_dsn(spec):
        _check_sqlite_file(spec)
    store = _store_for(spec)
    try:
        await store.open()
    except TurnkitError as exc:
        raise _cannot_open(spec, exc) from None
    try:
        yield store
    finally:
        await store.close()


def _store_for(spec: str) -> Store:
    try:
        return open_store(spec)
    except TurnkitError as exc:
        raise CliError(one_line(str(exc))) from None


def _check_sqlite_file(path: str) -> None:
    if not os.path.exists(path):
        raise CliError(f"store {path!r} does not exist (no sessions were ever stored there)")
    if not os.path.isfile(path):
        raise CliError(f"store {path!r} is not a file")


def _cannot_open(spec: str, exc: BaseException) -> CliError:
    detail = _STORE_PREFIX.sub("", one_line(str(exc)))
    kind = "PostgreSQL database" if is_postgres_dsn(spec) else "SQLite file"
    return CliError(f"cannot open the {kind} {describe_store(spec)!r}: {detail}")
