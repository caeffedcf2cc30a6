"""The package's layers, kept true by path: who may import whom, and no import cycle.

The core is ``_errors`` plus four layers, each allowed to import only those
below it: value types, seams, the engine, the runtime. Every other package sits
above it in an order of its own (``PLUGIN_LAYERS``: stores and models, channels,
access, the server, the platform channels, the command line), imports only what
is below it, and reaches into no other plug-in's private modules. Imports under
``TYPE_CHECKING`` and inside functions count like any other.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import turnkit

PACKAGE = Path(turnkit.__file__).parent

#: Each core layer, and what (besides itself) it may import from turnkit.
CORE_LAYERS: dict[str, set[str]] = {
    "_errors": set(),
    "_values": {"_errors"},
    "_seams": {"_errors", "_values"},
    "_engine": {"_errors", "_values", "_seams"},
    "_runtime": {"_errors", "_values", "_seams", "_engine"},
}
#: Outside turnkit, what the core may import: the standard library's basics,
#: pydantic (tool schemas, JSON) and jsonschema (answer schemas).
CORE_EXTERNAL = {
    "__future__",
    "abc",
    "asyncio",
    "collections",
    "contextlib",
    "dataclasses",
    "datetime",
    "functools",
    "hashlib",
    "hmac",
    "inspect",
    "itertools",
    "json",
    "jsonschema",
    "logging",
    "pydantic",
    "pydantic_core",
    "re",
    "secrets",
    "time",
    "types",
    "typing",
    "uuid",
}
#: Core modules allowed one more outside package each: a core dependency that only
#: they use, imported lazily (so ``import turnkit`` does not load it).
CORE_EXTERNAL_BY_MODULE: dict[str, set[str]] = {
    "turnkit._engine.docstrings": {"docstring_parser"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, as absolute dotted names."""
    here = module_name(path).split(".")
    base = here if is_package(path) else here[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # ``from . import sub`` imports the module ``sub``, not the package's body.
            submodules = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
            yield from submodules
            if len(submodules) < len(node.names):
                yield target


def _exists(module: str) -> bool:
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts) if parts else PACKAGE
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "turnkit" else None


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_private_root_module_belongs_to_a_layer() -> None:
    loose = [p.name for p in PACKAGE.glob("_*.py") if p.stem not in {*CORE_LAYERS, "__init__"}]
    assert loose == [], f"private modules outside any layer package: {loose}"


def test_core_layers_import_only_the_layers_below_them() -> None:
    for path in sources():
        layer = layer_of(module_name(path))
        if layer not in CORE_LAYERS:
            continue
        allowed = CORE_LAYERS[layer] | {layer}
        for target in imports(path):
            if target.split(".")[0] == "turnkit":
                assert layer_of(target) in allowed, f"{module_name(path)} imports {target}"
            else:
                allowed_outside = CORE_EXTERNAL | CORE_EXTERNAL_BY_MODULE.get(
                    module_name(path), set()
                )
                assert target.split(".")[0] in allowed_outside, (
                    f"{module_name(path)} imports {target}"
                )


#: What the core's layers are, as a set a plug-in may import whole.
CORE = set(CORE_LAYERS)
#: Every other package (or module) at the top of turnkit, and what it may import
#: from turnkit besides itself: the plug-ins' order, bottom up (docs/architecture.md
#: draws it). ``turnkit`` is the root package's ``__init__``.
PLUGIN_LAYERS: dict[str, set[str]] = {
    "stores": {"_errors", "_values", "_seams"},
    "models": {"_errors", "_values", "_seams"},
    "crypto": {"_errors", "_values", "_seams"},
    "otel": {"_errors", "_values", "_seams"},
    "cron": {"_errors", "_values", "_seams"},
    "_channels": CORE,
    "_assembly": CORE,
    "turnkit": CORE | {"_channels", "_assembly"},
    "testing": CORE | {"models", "stores"},
    "examples": {"turnkit", "testing"},
    "_access": CORE | {"_channels"},
    "server": CORE | {"_channels", "_access"},
    "slack": CORE | {"_channels", "_access", "server"},
    "mcp": CORE | {"_channels", "_access", "server"},
    "a2a": CORE | {"_channels", "_access", "server"},
    "cli": CORE
    | {"_channels", "_assembly", "_access", "stores", "models", "otel", "server", "slack"},
}


def package_of(module: str) -> str:
    """The top-level package (or module) of ``turnkit`` a module belongs to."""
    return layer_of(module) or "turnkit"


def test_every_package_has_a_place_in_the_layers() -> None:
    tops = {package_of(module_name(path)) for path in sources()}
    assert tops == set(CORE_LAYERS) | set(PLUGIN_LAYERS)


def test_plugins_import_only_the_packages_below_them() -> None:
    for path in sources():
        here = package_of(module_name(path))
        if here in CORE_LAYERS:
            continue
        allowed = PLUGIN_LAYERS[here] | {here}
        for target in imports(path):
            if target.split(".")[0] == "turnkit":
                there = package_of(target)
                assert there in allowed, f"{module_name(path)} imports {target}"


def test_no_package_reaches_into_another_plugins_private_modules() -> None:
    """Between plug-ins, only public names: ``turnkit.server.frontend``, never
    ``turnkit.server._story``. (The core's private layers, ``_access`` and
    ``_channels`` are layers of their own, imported by path like any layer.)"""
    for path in sources():
        here = package_of(module_name(path))
        for target in imports(path):
            parts = target.split(".")
            if parts[0] != "turnkit" or len(parts) < 3 or package_of(target) == here:
                continue
            if parts[1].startswith("_"):
                continue
            private = [p for p in parts[2:] if p.startswith("_")]
            assert not private, f"{module_name(path)} imports {target}"


def test_the_packages_import_each_other_in_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in sources():
        here = package_of(module_name(path))
        targets = {package_of(t) for t in imports(path) if t.split(".")[0] == "turnkit"}
        graph.setdefault(here, set()).update(targets - {here})
    cycle = _find_cycle(graph)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_the_package_has_no_import_cycle() -> None:
    """No module reaches itself through its imports, ``TYPE_CHECKING`` ones and
    imports inside functions included (a package's own ``__init__`` re-exporting its
    modules is not a cycle through them)."""
    graph: dict[str, set[str]] = {}
    for path in sources():
        here = module_name(path)
        graph[here] = {t for t in imports(path) if t.split(".")[0] == "turnkit" and t != here}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that ends where it starts, or ``None``
    (a depth-first walk; ``done`` holds modules already shown to reach no cycle)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                done.add(path.pop())
            elif step in path:
                return [*path[path.index(step) :], step]
            elif step not in done and step in graph:
                path.append(step)
                stack.append(iter(sorted(graph[step])))
    return None


#: The psycopg modules its documentation describes (``pq.abc`` holds the libpq
#: wrapper's types), and its pool: what the PostgreSQL store may import.
PSYCOPG_PUBLIC = {
    "psycopg",
    "psycopg.conninfo",
    "psycopg.errors",
    "psycopg.pq",
    "psycopg.pq.abc",
    "psycopg.sql",
    "psycopg_pool",
}


def test_the_postgres_store_uses_only_psycopgs_documented_modules() -> None:
    for path in sources():
        for target in _psycopg_imports(path):
            assert target in PSYCOPG_PUBLIC, f"{module_name(path)} imports {target}"


def _psycopg_imports(path: Path) -> Iterator[str]:
    """The psycopg modules ``path`` imports (``from psycopg import generators`` is
    the module ``psycopg.generators``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0].startswith("psycopg"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psycopg"):
            module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                yield submodule if _is_module(submodule) else module


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


POSTGRES = PACKAGE / "stores" / "postgres"


def test_only_the_wire_module_touches_libpqs_connection() -> None:
    """``conn.pgconn`` (psycopg's libpq wrapper) is used in ``_wire`` alone."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == POSTGRES / "_wire.py":
            continue
        tree = ast.parse(path.read_text())
        touching = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "pgconn"
        ]
        assert not touching, f"{module_name(path)} touches .pgconn at lines {touching}"


def test_the_postgres_modules_share_no_underscore_names() -> None:
    """What one module of the package gives another is public in it; a leading
    underscore means the module's own."""
    for path in sorted(POSTGRES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module_name(path)} imports {private} from .{node.module}"


def _own_names(tree: ast.Module) -> set[str]:
    """Every name a module defines: its functions, classes and their attributes
    (assigned to ``self.``, in a class body or listed in ``__slots__``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # a __slots__ entry
    return names


def test_the_postgres_modules_reach_into_no_underscore_attributes_of_others() -> None:
    """An object made in one module of the package is used by another through its
    public attributes only: ``obj._name`` names something of the module's own."""
    for path in sorted(POSTGRES.glob("*.py")):
        tree = ast.parse(path.read_text())
        own = _own_names(tree)
        foreign = sorted(
            f"{node.attr} (line {node.lineno})"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in own
        )
        assert not foreign, f"{module_name(path)} reaches into {foreign}"
