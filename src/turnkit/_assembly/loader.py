"""Assemble an ``Agent`` from a folder.

::

    app/agent/
      agent.py                # optional: `agent = {...}` or `agent = AgentConfig(...)`
      instructions.md         # the base system prompt
      instructions.slack.md   # an overlay for turns whose source is "slack"
      tools/*.py              # each public module defines at least one Tool

A folder must hold at least one of ``agent.py``, ``instructions.md`` or a tool
module. ``agent.py`` may also define a ``model`` and a ``demo_model()`` used when no
model is configured. Every error names the file at fault (docs/agent-folders.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from .._engine.agent import Agent
from .._engine.history import HistoryPolicy
from .._engine.limits import Limits
from .._engine.tool_sources import ToolSource
from .._engine.tools import Tool
from .._errors import ConfigurationError
from .._seams.model import Model
from .._values.inputs import AuthorizeAnswer
from .._values.policy import SurfacePolicy


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """The settings ``agent.py`` may give, as ``agent = AgentConfig(...)`` or the same
    keys in a dict. Unset ones take the folder's defaults (its name, no limits)."""

    name: str | None = None
    surfaces: Mapping[str, SurfacePolicy | Mapping[str, Any]] = field(default_factory=dict)
    authorize_answer: AuthorizeAnswer | None = None
    max_steps: int | None = None
    max_parallel_tools: int = 4
    #: ``Limits`` or its keys as a dict (``{"tool_calls": 20, "tokens": 200_000}``).
    limits: Limits | Mapping[str, Any] | None = None
    #: A history policy (``LastTurns(20)``, ``TokenBudget(...)``, ...); a Python
    #: object, so ``agent.py`` builds it.
    history: HistoryPolicy | None = None
    #: The type the final answer must fit (a pydantic model, dataclass or TypedDict).
    output_type: type[Any] | None = None
    output_retries: int = 1
    #: More tools, beside the ``tools/`` folder's: ``Tool``s and tool sources (an MCP
    #: server's, ``turnkit.mcp.mcp_tools(...)``), built in ``agent.py``.
    tools: Sequence[Tool | ToolSource] = ()

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ConfigurationError(f"agent name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.surfaces, Mapping):
            raise ConfigurationError(
                "surfaces must be a dict keyed by source, like "
                f"{{'slack': {{'deny_tools': [...]}}}}, got {type(self.surfaces).__name__}"
            )
        if isinstance(self.tools, str | bytes) or not isinstance(self.tools, Sequence):
            raise ConfigurationError(
                f"tools must be a list of Tools and tool sources, got {type(self.tools).__name__}"
            )
        for item in self.tools:
            if not isinstance(item, Tool | ToolSource):
                raise ConfigurationError(
                    f"tools holds {item!r}, which is neither a Tool (@tool) nor a tool "
                    "source (turnkit.mcp.mcp_tools(...))"
                )
        if self.authorize_answer is not None and not callable(self.authorize_answer):
            raise ConfigurationError(
                f"authorize_answer must be an async function, got {self.authorize_answer!r}"
            )

    @classmethod
    def coerce(cls, value: object, where: Path) -> AgentConfig:
        if isinstance(value, AgentConfig):
            return value
        if not isinstance(value, Mapping):
            raise ConfigurationError(
                f"{where}: `agent` must be an AgentConfig or a dict of settings, "
                f"got {type(value).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown agent setting(s) {unknown}; known: {sorted(known)}"
            )
        try:
            return cls(**value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None


def _import_file(path: Path) -> ModuleType:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"turnkit_app_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ConfigurationError(f"{path}: failed to import: {type(exc).__name__}: {exc}") from exc
    return module


@dataclass(frozen=True, kw_only=True)
class AgentFolder:
    """What an agent folder declares, before a model is chosen."""

    path: Path
    name: str
    instructions: str
    tools: tuple[Tool | ToolSource, ...]
    model: Model | None
    demo_model: Callable[[], Model] | None
    config: AgentConfig = field(default_factory=AgentConfig)
    #: ``instructions.<source>.md`` overlays, keyed by source.
    source_instructions: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path) -> AgentFolder:
        folder = Path(path)
        _check_folder(folder)
        config = AgentConfig()
        model = demo = None
        agent_py = folder / "agent.py"
        if agent_py.exists():
            module = _import_file(agent_py)
            # Every error coerce raises names agent_py already.
            config = AgentConfig.coerce(getattr(module, "agent", {}), agent_py)
            model = getattr(module, "model", None)
            factory = getattr(module, "demo_model", None)
            demo = factory if callable(factory) else None
        instructions_md = folder / "instructions.md"
        instructions = _read_text(instructions_md) if instructions_md.exists() else ""
        name = config.name if config.name is not None else folder.resolve().name
        if not isinstance(name, str):
            raise ConfigurationError(f"{agent_py}: agent name must be a string")
        return cls(
            path=folder,
            name=name,
            instructions=instructions.strip(),
            tools=tuple(_read_tools(folder / "tools")) + tuple(config.tools),
            model=model,
            demo_model=demo,
            config=config,
            source_instructions=_read_overlays(folder),
        )

    def agent(self, model: Model | None = None) -> Agent:
        """The ``Agent``: ``model``, else the folder's ``model``, else its ``demo_model()``."""
        chosen = model or self.model or (self.demo_model() if self.demo_model else None)
        if chosen is None:
            raise ConfigurationError(
                f"agent folder {str(self.path)!r} names no model: pass load_agent(..., model=...)"
            )
        try:
            return Agent(
                name=self.name,
                model=chosen,
                instructions=self.instructions,
                tools=self.tools,
                surfaces=dict(self.config.surfaces),  # type: ignore[arg-type]  # coerced
                source_instructions=self.source_instructions,
                authorize_answer=self.config.authorize_answer,
                max_steps=self.config.max_steps,
                max_parallel_tools=self.config.max_parallel_tools,
                limits=_limits(self.config.limits),
                history=self.config.history,
                output_type=self.config.output_type,
                output_retries=self.config.output_retries,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"agent folder {str(self.path)!r}: {exc}") from None


def _limits(value: Limits | Mapping[str, Any] | None) -> Limits:
    if value is None:
        return Limits()
    if isinstance(value, Limits):
        return value
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"limits must be a Limits or a dict, got {value!r}")
    known = {f.name for f in fields(Limits)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigurationError(f"unknown limit(s) {unknown}; known: {sorted(known)}")
    return Limits(**value)


def _check_folder(folder: Path) -> None:
    """Refuse a path that is not a folder, and a folder that holds no agent: an empty
    folder (or the wrong one) must not quietly become an agent with no prompt."""
    shown = repr(str(folder))
    if not folder.exists():
        raise ConfigurationError(f"agent folder {shown} does not exist")
    if not folder.is_dir():
        raise ConfigurationError(
            f"agent folder {shown} is not a folder; name the folder that holds agent.py, "
            "instructions.md or tools/"
        )
    holds_agent = (
        (folder / "agent.py").is_file()
        or (folder / "instructions.md").is_file()
        or any(not p.name.startswith("_") for p in (folder / "tools").glob("*.py"))
    )
    if not holds_agent:
        raise ConfigurationError(
            f"{shown} holds no agent: an agent folder has an agent.py, an instructions.md "
            "or a tools/ folder of tool modules (see docs/agent-folders.md)"
        )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot be read as UTF-8 text: {exc}") from None


def _read_overlays(folder: Path) -> dict[str, str]:
    """``instructions.<source>.md`` files, keyed by ``<source>``."""
    overlays: dict[str, str] = {}
    for path in sorted(folder.glob("instructions.*.md")):
        source = path.name[len("instructions.") : -len(".md")]
        if not source or "." in source:
            raise ConfigurationError(
                f"{path}: an overlay is named instructions.<source>.md with one source name"
            )
        overlays[source] = _read_text(path).strip()
    return overlays


def _read_tools(tools_dir: Path) -> list[Tool | ToolSource]:
    """Every module's tools: those named in its ``__all__`` if it has one, else every
    ``Tool`` and tool source (``mcp_tools(...)``) it holds. The same object seen twice
    (an alias, an import from a sibling module) counts once; two different tools with
    one name are an error naming both files (sources name their tools when a turn
    opens, where a clash fails the turn).
    """
    if not tools_dir.is_dir():
        return []
    found: dict[str, tuple[Tool, Path]] = {}
    sources: list[ToolSource] = []
    for path in sorted(tools_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module = _import_file(path)
        exported = getattr(module, "__all__", None)
        names = list(exported) if exported is not None else list(vars(module))
        values = [getattr(module, n, None) for n in names]
        tools = [v for v in values if isinstance(v, Tool)]
        held = [v for v in values if isinstance(v, ToolSource) and not isinstance(v, Tool)]
        if not tools and not held:
            raise ConfigurationError(
                f"{path}: defines no Tool (decorate a function with @tool) and no tool "
                "source (such as turnkit.mcp.mcp_tools(...))"
            )
        sources += [v for v in held if all(v is not s for s in sources)]
        for t in tools:
            seen = found.get(t.name)
            if seen is None:
                found[t.name] = (t, path)
            elif seen[0] is not t:
                raise ConfigurationError(
                    f"two tools are named {t.name!r}: one in {seen[1]}, one in {path}"
                )
    return [*(t for t, _ in found.values()), *sources]


def load_agent(path: str | Path, *, model: Model | None = None) -> Agent:
    """Build the ``Agent`` a folder describes; ``model`` overrides the folder's own."""
    return AgentFolder.read(path).agent(model)
