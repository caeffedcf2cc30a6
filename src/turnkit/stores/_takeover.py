"""``Takeover``: how soon PostgreSQL frees the sessions of a process that went silent.

A worker holds its sessions through advisory locks on one connection; they are
freed only when PostgreSQL ends that connection. A process that dies cleanly or is
killed closes its socket, and the server ends the connection at once. One that
stops answering (paused, its host gone, the network cut) is found out by these
settings, which ``PostgresStore`` puts on its connections.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigurationError


@dataclass(frozen=True, kw_only=True)
class Takeover:
    """The liveness settings of a ``PostgresStore``'s connections (seconds).

    ``idle_timeout`` is the lock connection's ``idle_session_timeout`` (PostgreSQL
    14 and later; ``0`` turns it off): the server ends it after that long without a
    statement, and the store sends one every ``heartbeat`` seconds while it lives,
    so only a process that stopped running (``SIGSTOP``, a frozen VM, a blocked
    event loop) loses it. It bounds the takeover of a paused process's sessions.

    ``keepalive_idle``, ``keepalive_interval`` and ``keepalive_count`` are TCP
    keepalives, set on both ends of every connection (libpq's ``keepalives_*``
    and the server's ``tcp_keepalives_*``), and ``user_timeout`` is
    ``tcp_user_timeout``: together they bound how long a lost host or a cut
    network goes unnoticed, about ``keepalive_idle + keepalive_interval *
    keepalive_count`` on an idle connection and ``user_timeout`` on a busy one.
    A DSN that sets libpq's own values keeps them.

    ``tool_idle_timeout`` is the ``idle_in_transaction_session_timeout`` of the
    connections local (``def``) tools write through: a step's transaction is open
    while its tool runs, so a process paused there holds the session until the
    server ends that connection. ``None`` (the default) uses ``idle_timeout``; a
    ``def`` tool that computes for longer than that inside its step needs a larger
    value (``0`` turns it off, and takeovers of such a pause wait for the pause).
    """

    idle_timeout: float = 10.0
    heartbeat: float = 2.0
    keepalive_idle: int = 5
    keepalive_interval: int = 2
    keepalive_count: int = 3
    user_timeout: float = 10.0
    tool_idle_timeout: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "idle_timeout",
            "heartbeat",
            "keepalive_idle",
            "keepalive_interval",
            "keepalive_count",
            "user_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"Takeover.{name} must be a number >= 0, got {value!r}")
        tool = self.tool_idle_timeout
        if tool is not None and (
            isinstance(tool, bool) or not isinstance(tool, int | float) or tool < 0
        ):
            raise ConfigurationError(
                f"Takeover.tool_idle_timeout must be a number >= 0 or None, got {tool!r}"
            )
        for name in ("heartbeat", "keepalive_idle", "keepalive_interval", "keepalive_count"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"Takeover.{name} must be more than 0")
        if self.idle_timeout and self.heartbeat * 2 > self.idle_timeout:
            raise ConfigurationError(
                f"Takeover.heartbeat ({self.heartbeat:g}s) must be at most half of "
                f"idle_timeout ({self.idle_timeout:g}s), or healthy processes lose their sessions"
            )

    @property
    def tool_idle_limit(self) -> float:
        """``tool_idle_timeout``, or ``idle_timeout`` when it is not set."""
        return self.idle_timeout if self.tool_idle_timeout is None else self.tool_idle_timeout

    def client_settings(self) -> dict[str, int]:
        """libpq's connection parameters for the client end."""
        return {
            "keepalives": 1,
            "keepalives_idle": self.keepalive_idle,
            "keepalives_interval": self.keepalive_interval,
            "keepalives_count": self.keepalive_count,
            "tcp_user_timeout": int(self.user_timeout * 1000),
        }

    def lock_settings(self, server_version: int) -> bytes:
        """The ``SET`` statements for the lock connection on a server of that version
        (``server_version`` as libpq gives it: 150004 for 15.4)."""
        sets = [
            f"SET tcp_keepalives_idle = {self.keepalive_idle}",
            f"SET tcp_keepalives_interval = {self.keepalive_interval}",
            f"SET tcp_keepalives_count = {self.keepalive_count}",
        ]
        if server_version >= 120000:
            sets.append(f"SET tcp_user_timeout = {int(self.user_timeout * 1000)}")
        if server_version >= 140000:
            sets.append(f"SET idle_session_timeout = {int(self.idle_timeout * 1000)}")
        return "; ".join(sets).encode()
