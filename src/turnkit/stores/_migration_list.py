"""What ``turnkit migrate`` tells of a SQL store's numbered migrations: the same
reading for the SQLite and the PostgreSQL schema, whose lists differ."""

from __future__ import annotations

#: A schema's migrations: entry ``i`` holds the statements from version ``i`` to ``i + 1``.
Migrations = list[tuple[str, ...]]


def pending_numbers(version: int, migrations: Migrations) -> list[int]:
    """The migrations a schema at ``version`` still needs, by number."""
    return list(range(version + 1, len(migrations) + 1))


def describe_migration(number: int, migrations: Migrations) -> str:
    """Migration ``number`` in one line: what each statement does, in short."""
    parts = [" ".join(s.split()).split(" (", 1)[0][:80] for s in migrations[number - 1]]
    return "; ".join(parts)
