"""``PostgresStore``: sessions in PostgreSQL, for deployments with many processes and
hosts (``turnkit[postgres]``). The store is in ``_store``; the package's other
modules are its parts, each named for its one job."""

from ._faults import PgFaults
from ._statements import qmark_to_pyformat
from ._store import PostgresStore, SessionWriter

__all__ = ["PgFaults", "PostgresStore", "SessionWriter", "qmark_to_pyformat"]
