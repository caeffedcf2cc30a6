"""Rate limits in a delivery: before a model step asks its model, it takes a place in
the model's limit from the shared log; if the limit is reached, the turn parks on a
timer (``rate:<step id>:<n>``) until a place frees, holding no worker meanwhile, and
any process serving the store asks again when it fires (docs/tenants.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import StoreError
from .._seams.rates import RateStore
from .._values.inputs import Expiry, InputRequest
from .._values.rate_limits import RATE_SLACK, RATE_STALE, RateLimit, rate_wait_id
from .._values.step_ids import input_step_id

log = logging.getLogger("turnkit.rates")


def model_name(model: Any) -> str | None:
    """The name a model adapter asks its provider for (its ``model``), if any."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True)
class Ticket:
    """A place taken under ``limit`` (to record the call's tokens against)."""

    limit: RateLimit
    number: int


class RateLimiter:
    """The runtime's rate limits, kept in ``log`` (the store's, or this process's)."""

    def __init__(self, limits: Sequence[RateLimit], log: RateStore) -> None:
        self.log = log
        self._by_model = {limit.model: limit for limit in limits}

    def limit_of(self, model: Any) -> RateLimit | None:
        name = model_name(model)
        found = self._by_model.get(name) if name is not None else None
        return found if found is not None else self._by_model.get("*")

    async def take(
        self, model: Any, *, turn_id: str, step_id: str, steps: Mapping[str, Any]
    ) -> Ticket | InputRequest | None:
        """A place for model step ``step_id`` (a ``Ticket``), or the timer its turn
        waits on for one; ``None`` if the model has no limit."""
        limit = self.limit_of(model)
        if limit is None:
            return None
        wait, ticket = await self.log.rate_take(
            limit.key,
            limit.requests_per_minute,
            limit.tokens_per_minute,
            limit.window,
            RATE_SLACK,
            RATE_STALE,
        )
        if ticket is not None:
            return Ticket(limit, ticket)
        waited = 0
        while input_step_id(turn_id, rate_wait_id(step_id, waited + 1)) in steps:
            waited += 1
        now = time.time()
        return InputRequest(
            id=rate_wait_id(step_id, waited + 1),
            prompt=(
                f"the rate limit of model {limit.model!r} is reached; asking again in {wait:.2f}s"
            ),
            turn_id=turn_id,
            call_id="",
            tool="",
            kind="timer",
            expires_at=now + max(wait, 0.0),
            on_expiry=Expiry(action="answer", value=None),
            asked_at=now,
        )

    async def done(self, ticket: Ticket, tokens: int) -> None:
        """The call of ``ticket`` is over (its window runs from now), having used
        ``tokens``."""
        try:
            await self.log.rate_done(ticket.limit.key, ticket.number, tokens)
        except StoreError as exc:
            # The call stays counted as in flight until it goes stale: stricter, never
            # looser; the step's own outcome is what matters here.
            log.warning("could not record the end of a call under %s: %s", ticket.limit.key, exc)

    async def refused(self, model: Any, retry_after: float) -> None:
        """The provider refused a call for load and said when to come back: nobody
        calls the model under this limit before then."""
        limit = self.limit_of(model)
        if limit is not None:
            await self.log.rate_block(limit.key, time.time() + retry_after)
