"""Two cells on the test PostgreSQL server: its own database and a second one made for
the test module (``CREATE DATABASE``, dropped afterwards), a schema per test in each."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from postgres_support import RUN_ID, drop_schema, new_schema, postgres_dsn
from psycopg.conninfo import conninfo_to_dict

from turnkit.stores.postgres import Cells, Placement, PostgresStore


@dataclass(frozen=True)
class CellPlaces:
    """Where a test's two cells live: ``a`` (the home) and ``b``, one schema in each."""

    dsn_a: str
    dsn_b: str
    schema: str

    def store(self, cell: str, **options: object) -> PostgresStore:
        """A store on ``cell``'s schema, with few connections (max_connections is shared)."""
        dsn = self.dsn_a if cell == "a" else self.dsn_b
        kwargs: dict[str, object] = {"max_size": 3, "commit_senders": 1, "busy_timeout": 30.0}
        kwargs.update(options)
        return PostgresStore(dsn, schema=self.schema, **kwargs)  # type: ignore[arg-type]

    def cells(self, place: Placement | None = None, **options: object) -> Cells:
        return Cells(
            {"a": self.store("a", **options), "b": self.store("b", **options)}, place=place
        )

    def spec(self) -> str:
        """The ``--store`` value naming both cells on the command line."""
        return f"cells:a={self.with_schema(self.dsn_a)},b={self.with_schema(self.dsn_b)}"

    def with_schema(self, dsn: str) -> str:
        sep = "&" if "?" in dsn else "?"
        return f"{dsn}{sep}options=-csearch_path%3D{self.schema}"

    def rows(
        self, cell: str, query: str, params: tuple[object, ...] = ()
    ) -> list[tuple[object, ...]]:
        dsn = self.dsn_a if cell == "a" else self.dsn_b
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"')
            return list(conn.execute(query, params).fetchall())


@pytest.fixture(scope="module")
def second_database() -> Iterator[str]:
    """A database of this module's own on the test server; its DSN."""
    base = postgres_dsn()
    if not base.startswith(("postgresql://", "postgres://")):
        pytest.skip("the cells tests need the test DSN as a URL (postgresql://...)")
    name = f"turnkit_test_cells_{RUN_ID}_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(base)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def places(second_database: str) -> Iterator[CellPlaces]:
    base = postgres_dsn()
    assert conninfo_to_dict(base).get("dbname") != conninfo_to_dict(second_database)["dbname"]
    schema = new_schema()
    yield CellPlaces(base, second_database, schema)
    drop_schema(base, schema)
    drop_schema(second_database, schema)


@asynccontextmanager
async def opened(cells: Cells) -> AsyncIterator[Cells]:
    await cells.open()
    try:
        yield cells
    finally:
        await cells.close()


#: An app's placement: tenants named ``eu-...`` in cell b, the rest in a.
def by_region(tenant: str) -> str:
    return "b" if tenant.startswith("eu-") else "a"
