"""``PostgresStore.faults``: the failures a deployment meets, made on purpose in tests.

A takeover happens when another process's claim wins a session this one thought it
held, or when the connection that holds this process's writer locks dies (a
network partition, a restarted server, a killed backend). Tests of how turnkit
behaves then need to cause exactly that, without reaching into the store's
internals: this object is the one documented way.
"""

from __future__ import annotations

from ._writer import Writers


class PgFaults:
    """What a test can break in a ``PostgresStore`` (get it as ``store.faults``)."""

    def __init__(self, writers: Writers) -> None:
        self._writers = writers

    def lose_writer(self, session_id: str) -> None:
        """As if another process took ``session_id`` over: this process's commits
        there carry a fencing token that no longer matches, so the next one is
        refused (``SessionBusyError``), as a paused process's is after a takeover."""
        self._writers.tokens[session_id] = "lost-to-another-process"

    def lock_backend_pid(self) -> int | None:
        """The server process (``pg_backend_pid()``) of the connection that holds this
        process's session locks, or ``None`` while it has none: terminate it with
        ``pg_terminate_backend`` to lose every lock at once, as a partition would."""
        conn = self._writers.lock_conn
        return conn.info.backend_pid if conn is not None and not conn.closed else None
