"""The suite's own rules, kept by reading its source: tests sit in their layer's
folder under unique names, and nothing waits by sleeping.

A wait is ``eventually`` / ``eventually_blocking`` (``tests/support/eventually.py``):
a condition with a deadline. A sleep that is not a wait (a tool's simulated work,
a fake clock, a window in which a wrong outcome would show) says so on its line
with ``# not a wait: <why>``; any other sleep fails here, and so does a ``while``
loop that sleeps between its checks (unless its own line says why it is no wait:
a ticker, say).
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

from suite_paths import TESTS

#: Where tests live: one folder per layer (CONTRIBUTING.md's table).
LAYERS = {"core", "stores", "models", "channels", "server", "cli", "project"}
#: The folders that hold no tests of their own.
SUPPORT = {"support", "children", "fakes", "fixtures", "js"}
#: The one module allowed to sleep between checks: the helper itself.
HELPER = TESTS / "support" / "eventually.py"
SLEEPS = {("time", "sleep"), ("asyncio", "sleep"), ("anyio", "sleep"), ("trio", "sleep")}
MARK = "# not a wait:"


def python_files() -> Iterator[Path]:
    """Every Python file of the suite, the agent folders in ``fixtures`` left out
    (they are the code under test, not the suite)."""
    for path in sorted(TESTS.rglob("*.py")):
        parts = path.relative_to(TESTS).parts
        if parts[0] not in {"fixtures", "js"} and "node_modules" not in parts:
            yield path


def sleep_calls(tree: ast.AST) -> Iterator[ast.Call]:
    """Calls of ``time.sleep``, ``asyncio.sleep``, … (as ``module.sleep``)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in SLEEPS
        ):
            yield node


def comments(source: str) -> dict[int, str]:
    """Each line's comment, by line number."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string
    return found


def explained(call: ast.Call, said: dict[int, str]) -> bool:
    """Whether a line of ``call`` carries ``# not a wait:`` with a reason after it."""
    last = call.end_lineno or call.lineno
    for line in range(call.lineno, last + 1):
        comment = said.get(line, "")
        if comment.startswith(MARK) and comment[len(MARK) :].strip():
            return True
    return False


def own_body(loop: ast.While) -> Iterator[ast.AST]:
    """The nodes of ``loop``'s body, not those of functions defined in it."""
    stack: list[ast.AST] = [*loop.body, *loop.orelse]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def violations(path: Path) -> list[tuple[int, str]]:
    """``(line, what is wrong)`` for each unmarked sleep and each polling loop."""
    source = path.read_text()
    if "sleep" not in source:
        return []  # (most files: nothing to parse for)
    tree = ast.parse(source)
    said = comments(source)
    sleeps = list(sleep_calls(tree))
    found = [
        (call.lineno, f"a sleep not marked '{MARK} <why>': wait with eventually")
        for call in sleeps
        if not explained(call, said)
    ]
    sleeping = set(sleeps)
    loops = [
        loop
        for loop in ast.walk(tree)
        if isinstance(loop, ast.While) and not said.get(loop.lineno, "").startswith(MARK)
    ]
    found += [
        (loop.lineno, "a while loop that sleeps between checks: eventually")
        for loop in loops
        if any(node in sleeping for node in own_body(loop))
    ]
    return sorted(found)


def test_nothing_waits_by_sleeping() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{line}: {what}"
        for path in python_files()
        if path != HELPER
        for line, what in violations(path)
    ]
    assert found == [], "\n".join(found)


def test_the_rule_catches_a_bare_sleep_and_a_polling_loop(tmp_path: Path) -> None:
    """The check itself can fail: a sleep without a reason and a loop polling with a
    sleep are found, even when the sleep in the loop says why; a sleep that says why
    and polls nothing is not, nor a loop whose own line says why."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import asyncio, time\n"
        "async def f(done):\n"
        "    await asyncio.sleep(0.2)\n"
        "    while not done():\n"
        "        time.sleep(0.01)  # not a wait: the work\n"
        "    await asyncio.sleep(1)  # not a wait:\n"
        "    await asyncio.sleep(0)  # not a wait: a step of the fake clock\n"
        "    while True:  # not a wait: a ticker\n"
        "        await asyncio.sleep(0.01)  # not a wait: one tick\n"
    )
    assert [line for line, _ in violations(sample)] == [3, 4, 6]


def test_tests_sit_in_a_layer_folder_under_unique_names() -> None:
    """Every test module is in one of the layer folders, none at the top or among
    the support files; and module basenames are unique, as every folder is on the
    import path (pyproject's ``pythonpath``)."""
    misplaced = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if "node_modules" not in path.parts and path.relative_to(TESTS).parts[0] not in LAYERS
    ]
    assert misplaced == [], f"test modules outside a layer folder ({sorted(LAYERS)}): {misplaced}"
    names: dict[str, list[str]] = {}
    for path in python_files():
        if path.parent != TESTS and path.relative_to(TESTS).parts[0] != "fakes":
            names.setdefault(path.stem, []).append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert twice == {}, f"module names used twice: {twice}"


def test_the_layer_folders_are_the_import_path() -> None:
    """pyproject's ``pythonpath`` names every layer and support folder, so a module
    imports a neighbour's helpers the same way from any folder and in any order."""
    import tomllib

    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["pytest"]["ini_options"]["pythonpath"])
    folders = {f"tests/{name}" for name in LAYERS | {"support", "children"}}
    assert folders <= listed, sorted(folders - listed)
    present = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert present <= LAYERS | SUPPORT, (
        f"a folder in tests/ that is no layer: {present - LAYERS - SUPPORT}"
    )


def cross_layer_imports(path: Path, layer_of: dict[str, str]) -> list[str]:
    """The test modules of other layers that ``path`` imports from (by module name)."""
    own = path.relative_to(TESTS).parts[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        found += [n for n in names if layer_of.get(n, own) != own]
    return found


def test_a_layer_shares_helpers_through_support_not_through_its_test_modules() -> None:
    """A helper that tests of two layers use lives in ``tests/support``: a test module
    never imports another layer's test module (which would also run that module's
    import-time skips, and tie one layer's tests to another's)."""
    layer_of = {
        p.stem: p.relative_to(TESTS).parts[0]
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] in LAYERS
    }
    found = [
        f"{path.relative_to(TESTS)} imports {name}"
        for path in python_files()
        if path.relative_to(TESTS).parts[0] in LAYERS
        for name in cross_layer_imports(path, layer_of)
    ]
    assert found == [], "\n".join(found)
