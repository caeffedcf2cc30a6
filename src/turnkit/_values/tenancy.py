"""Tenants: whose turn a turn is, and how many of one tenant's sessions may run at once.

A tenant is a plain string the app chooses (a customer id); ``""`` is the default
tenant every turn has unless given another. ``Concurrency`` caps how many sessions
of one tenant run at once across every process that claims from the store (see
docs/tenants.md): on PostgreSQL the cap is enforced by the claim statement itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import ConfigurationError

#: The tenant of a turn nobody gave one.
DEFAULT_TENANT = ""
#: Longest tenant key, in characters (it is an index key on every turn).
MAX_TENANT_CHARS = 200


def check_tenant(tenant: object) -> str:
    """``tenant`` if it is a usable tenant key, else a ``ConfigurationError``."""
    if not isinstance(tenant, str):
        raise ConfigurationError(f"tenant must be a str, got {type(tenant).__name__}")
    if len(tenant) > MAX_TENANT_CHARS or "\x00" in tenant:
        raise ConfigurationError(
            f"tenant must be at most {MAX_TENANT_CHARS} characters with no NUL, got {tenant!r}"
        )
    return tenant


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Concurrency:
    """How many sessions may run at once, per tenant and per session.

    ``per_tenant``: at most this many of one tenant's sessions run at once across
    every worker of the store (``None``: no cap); ``tenants`` overrides it for the
    tenants named. ``per_session`` is always 1: a session's turns run one at a time,
    in order (it is here so a reader of the configuration sees it said).
    Every worker of a store must be given the same caps: each claim enforces the
    caps its own worker was given."""

    per_tenant: int | None = None
    per_session: int = 1
    tenants: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.per_tenant is not None:
            _positive("Concurrency.per_tenant", self.per_tenant)
        if self.per_session != 1:
            raise ConfigurationError(
                f"Concurrency.per_session must be 1 (a session's turns run one at a time, "
                f"in order), got {self.per_session!r}"
            )
        if not isinstance(self.tenants, Mapping):
            raise ConfigurationError(
                f"Concurrency.tenants must be a mapping of tenant to cap, got {self.tenants!r}"
            )
        for tenant, cap in self.tenants.items():
            check_tenant(tenant)
            _positive(f"Concurrency.tenants[{tenant!r}]", cap)
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))

    def cap(self, tenant: str) -> int | None:
        """How many of ``tenant``'s sessions may run at once (``None``: no cap)."""
        return self.tenants.get(tenant, self.per_tenant)

    @property
    def capped(self) -> bool:
        """Whether any tenant has a cap."""
        return self.per_tenant is not None or bool(self.tenants)


#: No caps: every tenant's sessions run as workers free up, fairly.
UNCAPPED = Concurrency()
