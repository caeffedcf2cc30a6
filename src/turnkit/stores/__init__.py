"""Storage backends behind the ``SessionStore`` seam.

``MemoryStore`` for tests, ``SqliteStore`` as the embedded default, and
``PostgresStore`` (``turnkit[postgres]``, imported only when first named) for
deployments with many processes.
"""

from typing import TYPE_CHECKING, Any

from .._seams.queue import PendingReset, TurnQueue
from .._seams.store import SessionStore, Store, StoreHandle, Transaction
from .._values.records import (
    SessionInfo,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    preview_of,
)
from ._takeover import Takeover
from .memory import MemoryStore
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MemoryStore",
    "PendingReset",
    "PostgresStore",
    "SessionInfo",
    "SessionSnapshot",
    "SessionStatus",
    "SessionStore",
    "SqliteStore",
    "Store",
    "StoreHandle",
    "Takeover",
    "Transaction",
    "TurnQueue",
    "TurnRecord",
    "TurnStatus",
    "preview_of",
]
