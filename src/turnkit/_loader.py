"""Assemble an ``Agent`` from a folder: ``agent.py``, ``instructions.md`` and ``tools/*.py``.

``agent.py`` is optional and may define ``agent = {"name": ...}``, a ``model``
and a ``demo_model()`` used when no model is configured. Every public module in
``tools/`` must define at least one ``Tool``; an import failure names its file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ._agent import Agent
from ._errors import ConfigurationError
from ._model import Model
from ._tools import Tool


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
    tools: tuple[Tool, ...]
    model: Model | None
    demo_model: Callable[[], Model] | None

    @classmethod
    def read(cls, path: str | Path) -> AgentFolder:
        folder = Path(path)
        if not folder.is_dir():
            raise ConfigurationError(f"agent folder {str(folder)!r} does not exist")
        config: dict[str, Any] = {}
        model = demo = None
        agent_py = folder / "agent.py"
        if agent_py.exists():
            module = _import_file(agent_py)
            raw = getattr(module, "agent", {})
            if not isinstance(raw, dict):
                raise ConfigurationError(f"{agent_py}: `agent` must be a dict of settings")
            config = raw
            model = getattr(module, "model", None)
            factory = getattr(module, "demo_model", None)
            demo = factory if callable(factory) else None
        instructions_md = folder / "instructions.md"
        instructions = (
            instructions_md.read_text(encoding="utf-8") if instructions_md.exists() else ""
        )
        name = config.get("name", folder.resolve().name)
        if not isinstance(name, str):
            raise ConfigurationError(f"{agent_py}: agent name must be a string")
        return cls(
            path=folder,
            name=name,
            instructions=instructions.strip(),
            tools=tuple(_read_tools(folder / "tools")),
            model=model,
            demo_model=demo,
        )

    def agent(self, model: Model | None = None) -> Agent:
        """The ``Agent``: ``model``, else the folder's ``model``, else its ``demo_model()``."""
        chosen = model or self.model or (self.demo_model() if self.demo_model else None)
        if chosen is None:
            raise ConfigurationError(
                f"agent folder {str(self.path)!r} names no model: pass load_agent(..., model=...)"
            )
        return Agent(name=self.name, model=chosen, instructions=self.instructions, tools=self.tools)


def _read_tools(tools_dir: Path) -> list[Tool]:
    if not tools_dir.is_dir():
        return []
    found: list[Tool] = []
    for path in sorted(tools_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module = _import_file(path)
        tools = [v for v in vars(module).values() if isinstance(v, Tool)]
        if not tools:
            raise ConfigurationError(f"{path}: defines no Tool (decorate a function with @tool)")
        found.extend(tools)
    return found


def load_agent(path: str | Path, *, model: Model | None = None) -> Agent:
    """Build the ``Agent`` a folder describes; ``model`` overrides the folder's own."""
    return AgentFolder.read(path).agent(model)
