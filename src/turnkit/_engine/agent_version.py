"""An agent's version: an explicit one checked, or the fingerprint a turn records.

The fingerprint hashes what the model is shown and what a replay depends on, so two
processes built from the same code agree on it without being told (see
docs/deploying.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Protocol

from .._errors import ConfigurationError
from .._seams.model import OutputSpec, ToolSpec
from .._values.policy import SurfacePolicy
from .tool_sources import ToolSource


class Fingerprinted(Protocol):
    """What the fingerprint reads of an ``Agent``."""

    @property
    def instructions(self) -> str: ...
    @property
    def source_instructions(self) -> Mapping[str, str]: ...
    @property
    def surfaces(self) -> Mapping[str, SurfacePolicy]: ...
    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]: ...
    @property
    def tool_sources(self) -> tuple[ToolSource, ...]: ...
    @property
    def output_spec(self) -> OutputSpec | None: ...
    @property
    def model(self) -> Any: ...
    @property
    def history(self) -> Any: ...


#: Longest explicit version, in characters.
MAX_VERSION_CHARS = 200


def check_version(agent_name: str, version: object) -> None:
    """An explicit ``Agent(version=...)``: a short printable string."""
    if version is None:
        return
    if (
        not isinstance(version, str)
        or not version
        or len(version) > MAX_VERSION_CHARS
        or not version.isprintable()
        or "," in version
    ):
        raise ConfigurationError(
            f"agent {agent_name!r}: version must be a non-empty printable str of at most "
            f"{MAX_VERSION_CHARS} characters without commas, got {version!r}"
        )


def fingerprint(agent: Fingerprinted) -> str:
    """A stable hash of what the model is shown and what replay depends on: the
    instructions (and per-source overlays and policies), each tool's name and input
    schema, the tool sources' keys, the typed answer's schema, the model's class and
    id, and the history policy. Descriptions and code are not part of it."""
    output = agent.output_spec
    described = {
        "instructions": agent.instructions,
        "source_instructions": dict(agent.source_instructions),
        "surfaces": {k: [v.mode, sorted(v.deny_tools)] for k, v in sorted(agent.surfaces.items())},
        "tools": sorted([s.name, s.input_schema] for s in agent.tool_specs),
        "sources": sorted(s.key for s in agent.tool_sources),
        "output": None if output is None else [output.name, output.schema],
        "model": _describe(agent.model),
        "history": _describe(agent.history),
    }
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=repr)
    return "fp-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _describe(value: Any) -> Any:
    """A value's identity that is the same in every process: its class, plus a
    dataclass's fields or a model's id (never a ``repr`` with a memory address)."""
    if value is None:
        return None
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
        return [kind, fields]
    for attribute in ("model", "model_id", "name"):
        ident = getattr(value, attribute, None)
        if isinstance(ident, str):
            return [kind, ident]
    return [kind]


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _describe(value)
