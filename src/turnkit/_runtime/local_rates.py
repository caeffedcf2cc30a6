"""``LocalRates``: the rate-limit log in this process's memory, for a store that keeps
none (``MemoryStore``, ``SqliteStore``): the limits then hold within this process.
The same rules as ``PostgresStore``'s ``turnkit_rate_take`` (see ``RateStore``)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass


@dataclass
class _Call:
    ticket: int
    at: float
    done: float | None = None
    tokens: int = 0

    def counts_at(self, now: float, stale: float) -> float:
        """When the call counts as happening: when it ended; ``now`` while in flight
        (unless it went stale: then when it began)."""
        if self.done is not None:
            return self.done
        return self.at if self.at < now - stale else now


class LocalRates:
    """A ``RateStore`` in memory. No method awaits anything, so each is atomic on the
    event loop."""

    def __init__(self) -> None:
        self._log: dict[str, list[_Call]] = {}
        self._blocked: dict[str, float] = {}
        self._tickets = itertools.count(1)

    async def rate_take(
        self,
        key: str,
        requests: int | None,
        tokens: int | None,
        window: float,
        slack: float,
        stale: float,
    ) -> tuple[float, int | None]:
        now = time.time()
        blocked = self._blocked.get(key)
        if blocked is not None and blocked > now:
            return blocked - now, None
        span = window + slack
        log = [c for c in self._log.get(key, []) if c.counts_at(now, stale) >= now - span]
        self._log[key] = log
        times = sorted(c.counts_at(now, stale) for c in log)
        if requests is not None and len(times) >= requests:
            return times[len(times) - requests] + span - now, None
        if tokens is not None and times and sum(c.tokens for c in log) >= tokens:
            return times[0] + span - now, None
        ticket = next(self._tickets)
        log.append(_Call(ticket, now))
        return 0.0, ticket

    async def rate_done(self, key: str, ticket: int, tokens: int) -> None:
        for call in self._log.get(key, ()):
            if call.ticket == ticket:
                call.done, call.tokens = time.time(), tokens
                return

    async def rate_block(self, key: str, until: float) -> None:
        self._blocked[key] = max(until, self._blocked.get(key, 0.0))
