"""Rate limits on model calls: at most so many requests, and so many tokens, to one
model in any sliding window (a minute unless given another), across every process
that shares the store (docs/tenants.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigurationError

#: The prefix of the timer a model step waits on when its model's limit is reached.
RATE_PREFIX = "rate:"
#: Seconds a request counts past its window, so requests whose travel to the provider
#: takes a few milliseconds more or less than another's still keep to the limit
#: there, not only here.
RATE_SLACK = 0.1
#: Seconds after which a call never reported done (its process died during it) stops
#: counting as in flight.
RATE_STALE = 600.0


def rate_wait_id(step_id: str, n: int) -> str:
    return f"{RATE_PREFIX}{step_id}:{n}"


@dataclass(frozen=True)
class RateLimit:
    """At most ``requests_per_minute`` calls, and ``tokens_per_minute`` tokens (input
    plus output, counted when each call reports them), to ``model`` (its adapter's
    ``model`` name; ``"*"``: any model without a limit of its own) in any sliding
    ``window`` seconds (60: a minute; shorter in tests). ``None``: no limit of that
    kind."""

    model: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigurationError(f"RateLimit.model must be a non-empty str, got {self.model!r}")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"RateLimit.{name} must be an int >= 1, got {value!r}")
        window = self.window
        if isinstance(window, bool) or not isinstance(window, int | float) or not window > 0:
            raise ConfigurationError(f"RateLimit.window must be seconds > 0, got {window!r}")
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ConfigurationError(
                "a RateLimit needs requests_per_minute, tokens_per_minute or both"
            )

    @property
    def key(self) -> str:
        """What the store keeps this limit's log under."""
        return f"model/{self.model}"
