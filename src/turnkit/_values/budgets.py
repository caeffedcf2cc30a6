"""Budgets: how many tokens and how much money a session and a tenant may spend on
model calls, checked before each model step (docs/tenants.md).

``Spend`` is what the store's usage ledger holds for one session or one tenant;
``Budget`` says the limits, the per-model prices the app supplies, and what a turn
does once over: park on a ``budget_exceeded`` request, or fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from .._errors import ConfigurationError
from .tenancy import check_tenant
from .usage import Usage

#: The id of the request a turn over budget parks on, before model step ``step_id``.
BUDGET_PREFIX = "budget_exceeded:"
#: What an operator may answer it: go on past the budget for the rest of this turn,
#: or end the turn (it fails, saying so).
CONTINUE, END = "continue", "end"


def budget_request_id(step_id: str) -> str:
    return f"{BUDGET_PREFIX}{step_id}"


@dataclass(frozen=True)
class Spend:
    """What a session or a tenant spent on model calls: tokens in and out, the cost
    by the app's prices (a model without a price costs nothing), and how many calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost + other.cost,
            self.calls + other.calls,
        )


NO_SPEND = Spend()


def _limit(name: str, value: object, kind: type) -> None:
    if value is None:
        return
    wanted = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise ConfigurationError(f"{name} must be a number >= 0 or None, got {value!r}")
    if not float(value) < float("inf") or not value >= 0:  # (NaN is neither)
        raise ConfigurationError(f"{name} must be a number >= 0 or None, got {value!r}")


@dataclass(frozen=True)
class Limit:
    """At most ``tokens`` tokens (input plus output) and ``cost`` in the prices'
    currency; ``None``: no limit of that kind."""

    tokens: int | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        _limit("Limit.tokens", self.tokens, int)
        _limit("Limit.cost", self.cost, float)

    def over(self, spent: Spend) -> str | None:
        """Why ``spent`` is at or past this limit, or ``None``."""
        if self.tokens is not None and spent.tokens >= self.tokens:
            return f"{spent.tokens} tokens used of {self.tokens}"
        if self.cost is not None and spent.cost >= self.cost:
            return f"cost {spent.cost:.6g} of {self.cost:g}"
        return None


@dataclass(frozen=True)
class Price:
    """A model's price per million input and output tokens (any currency, as long as
    the limits use the same)."""

    input_per_million: float
    output_per_million: float

    def __post_init__(self) -> None:
        _limit("Price.input_per_million", self.input_per_million, float)
        _limit("Price.output_per_million", self.output_per_million, float)

    def cost(self, usage: Usage) -> float:
        return (
            usage.input_tokens * self.input_per_million
            + usage.output_tokens * self.output_per_million
        ) / 1_000_000


@dataclass(frozen=True)
class Budget:
    """Spending limits checked before every model step, from the store's usage ledger.

    ``per_session`` and ``per_tenant`` apply to every session and tenant;
    ``tenants`` overrides ``per_tenant`` by name. ``prices`` maps a model's name (its
    adapter's ``model``, e.g. ``"gpt-4o-mini"``; ``"*"`` for any other) to its
    ``Price``. ``on_exceeded``: ``"park"`` parks the turn on a ``budget_exceeded``
    request that an operator answers ``"continue"`` (the rest of the turn runs past
    the budget) or ``"end"`` (the turn fails); ``"fail"`` fails the turn at once.
    A ``Budget()`` with no limits only keeps the ledger (usage per tenant, for
    metrics). Either way nothing of the next model step has happened yet."""

    per_session: Limit | None = None
    per_tenant: Limit | None = None
    tenants: Mapping[str, Limit] = field(default_factory=dict)
    prices: Mapping[str, Price] = field(default_factory=dict)
    on_exceeded: Literal["park", "fail"] = "park"

    def __post_init__(self) -> None:
        for name in ("per_session", "per_tenant"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Limit):
                raise ConfigurationError(f"Budget.{name} must be a Limit, got {value!r}")
        if not isinstance(self.tenants, Mapping) or not isinstance(self.prices, Mapping):
            raise ConfigurationError("Budget.tenants and Budget.prices must be mappings")
        for tenant, limit in self.tenants.items():
            check_tenant(tenant)
            if not isinstance(limit, Limit):
                raise ConfigurationError(f"Budget.tenants[{tenant!r}] must be a Limit")
        for model, price in self.prices.items():
            if not isinstance(model, str) or not isinstance(price, Price):
                raise ConfigurationError(
                    f"Budget.prices maps model names to Price, got {model!r}: {price!r}"
                )
        if self.on_exceeded not in ("park", "fail"):
            raise ConfigurationError(
                f"Budget.on_exceeded must be 'park' or 'fail', got {self.on_exceeded!r}"
            )
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))
        object.__setattr__(self, "prices", MappingProxyType(dict(self.prices)))

    def cost(self, model: str | None, usage: Usage) -> float:
        """What ``usage`` of ``model`` costs (0 for a model without a price)."""
        price = self.prices.get(model or "", self.prices.get("*"))
        return price.cost(usage) if price is not None else 0.0

    def tenant_limit(self, tenant: str) -> Limit | None:
        return self.tenants.get(tenant, self.per_tenant)

    @property
    def limited(self) -> bool:
        return self.per_session is not None or self.per_tenant is not None or bool(self.tenants)

    def over(self, tenant: str, session: Spend, of_tenant: Spend) -> str | None:
        """Why a model step may not run now (which budget, how far), or ``None``."""
        if self.per_session is not None and (why := self.per_session.over(session)):
            return f"the session's budget is spent ({why})"
        limit = self.tenant_limit(tenant)
        if limit is not None and (why := limit.over(of_tenant)):
            return f"tenant {tenant!r}'s budget is spent ({why})"
        return None
