"""The public surface: a curated, sorted ``__all__`` and a core that imports no plug-in."""

from __future__ import annotations

import ast
from pathlib import Path

import turnkit
import turnkit.stores
import turnkit.testing

PACKAGE = Path(turnkit.__file__).parent
#: Modules that make up the engine's core: they may import only each other,
#: the standard library's basics, and pydantic.
CORE = [
    "_agent.py",
    "_context.py",
    "_engine.py",
    "_errors.py",
    "_events.py",
    "_inbound.py",
    "_messages.py",
    "_model.py",
    "_position.py",
    "_runtime.py",
    "_store.py",
    "_tool_results.py",
    "_tool_call.py",
    "_model_call.py",
    "_turns.py",
    "_observe.py",
    "_tools.py",
    "_inputs.py",
    "_approvals.py",
    "_policy.py",
]
ALLOWED_EXTERNAL = {
    "__future__",
    "asyncio",
    "collections",
    "contextlib",
    "dataclasses",
    "hashlib",
    "hmac",
    "json",
    "jsonschema",
    "secrets",
    "inspect",
    "itertools",
    "logging",
    "re",
    "time",
    "types",
    "typing",
    "uuid",
    "pydantic",
    "pydantic_core",
}


def test_all_is_sorted_and_complete() -> None:
    for module in (turnkit, turnkit.stores, turnkit.testing):
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_core_modules_import_only_core_and_basics() -> None:
    for filename in CORE:
        tree = ast.parse((PACKAGE / filename).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = (node.module or "").split(".")[0]
                assert f"{target}.py" in CORE, f"{filename} imports .{node.module}"
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] in ALLOWED_EXTERNAL, (
                    filename,
                    node.module,
                )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in ALLOWED_EXTERNAL, (filename, alias.name)


def test_package_ships_type_information() -> None:
    assert (PACKAGE / "py.typed").exists()
