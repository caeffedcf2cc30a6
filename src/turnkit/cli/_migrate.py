"""``turnkit migrate``: show a store's pending schema migrations, or apply them.

Stores migrate themselves when they open; this lets a deployment see what an
upgrade will change and apply it as a step of its own, before new nodes start
(see "Upgrading turnkit" in docs/deploying.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import StoreError
from ..stores.schemas import sqlite as sqlite_schema
from ._open import dsn_schema, is_cells_spec, is_postgres_dsn
from ._progress import Progress
from ._store import CliError, StoreOption, describe_store, one_line


def add_migrate(commands: Any, store_option: StoreOption) -> None:
    migrate = commands.add_parser(
        "migrate",
        help="list a store's pending schema migrations (--check) or apply them (--apply)",
        description="Compare the store's schema with this turnkit's. --check lists the "
        "migrations it would apply and exits 1 if there are any (0 when up to date); "
        "--apply applies them, online: running nodes keep working meanwhile. A store "
        "migrated by a newer turnkit is left alone: this one says whether it may still "
        "use it.",
    )
    store_option(migrate)
    what = migrate.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="only list what is pending")
    what.add_argument("--apply", action="store_true", help="apply what is pending")
    migrate.add_argument("--json", action="store_true", help="print one JSON object instead")
    migrate.set_defaults(handler=migrate_command)


@dataclass(frozen=True)
class SchemaState:
    """Where a store's schema stands against this turnkit's."""

    store: str
    dialect: str
    version: int
    target: int
    readable_from: int | None
    pending: list[int]
    describe: Callable[[int], str]

    @property
    def newer(self) -> bool:
        return self.version > self.target

    @property
    def usable(self) -> bool:
        """Whether this turnkit may use the schema (a newer one says if it may)."""
        return not self.newer or (
            self.readable_from is not None and self.readable_from <= self.target
        )

    def to_json(self, applied: list[int]) -> dict[str, Any]:
        return {
            "store": self.store,
            "dialect": self.dialect,
            "version": self.version,
            "turnkit_version": self.target,
            "readable_from": self.readable_from,
            "pending": [{"version": n, "statements": self.describe(n)} for n in self.pending],
            "applied": applied,
            "usable": self.usable,
        }


async def migrate_command(args: argparse.Namespace, progress: Progress) -> int:
    del progress
    spec: str = args.store
    state = _state(spec)
    applied: list[int] = []
    if args.apply and state.pending and state.usable:
        _apply(spec)
        applied, state = state.pending, _state(spec)
    if args.json:
        print(json.dumps(state.to_json(applied), indent=2))
    else:
        _report(state, applied, apply=args.apply)
    if not state.usable:
        return 2
    return 1 if args.check and state.pending else 0


def _report(state: SchemaState, applied: list[int], *, apply: bool) -> None:
    where = f"{state.store} ({state.dialect})"
    if state.newer:
        print(
            f"{where} is at schema version {state.version}, newer than this turnkit's "
            f"{state.target}: "
            + (
                f"a newer turnkit migrated it and says versions from {state.readable_from} "
                "may still use it"
                if state.usable
                else "this turnkit may not use it; upgrade turnkit"
            )
        )
        return
    if applied:
        numbers = ", ".join(str(n) for n in applied)
        print(f"{where}: applied migration(s) {numbers}; now at schema version {state.version}")
        return
    if not state.pending:
        print(f"{where} is up to date (schema version {state.version})")
        return
    if state.version == 0:
        print(
            f"{where} has no turnkit schema yet: {len(state.pending)} migrations create it "
            f"(schema version {state.target})"
        )
        return
    print(
        f"{where} is at schema version {state.version}; this turnkit's is {state.target}. "
        f"Pending ({len(state.pending)}):"
    )
    for number in state.pending:
        print(f"  {number}: {state.describe(number)}")
    if not apply:
        print("apply them with: turnkit migrate --apply (or by opening the store)")


def _state(spec: str) -> SchemaState:
    where = describe_store(spec)
    if is_cells_spec(spec):
        raise CliError("turnkit migrate takes one database: run it on each cell's DSN")
    if is_postgres_dsn(spec):
        from ..stores import schemas

        pg_schema = schemas.postgres()

        with _pg_connection(spec) as conn:
            version, floor = pg_schema.stored_version(conn, dsn_schema(spec))
        pending, describe = pg_schema.pending(version), pg_schema.describe
        return SchemaState(
            where, "postgresql", version, pg_schema.SCHEMA_VERSION, floor, pending, describe
        )
    version, floor = 0, None
    if os.path.exists(spec):
        try:
            with sqlite3.connect(f"file:{spec}?mode=ro", uri=True) as conn:
                version, floor = sqlite_schema.stored_version(conn)
        except sqlite3.DatabaseError as exc:
            raise CliError(f"cannot read the SQLite file {spec!r}: {exc}") from None
    return SchemaState(
        where,
        "sqlite",
        version,
        sqlite_schema.SCHEMA_VERSION,
        floor,
        sqlite_schema.pending(version),
        sqlite_schema.describe,
    )


def _apply(spec: str) -> None:
    try:
        if is_postgres_dsn(spec):
            from ..stores import schemas

            pg_schema = schemas.postgres()

            with _pg_connection(spec) as conn:
                pg_schema.migrate(conn, dsn_schema(spec))
            return
        folder = os.path.dirname(os.path.abspath(spec))
        os.makedirs(folder, exist_ok=True)
        conn = sqlite3.connect(spec, isolation_level=None, timeout=30.0)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            sqlite_schema.migrate(conn)
        finally:
            conn.close()
    except (StoreError, sqlite3.Error, OSError) as exc:
        raise CliError(f"migrating {describe_store(spec)} failed: {one_line(str(exc))}") from None


def _pg_connection(spec: str) -> Any:
    try:
        import psycopg
    except ImportError:
        raise CliError(
            "a PostgreSQL store needs psycopg: pip install 'turnkit[postgres]'"
        ) from None
    try:
        return psycopg.connect(spec, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise CliError(f"cannot connect to {describe_store(spec)}: {one_line(str(exc))}") from None
