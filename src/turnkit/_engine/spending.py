"""Budgets in a delivery: the check before each model step, and the ledger entry each
model step commits with (docs/tenants.md).

Over budget, the turn parks on a ``budget_exceeded:<step id>`` request before the
model is asked (or fails, by the budget's ``on_exceeded``): the previous step is
whole in the store and nothing of the next one has happened. An operator's answer
``continue`` lets the rest of the turn run past the budget; ``end`` fails it.
"""

from __future__ import annotations

import time
from typing import Any

from .._seams.store import SessionSpend
from .._values.budgets import BUDGET_PREFIX, CONTINUE, END, Budget, budget_request_id
from .._values.checkpoints import InputAnswer
from .._values.inputs import InputRequest
from .._values.step_ids import input_step_id
from .._values.turns import TurnFailure
from .._values.usage import Usage
from .._values.writes import CountUsage
from .delivery import Delivery
from .tool_steps import Park

#: What an operator may answer a ``budget_exceeded`` request.
DECISION_SCHEMA = {"type": "string", "enum": [CONTINUE, END]}


def _decision(d: Delivery) -> str | None:
    """What an operator answered this turn's budget requests, if anything: ``end`` if
    any said so, else ``continue`` if any did."""
    prefix = input_step_id(d.turn_id, BUDGET_PREFIX)
    said = {
        InputAnswer.from_dict(value).value
        for key, value in d.steps.items()
        if key.startswith(prefix) and isinstance(value, dict)
    }
    if END in said:
        return END
    return CONTINUE if CONTINUE in said else None


async def check_budget(d: Delivery, budget: Budget, step_id: str) -> None:
    """Raise ``Park`` (or ``TurnFailure``) if model step ``step_id`` may not run now."""
    decided = _decision(d)
    if decided == CONTINUE:
        return
    if decided == END:
        raise TurnFailure("budget_exceeded: an operator ended the turn")
    store = d.store
    if not isinstance(store, SessionSpend):
        raise TurnFailure(
            f"budget_exceeded: the store ({type(store).__name__}) keeps no usage ledger, "
            "so a budget cannot be checked"
        )
    session, tenant = await store.spend(d.tenant)
    why = budget.over(d.tenant, session, tenant)
    if why is None:
        return
    if budget.on_exceeded == "fail":
        raise TurnFailure(f"budget_exceeded: {why}")
    raise Park(
        (
            InputRequest(
                id=budget_request_id(step_id),
                prompt=(
                    f"budget_exceeded: {why}. Answer 'continue' to let this turn go on "
                    "past the budget, or 'end' to end it."
                ),
                turn_id=d.turn_id,
                call_id="",
                tool="",
                schema=dict(DECISION_SCHEMA),
                asked_at=time.time(),
            ),
        )
    )


def count_usage(budget: Budget, tenant: str, model: Any, usage: Usage) -> CountUsage:
    """The ledger entry of one model call of ``model`` that used ``usage``."""
    name = getattr(model, "model", None)
    cost = budget.cost(name if isinstance(name, str) else None, usage)
    return CountUsage(tenant, usage.input_tokens, usage.output_tokens, cost)
