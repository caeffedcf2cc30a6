"""``open_store``: the store a command-line ``--store`` value names.

A ``postgresql://`` or ``postgres://`` URL (or a libpq ``key=value`` string) opens a
``PostgresStore``; anything else is a SQLite file path, whose folder is created.
"""

from __future__ import annotations

import os
import re

from .._errors import ConfigurationError
from .._store import Store
from .sqlite import SqliteStore

_POSTGRES_URL = re.compile(r"^postgres(?:ql)?://", re.IGNORECASE)
_LIBPQ_KEYWORDS = re.compile(r"^\s*(?:host|dbname|user|port|hostaddr|service)\s*=")


def is_postgres_dsn(spec: str) -> bool:
    """Whether ``spec`` is a PostgreSQL connection string rather than a file path."""
    return bool(_POSTGRES_URL.match(spec) or _LIBPQ_KEYWORDS.match(spec))


def open_store(spec: str) -> Store:
    """The store ``spec`` names: a PostgreSQL DSN or a SQLite file path.

    Nothing is connected yet; the runtime opens the store. A PostgreSQL DSN without
    ``turnkit[postgres]`` installed raises ``ConfigurationError`` naming the extra.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError("--store must be a SQLite file path or a PostgreSQL DSN")
    if is_postgres_dsn(spec):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"--store {_redacted(spec)!r} is a PostgreSQL DSN, which needs "
                "psycopg: pip install 'turnkit[postgres]'"
            ) from exc
        return PostgresStore(spec)
    folder = os.path.dirname(os.path.abspath(spec))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"--store {spec!r}: cannot create its folder {folder}: {exc.strerror}"
        ) from exc
    return SqliteStore(spec)


def _redacted(dsn: str) -> str:
    """The DSN with any password replaced, for error messages."""
    dsn = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn, flags=re.IGNORECASE)
