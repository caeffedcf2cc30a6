"""The ``RateStore`` seam: a shared log of model calls, so a rate limit holds across
every process serving one store (``PostgresStore``); see docs/tenants.md.

``take`` is a check-and-record in one atomic step per limit: it answers how long to
wait, or records the call and returns its ticket, never both, so two processes can
never both take the last place in a window.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class RateStore(Protocol):
    """A store that keeps rate-limit logs for every process that shares it."""

    async def rate_take(
        self,
        key: str,
        requests: int | None,
        tokens: int | None,
        window: float,
        slack: float,
        stale: float,
    ) -> tuple[float, int | None]:
        """Take a place for one call under limit ``key``: ``(0, ticket)`` if fewer than
        ``requests`` calls, and fewer than ``tokens`` tokens, count in the window now
        (the call is logged from now), else ``(seconds to wait, None)``. A call counts
        from when it was taken until ``window`` plus ``slack`` seconds after it was
        done (``rate_done``), so wherever it reached the provider in between, no
        window there holds more than ``requests``; one not done ``stale`` seconds
        after it was taken (its process died) counts as done when it was taken. A
        block (``rate_block``) not over yet is a wait too."""
        ...

    async def rate_done(self, key: str, ticket: int, tokens: int) -> None:
        """Record that the call of ``ticket`` ended, having used ``tokens``."""
        ...

    async def rate_block(self, key: str, until: float) -> None:
        """Refuse every call under ``key`` until ``until`` (seconds since the epoch):
        the provider said so (a 429 with ``retry-after``)."""
        ...
