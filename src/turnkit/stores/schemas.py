"""The SQL stores' schemas, as ``turnkit migrate`` reads and applies them.

``sqlite`` and ``postgres`` each give ``SCHEMA_VERSION`` (what this turnkit
writes), ``stored_version``, ``pending``, ``describe`` and ``migrate``: the
numbered migrations a store applies when it opens, for an operator who applies
them ahead of a deploy. ``postgres`` needs ``turnkit[postgres]``.
"""

from __future__ import annotations

from types import ModuleType

from . import _sqlite_schema as sqlite


def postgres() -> ModuleType:
    """The PostgreSQL store's schema module (imports psycopg)."""
    from .postgres import _schema

    return _schema


__all__ = ["postgres", "sqlite"]
