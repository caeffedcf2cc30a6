"""``open_store``: the store a command-line ``--store`` value names.

A ``postgresql://`` or ``postgres://`` URL (or a libpq ``key=value`` string) opens a
``PostgresStore``; anything else is a SQLite file path, whose folder is created.
A DSN may pick the PostgreSQL schema the way ``psql`` users already do, through its
``options``: ``?options=-csearch_path%3Dmyschema`` in a URL, or
``options='-c search_path=myschema'`` in a ``key=value`` string.

``TURNKIT_BLOBS`` gives the store its large payloads' home (docs/stores.md): a SQLite
store's blob directory, or, for a PostgreSQL store, any value (its ``turnkit_blobs``
table is read in any case; the variable makes the store write large payloads there).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .._errors import ConfigurationError
from .._seams.store import Store
from ..stores import Takeover
from ..stores.sqlite import SqliteStore

if TYPE_CHECKING:
    from ..stores.postgres import Cells, PostgresStore

#: The environment variable that names where a store keeps its large payloads.
BLOBS_VARIABLE = "TURNKIT_BLOBS"
_POSTGRES_URL = re.compile(r"^postgres(?:ql)?://", re.IGNORECASE)
_LIBPQ_KEYWORDS = re.compile(r"^\s*(?:host|dbname|user|port|hostaddr|service)\s*=")
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*([^\s,]+)", re.IGNORECASE)


def is_postgres_dsn(spec: str) -> bool:
    """Whether ``spec`` is a PostgreSQL connection string rather than a file path."""
    return bool(_POSTGRES_URL.match(spec) or _LIBPQ_KEYWORDS.match(spec))


#: ``cells:NAME=URL,NAME=URL``: several PostgreSQL databases as one store (``Cells``),
#: the first named the home cell. A URL's own commas are not split on.
_CELLS = "cells:"
_CELL = re.compile(r"([A-Za-z0-9_.-]+)=(postgres(?:ql)?://.*?)(?=,[A-Za-z0-9_.-]+=postgres|$)")


def is_cells_spec(spec: str) -> bool:
    """Whether ``spec`` names several PostgreSQL databases as cells."""
    return spec.startswith(_CELLS)


def is_shared_store(spec: str) -> bool:
    """Whether ``spec`` names a store that many processes share (workers claim from it)."""
    return is_postgres_dsn(spec) or is_cells_spec(spec)


def cell_dsns(spec: str) -> dict[str, str]:
    """The cells a ``cells:`` spec names, by name, in its order (the home first)."""
    rest = spec[len(_CELLS) :]
    found = {m.group(1): m.group(2) for m in _CELL.finditer(rest)}
    joined = ",".join(f"{name}={dsn}" for name, dsn in found.items())
    if not found or joined != rest:
        raise ConfigurationError(
            f"--store {redact_dsn(spec)!r}: cells are given as "
            "cells:NAME=postgresql://...,NAME=postgresql://... (the first is the home cell)"
        )
    return found


def open_store(
    spec: str, *, takeover: Takeover | None = None, pool_size: int | None = None
) -> Store:
    """The store ``spec`` names: a PostgreSQL DSN or a SQLite file path.

    Nothing is connected yet; the runtime opens the store. A PostgreSQL DSN without
    ``turnkit[postgres]`` installed raises ``ConfigurationError`` naming the extra.
    The first schema of a ``search_path`` in the DSN's ``options`` is the schema
    turnkit's tables live in (``public`` when there is none). ``takeover`` is the
    liveness settings of a PostgreSQL store (its default if ``None``), ``pool_size``
    the most connections each of its pools opens (its ``max_size``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError("--store must be a SQLite file path or a PostgreSQL DSN")
    if is_cells_spec(spec):
        return _open_cells(spec, takeover, pool_size)
    if is_postgres_dsn(spec):
        return _open_postgres(spec, takeover, pool_size)
    folder = os.path.dirname(os.path.abspath(spec))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"--store {spec!r}: cannot create its folder {folder}: {exc.strerror}"
        ) from exc
    return SqliteStore(spec, blobs=os.environ.get(BLOBS_VARIABLE) or None)


def _open_postgres(spec: str, takeover: Takeover | None, pool_size: int | None) -> PostgresStore:
    try:
        from ..stores.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigurationError(
            f"--store {redact_dsn(spec)!r} is a PostgreSQL DSN, which needs "
            "psycopg: pip install 'turnkit[postgres]'"
        ) from exc
    blobs = bool(os.environ.get(BLOBS_VARIABLE))
    if pool_size is None:
        return PostgresStore(spec, schema=dsn_schema(spec), takeover=takeover, blobs=blobs)
    return PostgresStore(
        spec, schema=dsn_schema(spec), takeover=takeover, max_size=pool_size, blobs=blobs
    )


def _open_cells(spec: str, takeover: Takeover | None, pool_size: int | None) -> Cells:
    """The ``Cells`` store of a ``cells:`` spec, each cell opened as its DSN says."""
    stores = {
        name: _open_postgres(dsn, takeover, pool_size) for name, dsn in cell_dsns(spec).items()
    }
    from ..stores.postgres import Cells  # importable: _open_postgres checked

    return Cells(stores)


def dsn_schema(dsn: str) -> str:
    """The schema a DSN's ``options`` put first on the ``search_path``, else ``public``.

    ``PostgresStore`` sets the connections' ``search_path`` itself (from its
    ``schema``), so a DSN's own ``-c search_path`` would otherwise be silently
    overridden; reading it here makes the DSN mean what it says.
    """
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        options = conninfo_to_dict(dsn).get("options")
    except Error:
        raise ConfigurationError(f"--store {redact_dsn(dsn)!r} is not a valid DSN") from None
    found = _SEARCH_PATH.search(str(options or ""))
    return found.group(1).strip("\"'") if found else "public"


def redact_dsn(text: str) -> str:
    """``text`` (a DSN, or a message quoting one) with any password replaced."""
    text = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)
    text = re.sub(r"([?&]password=)[^&\s]*", r"\1***", text, flags=re.IGNORECASE)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", text, flags=re.IGNORECASE)
