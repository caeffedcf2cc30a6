"""Storage backends behind the ``SessionStore`` seam.

``MemoryStore`` for tests, ``SqliteStore`` as the embedded default, and
``PostgresStore`` (``turnkit[postgres]``, imported only when first named) for
deployments with many processes. A commit is a list of writes (``AppendMessage``,
``PutStep``, ``LogEvent``, ``PutTurn``, ...); ``turn_rules`` makes the ``PutTurn`` of a
turn's status move, so code that writes to a store by hand keeps the engine's rules.
"""

from typing import TYPE_CHECKING, Any

from .._seams.inbox import InboxStore
from .._seams.placing import PlacingStore
from .._seams.queue import PendingReset, Serving, TurnQueue, WorkerRegistry
from .._seams.retention import PrunableStore
from .._seams.store import (
    SessionStore,
    Store,
    StoreHandle,
    ToolStep,
    all_sessions,
    parked_turn,
    transcript,
)
from .._seams.tenant_view import TenantView
from .._seams.timers import TimerStore
from .._seams.worker_view import HeldSession, LiveWorker, WorkerView
from .._values import turn_rules
from .._values.records import (
    Erasure,
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
    DropGeneration,
    DropReset,
    EraseSession,
    LogEvent,
    PruneSession,
    PutStep,
    PutTurn,
    RequestCancel,
    RequestReset,
    TrimEvents,
    Write,
)
from ._takeover import Takeover
from .blobs import FileBlobStore, MemoryBlobStore
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
    "DropGeneration",
    "DropReset",
    "EraseSession",
    "Erasure",
    "FileBlobStore",
    "HeldSession",
    "InboxStore",
    "LiveWorker",
    "LogEvent",
    "MemoryBlobStore",
    "MemoryStore",
    "PendingReset",
    "PlacingStore",
    "PostgresStore",
    "PrunableStore",
    "PruneSession",
    "PutStep",
    "PutTurn",
    "RequestCancel",
    "RequestReset",
    "Serving",
    "SessionInfo",
    "SessionSnapshot",
    "SessionStatus",
    "SessionStore",
    "SqliteStore",
    "Store",
    "StoreHandle",
    "Takeover",
    "TenantView",
    "TimerStore",
    "ToolStep",
    "TrimEvents",
    "TurnQueue",
    "TurnRecord",
    "TurnStatus",
    "WorkerRegistry",
    "WorkerView",
    "Write",
    "all_sessions",
    "parked_turn",
    "preview_of",
    "transcript",
    "turn_rules",
]
