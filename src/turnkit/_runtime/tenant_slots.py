"""``TenantSlots``: one tenant's concurrency cap in a runtime that runs its own turns.

At most ``cap`` deliveries of the tenant hold a slot at once; the others wait, first
come first served. A waiting delivery can be let through without a slot: a recovered
child turn whose parent, holding a slot, has asked for it and waits for it
(docs/tenants.md, "Recovered child turns").
"""

from __future__ import annotations

import asyncio
from collections import deque


class TenantSlots:
    """A counting gate whose waiters hold a ticket that can be excused."""

    def __init__(self, cap: int) -> None:
        self._free = cap
        self._waiting: deque[asyncio.Future[bool]] = deque()

    async def take(self, ticket: asyncio.Future[bool]) -> bool:
        """Wait for a slot: ``True`` once one is held (hand it back with
        ``give_back``), ``False`` if ``ticket`` was excused first (``excuse``)."""
        if ticket.done():
            return ticket.result()
        if self._free > 0:
            self._free -= 1
            return True
        self._waiting.append(ticket)
        try:
            return await ticket
        except asyncio.CancelledError:
            # Handed a slot in the moment the delivery was cancelled: pass it on.
            if ticket.done() and not ticket.cancelled() and ticket.result():
                self.give_back()
            raise
        finally:
            if ticket in self._waiting:
                self._waiting.remove(ticket)

    def give_back(self) -> None:
        """Hand a held slot to the longest waiter still waiting, else free it."""
        while self._waiting:
            ticket = self._waiting.popleft()
            if not ticket.done():
                ticket.set_result(True)
                return
        self._free += 1


def excuse(ticket: asyncio.Future[bool]) -> None:
    """Let the delivery holding ``ticket`` through without a slot of its own, unless it
    holds one already."""
    if not ticket.done():
        ticket.set_result(False)
