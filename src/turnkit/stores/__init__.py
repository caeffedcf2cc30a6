"""Storage backends behind the ``SessionStore`` seam.

``MemoryStore`` for tests, ``SqliteStore`` as the embedded default, and
``PostgresStore`` (``turnkit[postgres]``, imported only when first named) for
deployments with many processes.
"""

from typing import TYPE_CHECKING, Any

from .._seams.queue import PendingReset, TurnQueue
from .._seams.store import (
    SessionStore,
    Store,
    StoreHandle,
    ToolStep,
    all_sessions,
    parked_turn,
    transcript,
)
from .._values.records import (
    SessionInfo,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    preview_of,
)
from .._values.writes import (
    AppendMessage,
    ArchiveGeneration,
    DropReset,
    LogEvent,
    OpenTurn,
    PutStep,
    QueueTurn,
    RequestCancel,
    RequestReset,
    SettleQueued,
    SetTurnStatus,
    Write,
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
    "AppendMessage",
    "ArchiveGeneration",
    "DropReset",
    "LogEvent",
    "MemoryStore",
    "OpenTurn",
    "PendingReset",
    "PostgresStore",
    "PutStep",
    "QueueTurn",
    "RequestCancel",
    "RequestReset",
    "SessionInfo",
    "SessionSnapshot",
    "SessionStatus",
    "SessionStore",
    "SetTurnStatus",
    "SettleQueued",
    "SqliteStore",
    "Store",
    "StoreHandle",
    "Takeover",
    "ToolStep",
    "TurnQueue",
    "TurnRecord",
    "TurnStatus",
    "Write",
    "all_sessions",
    "parked_turn",
    "preview_of",
    "transcript",
]
