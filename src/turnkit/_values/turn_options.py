"""``TurnOptions``: how a turn starts, beside its text, as one value.

Every call that starts a turn (``start``, ``submit``, ``turn``, ``turn_output``,
a channel's ``run_stream``, …) takes these, either as one ``TurnOptions`` or as
the same names given as keywords (``TurnKeywords``), and checks them here once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypedDict

from .._errors import ConfigurationError
from .inbound import InboundEvent, Proactive
from .tenancy import DEFAULT_TENANT, check_tenant
from .text import unstorable


@dataclass(frozen=True, kw_only=True)
class TurnOptions:
    """What a new turn carries beside its text.

    ``event``: the inbound event it answers (its source picks the policy), or
    ``trigger``: who started a turn nobody typed, never both. ``replace``: cancel
    the session's unfinished turns first (reason ``replaced``; never a parked
    approval). ``turn_id``: the turn's id; an id the store already has makes the
    call a retry or a redelivery of that turn. ``owner``: the principal whose
    session it must be (a new session becomes theirs; another's refuses the turn).
    ``tenant``: whose fair share, caps and budget it counts against
    (docs/tenants.md); ``None`` is the default tenant.
    """

    event: InboundEvent | None = None
    trigger: Proactive | None = None
    replace: bool = False
    turn_id: str | None = None
    owner: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.event is not None and not isinstance(self.event, InboundEvent):
            raise TypeError(f"event must be an InboundEvent, got {type(self.event).__name__}")
        if self.trigger is not None and not isinstance(self.trigger, Proactive):
            raise TypeError(f"trigger must be a Proactive, got {type(self.trigger).__name__}")
        if self.event is not None and self.trigger is not None:
            raise ConfigurationError("a turn has either an inbound event or a trigger, not both")
        if not isinstance(self.replace, bool):
            raise ConfigurationError(f"replace must be a bool, got {self.replace!r}")
        for name, value in (("turn_id", self.turn_id), ("owner", self.owner)):
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"{name} must be a non-empty str or None, got {value!r}")
            if (bad := unstorable(value)) is not None:
                raise ConfigurationError(f"{name} {value!r} contains {bad}")
        if self.tenant is not None:
            check_tenant(self.tenant)

    @property
    def tenant_key(self) -> str:
        """The tenant the turn is stored under: the one given, or the default."""
        return DEFAULT_TENANT if self.tenant is None else self.tenant


class TurnKeywords(TypedDict, total=False):
    """``TurnOptions``'s fields as keywords of the calls that start turns."""

    event: InboundEvent | None
    trigger: Proactive | None
    replace: bool
    turn_id: str | None
    owner: str | None
    tenant: str | None


_NAMES = frozenset(f.name for f in fields(TurnOptions))


def turn_options(options: TurnOptions | None, keywords: TurnKeywords) -> TurnOptions:
    """The options a call that starts a turn was given: ``options``, or its keywords
    (``ConfigurationError`` for both, ``TypeError`` for a keyword no turn takes)."""
    if options is None:
        unknown = sorted(set(keywords) - _NAMES)
        if unknown:
            raise TypeError(
                f"a turn takes no option {', '.join(map(repr, unknown))}; "
                f"it takes {', '.join(sorted(_NAMES))}"
            )
        return TurnOptions(**keywords)
    if not isinstance(options, TurnOptions):
        raise TypeError(f"options must be a turnkit.TurnOptions, got {type(options).__name__}")
    if keywords:
        raise ConfigurationError(
            "give a turn's options either as a TurnOptions or as keywords, not both "
            f"(got both, with {', '.join(sorted(keywords))})"
        )
    return options
