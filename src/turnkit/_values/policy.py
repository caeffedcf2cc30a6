"""Per-source turn policies: what a turn from one channel may see and call.

An agent can give each inbound source (``slack``, ``email``, ``cli``…) an overlay of
instructions and a ``SurfacePolicy``. A turn resolves them once, when it opens, into
a ``TurnPolicy`` that is stored with the turn, so a replay or a resume days later
runs under the policy the turn started with, whatever the agent says by then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigurationError, MessageDecodeError
from .messages import JsonObject

SurfaceMode = Literal["append", "replace"]
_MODES = ("append", "replace")


@dataclass(frozen=True, kw_only=True)
class SurfacePolicy:
    """How turns from one source differ from the agent's default.

    ``mode="append"`` adds the source's overlay (``instructions.<source>.md``) to the
    base prompt; ``mode="replace"`` makes the overlay the whole prompt (an empty
    overlay: no prompt at all). A mode given explicitly says the overlay exists, so
    the agent refuses to assemble without it. Left unset (``None``), the overlay is
    appended if there is one and none is required: a surface that only denies
    tools. ``deny_tools`` are taken away in code: not offered to the model, and
    refused as unknown if it calls them anyway.
    """

    mode: SurfaceMode | None = None
    deny_tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in _MODES:
            raise ConfigurationError(
                f"surface mode must be 'append' or 'replace', got {self.mode!r}"
            )
        denied = self.deny_tools
        if isinstance(denied, str) or not isinstance(denied, Iterable):
            raise ConfigurationError(
                f"deny_tools must be a list of tool names, got {type(denied).__name__}"
            )
        names = tuple(denied)
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"deny_tools holds {name!r}, which is not a tool name")
        object.__setattr__(self, "deny_tools", names)

    @classmethod
    def coerce(cls, source: str, value: object) -> SurfacePolicy:
        """Accept a ``SurfacePolicy`` or its dict form (``{"mode": …, "deny_tools": […]}``)."""
        if isinstance(value, SurfacePolicy):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"mode", "deny_tools"}
            if unknown:
                raise ConfigurationError(
                    f"surface {source!r}: unknown setting(s) {sorted(unknown)}; "
                    "a surface takes 'mode' and 'deny_tools'"
                )
            try:
                return cls(mode=value.get("mode"), deny_tools=value.get("deny_tools", ()))
            except ConfigurationError as exc:
                raise ConfigurationError(f"surface {source!r}: {exc}") from None
            except TypeError:
                raise ConfigurationError(
                    f"surface {source!r}: deny_tools must be a list of tool names"
                ) from None
        raise ConfigurationError(
            f"surface {source!r} must be a SurfacePolicy or a dict, got {type(value).__name__}"
        )


@dataclass(frozen=True, kw_only=True)
class TurnPolicy:
    """What one turn runs with, resolved when it opened and stored with it."""

    source: str | None = None
    system: str | None = None
    deny_tools: frozenset[str] = field(default_factory=frozenset)

    def allows(self, tool_name: str) -> bool:
        return tool_name not in self.deny_tools

    def to_dict(self) -> JsonObject:
        return {
            "source": self.source,
            "system": self.system,
            "deny_tools": sorted(self.deny_tools),
        }

    @classmethod
    def from_dict(cls, data: Any) -> TurnPolicy:
        if not isinstance(data, dict):
            raise MessageDecodeError("turn policy: expected a JSON object")
        source, system, denied = data.get("source"), data.get("system"), data.get("deny_tools")
        if source is not None and not isinstance(source, str):
            raise MessageDecodeError("turn policy: 'source' must be a string or null")
        if system is not None and not isinstance(system, str):
            raise MessageDecodeError("turn policy: 'system' must be a string or null")
        if not isinstance(denied, list) or not all(isinstance(n, str) for n in denied):
            raise MessageDecodeError("turn policy: 'deny_tools' must be a list of strings")
        return cls(source=source, system=system, deny_tools=frozenset(denied))


def resolve_policy(
    *,
    instructions: str,
    source: str | None,
    surfaces: Mapping[str, SurfacePolicy],
    source_instructions: Mapping[str, str],
) -> TurnPolicy:
    """The policy for a turn from ``source`` (``None``: a programmatic turn)."""
    surface = surfaces.get(source) if source is not None else None
    overlay = source_instructions.get(source) if source is not None else None
    if surface is not None and surface.mode == "replace":
        system = overlay  # checked at construction: a replace surface has its overlay
    elif overlay:
        system = f"{instructions}\n\n{overlay}" if instructions else overlay
    else:
        system = instructions
    return TurnPolicy(
        source=source,
        system=system or None,
        deny_tools=frozenset(surface.deny_tools) if surface is not None else frozenset(),
    )
