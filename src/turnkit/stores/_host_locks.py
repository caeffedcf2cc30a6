"""One writer per session across the processes of one host, for file-backed stores.

Each session maps to one byte of a sidecar lock file, locked with a POSIX record
lock (``fcntl.lockf``). The kernel drops such a lock when its process exits,
however it exits (SIGKILL included), so a writer that died never keeps a session:
no lease to expire, no heartbeat to miss. See "One writer per session" in
``docs/stores.md`` for why this was chosen over a lease row.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import mmap
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import ClassVar

from .._errors import SessionBusyError, StoreError
from ._locks import SessionLocks

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): in-process locking only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("turnkit.stores")

#: Byte offsets are the first 62 bits of a hash of the session id: far inside off_t,
#: and two sessions share a byte (and so wait for each other) with negligible odds.
_OFFSET_BITS = 62
#: The lock file's first bytes hold a random mark that changes with every signal.
_MARK_BYTES = 8
#: How long a waiting writer sleeps between tries, at most (it starts at 1 ms).
_MAX_POLL = 0.05


def lock_offset(session_id: str) -> int:
    """The byte of the lock file that stands for ``session_id``."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _OFFSET_BITS)


class _LockFile:
    """A lock file as this process holds it: one descriptor and one in-process lock
    table, shared by every store over that file here.

    POSIX record locks belong to the process, so they do not keep two stores of one
    process apart (the in-process table does), and closing *any* descriptor of the
    file drops all of the process's locks on it (so there is only one, closed when
    the last store lets go).
    """

    _open: ClassVar[dict[str, tuple[_LockFile, int]]] = {}  # real path -> (file, users)
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.local = SessionLocks()
        # The change mark, read at every step boundary: through a shared mapping of
        # the file's first bytes (which sees every process's pwrite) it is a memory
        # read, not a system call. The file is made long enough to map; its new
        # bytes are zeros, which no signal writes, so nobody takes them for one.
        if os.fstat(fd).st_size < _MARK_BYTES:
            os.ftruncate(fd, _MARK_BYTES)
        self.marks = mmap.mmap(fd, _MARK_BYTES, access=mmap.ACCESS_READ)

    @classmethod
    def acquire(cls, path: str) -> _LockFile:
        real = os.path.realpath(path)
        with cls._guard:
            file, users = cls._open.get(real, (None, 0))
            if file is None:
                try:
                    fd = os.open(real, os.O_RDWR | os.O_CREAT, 0o600)
                except OSError as exc:
                    raise StoreError(f"cannot open the session lock file {real!r}: {exc}") from exc
                try:
                    file = cls(fd)
                except (OSError, ValueError) as exc:
                    os.close(fd)
                    raise StoreError(f"cannot map the session lock file {real!r}: {exc}") from exc
            cls._open[real] = (file, users + 1)
            return file

    @classmethod
    def release(cls, path: str) -> None:
        real = os.path.realpath(path)
        with cls._guard:
            file, users = cls._open[real]
            if users == 1:
                del cls._open[real]
                file.marks.close()
                os.close(file.fd)
            else:
                cls._open[real] = (file, users - 1)


class HostSessionLocks:
    """Session writer locks that hold across processes on one host.

    Inside the process an ``asyncio.Lock`` per session orders deliveries (record
    locks do not exclude the process that holds them); across processes, the byte
    lock. Waiting never blocks the event loop: the lock is tried without blocking
    and retried after a short sleep, up to ``timeout`` seconds, then
    ``SessionBusyError``.
    """

    def __init__(self, path: str | None, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._own = SessionLocks()  # until open(), and where there is no lock file
        self._file: _LockFile | None = None

    def open(self) -> None:
        if self.path is not None and fcntl is not None and self._file is None:
            self._file = _LockFile.acquire(self.path)

    def close(self) -> None:
        if self._file is not None:
            self._file = None
            assert self.path is not None
            _LockFile.release(self.path)

    def signal(self) -> None:
        """Tell every process watching the lock file that something changed (a
        cancellation was recorded): its first 8 bytes get a fresh random value.
        (Not its modification time: the kernel's clock for those is too coarse to
        tell two changes a few milliseconds apart.)"""
        if self._file is not None:
            try:
                os.pwrite(self._file.fd, os.urandom(_MARK_BYTES), 0)
            except OSError as exc:
                log.warning("cannot write the lock file %s: %s", self.path, exc)

    def mark(self) -> bytes | None:
        """The lock file's change mark (``None`` without a file): while it stays the
        same, no process has recorded a cancellation."""
        if self._file is None:
            return None
        return self._file.marks[:_MARK_BYTES]

    def held(self, session_id: str) -> bool:
        local = self._file.local if self._file is not None else self._own
        return local.held(session_id)

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        file = self._file
        if file is None:
            async with self._own.hold(session_id):
                yield
            return
        async with file.local.hold(session_id):
            offset = lock_offset(session_id)
            await self._take(file.fd, offset, session_id)
            try:
                yield
            finally:
                if self._file is file:  # else closing the store already dropped it
                    fcntl.lockf(file.fd, fcntl.LOCK_UN, 1, offset)

    async def _take(self, fd: int, offset: int, session_id: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        delay = 0.001
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise StoreError(
                        f"session {session_id}: cannot lock {self.path!r}: {exc}"
                    ) from exc
            if loop.time() >= deadline:
                raise SessionBusyError(
                    f"session {session_id} is being run by another process on this host; "
                    f"waited {self.timeout:g}s for it (deliver the turn again later)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_POLL)
