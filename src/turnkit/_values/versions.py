"""A turn meeting another agent version: what the delivery knows, what the app decides.

A turn records the agent version it runs under (``TurnRecord.version``). When a
delivery of another version takes it on (a resume, a recovery, a redelivery), the
engine checks the turn's recorded tool calls against the new version and asks the
agent's ``on_version_change`` hook, if it has one, what to do; these are the values
that pass between them. See docs/deploying.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from .._errors import ConfigurationError
from .messages import JsonObject, ToolCall


@dataclass(frozen=True, kw_only=True)
class VersionChange:
    """A stored turn of version ``from_version`` that a delivery of ``to_version``
    is about to run. ``calls`` are the turn's tool calls so far, in order; ``owed``
    the ones whose result is not stored yet (they run next); ``problems`` what the
    check of ``calls`` against the new version found (a tool gone, arguments the new
    input schema refuses): empty when the versions are compatible for this turn."""

    session_id: str
    turn_id: str
    agent: str
    from_version: str
    to_version: str
    calls: tuple[ToolCall, ...] = ()
    owed: tuple[ToolCall, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def compatible(self) -> bool:
        """Whether nothing the turn recorded conflicts with the new version."""
        return not self.problems

    def rewrite(self, call_id: str, *, name: str, input: JsonObject) -> Rewrite:
        """A ``Rewrite`` running owed call ``call_id`` as tool ``name`` with ``input``."""
        return Rewrite(calls={call_id: ToolCall(id=call_id, name=name, input=dict(input))})


@dataclass(frozen=True)
class Rewrite:
    """The hook's migration: run these owed calls instead of the recorded ones, by
    call id (the replacement keeps the call's id, so its result answers the model's
    call). Stored with the turn, so every later delivery runs the same rewrite."""

    calls: Mapping[str, ToolCall] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.calls, Mapping):
            raise ConfigurationError("Rewrite(calls=...) must map call ids to ToolCall values")
        for key, call in self.calls.items():
            if not isinstance(call, ToolCall) or call.id != key:
                raise ConfigurationError(
                    f"Rewrite: the call for {key!r} must be a ToolCall with id {key!r}, "
                    f"got {call!r}"
                )
        object.__setattr__(self, "calls", MappingProxyType(dict(self.calls)))

    def to_dict(self) -> JsonObject:
        return {"calls": {k: c.to_dict() for k, c in self.calls.items()}}

    @classmethod
    def from_dict(cls, data: object) -> Rewrite:
        calls = data.get("calls") if isinstance(data, dict) else None
        if not isinstance(calls, dict):
            return cls()
        return cls(calls={k: ToolCall.from_dict(v) for k, v in calls.items()})


#: What ``on_version_change`` returns: go on, hold the turn parked, or migrate it.
VersionDecision: TypeAlias = Literal["continue", "refuse"] | Rewrite
#: ``Agent(on_version_change=...)``: a plain or ``async`` function of the change.
VersionHook: TypeAlias = Callable[[VersionChange], VersionDecision | Awaitable[VersionDecision]]
