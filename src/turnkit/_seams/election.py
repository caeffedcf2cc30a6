"""The ``Election`` seam: one process among many leads a job, and another takes over
when it dies.

A store that many processes share can hold an election per job name (PostgreSQL,
through an advisory lock on a connection of its own: the lock goes when its
holder's connection does). The scheduler uses it so that any number of workers may
run the same schedule and one of them fires it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Election(Protocol):
    """One job's election, as seen from this process.

    ``lead()`` returns once this process leads (it campaigns until then), saying
    whether it had to wait for another leader first (then it takes over from one);
    ``lost()`` returns once it no longer does (its lock's connection broke);
    ``resign()`` gives the lead up. A process leads at most once at a time; after
    ``lost()`` or ``resign()`` it may ``lead()`` again.
    """

    async def lead(self) -> bool: ...

    async def lost(self) -> None: ...

    async def resign(self) -> None: ...


@runtime_checkable
class ElectingStore(Protocol):
    """A ``Store`` that can hold elections among the processes sharing it."""

    def election(self, name: str) -> Election: ...
