"""``PostgresStore``: sessions in PostgreSQL, for deployments with many processes and
hosts (``turnkit[postgres]``). The store is in ``_store``; the package's other
modules are its parts, each named for its one job."""

from ._cell_directory import Layout, MoveUnderWay, Placement, stable_hash
from ._cell_move import Moved, Progress, move_tenant
from ._cells import Cells
from ._faults import PgFaults
from ._statements import qmark_to_pyformat
from ._store import PostgresStore, SessionWriter

__all__ = [
    "Cells",
    "Layout",
    "MoveUnderWay",
    "Moved",
    "PgFaults",
    "Placement",
    "PostgresStore",
    "Progress",
    "SessionWriter",
    "move_tenant",
    "qmark_to_pyformat",
    "stable_hash",
]
