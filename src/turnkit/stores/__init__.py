"""Storage backends behind the ``SessionStore`` seam.

``MemoryStore`` for tests, ``SqliteStore`` as the embedded default; networked
backends live in their own optional modules.
"""

from .._store import (
    SessionInfo,
    SessionSnapshot,
    SessionStatus,
    SessionStore,
    Store,
    StoreHandle,
    Transaction,
    TurnRecord,
    TurnStatus,
)
from .memory import MemoryStore
from .sqlite import SqliteStore

__all__ = [
    "MemoryStore",
    "SessionInfo",
    "SessionSnapshot",
    "SessionStatus",
    "SessionStore",
    "SqliteStore",
    "Store",
    "StoreHandle",
    "Transaction",
    "TurnRecord",
    "TurnStatus",
]
