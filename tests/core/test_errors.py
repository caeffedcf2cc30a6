"""The exception hierarchy: the tree in ``turnkit._errors``'s docstring is the real
one, every public exception is on it, and no module tells errors apart by their words.
(That every store raises the typed ``StoreError``s is the conformance suite's.)"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
from pathlib import Path

import turnkit
from turnkit import _errors

SRC = Path(turnkit.__file__).parent
#: Every package whose ``__all__`` is public API.
PUBLIC = ["turnkit", "turnkit.stores", "turnkit.testing", "turnkit.server", "turnkit.models"]
PUBLIC_OPTIONAL = ["turnkit.mcp", "turnkit.a2a", "turnkit.slack"]


def tree() -> dict[str, str | None]:
    """Each class of the docstring's tree, with the class drawn as its parent."""
    doc = _errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        found = re.match(r"^([\s│├└─]*)(\w+Error|TurnkitError)\b", line)
        if found is None:
            continue
        depth, name = len(found.group(1)), found.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def test_the_tree_draws_every_class_of_errors_under_its_real_parent() -> None:
    source = ast.parse(Path(_errors.__file__).read_text())
    defined = {n.name for n in source.body if isinstance(n, ast.ClassDef)}
    classes = {name: getattr(_errors, name) for name in defined}
    drawn = tree()
    assert sorted(drawn) == sorted(classes)
    for name, cls in classes.items():
        bases = [b.__name__ for b in cls.__bases__ if b.__name__ in classes]
        assert drawn[name] == (bases[0] if bases else None), name


def test_every_public_exception_is_named_in_the_docstring() -> None:
    doc = _errors.__doc__ or ""
    modules = [importlib.import_module(m) for m in PUBLIC]
    for name in PUBLIC_OPTIONAL:
        with contextlib.suppress(ImportError):  # an extra not installed
            modules.append(importlib.import_module(name))
    public = {
        name
        for module in modules
        for name in module.__all__
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), BaseException)
    }
    assert {"StoreError", "WriteConflictError", "SubagentError"} <= public
    assert [name for name in sorted(public) if name not in doc] == []


def test_no_module_tells_errors_apart_by_their_words() -> None:
    """``str(exc)`` (or ``exc.args``) compared, searched or matched: a message is for
    people, and rewording one must not change what the code does."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _reads_words(node):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")  # type: ignore[attr-defined]
    assert found == []


def _is_error_text(node: ast.AST) -> bool:
    """``str(exc)``, ``str(error)``, ``exc.args``…: the words of an exception."""
    names = {"exc", "error", "err", "e", "failure"}
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "str" and node.args:
        arg = node.args[0]
        return isinstance(arg, ast.Name) and arg.id in names
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "args"
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    )


def _reads_words(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return any(_is_error_text(n) for n in [node.left, *node.comparators])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in {"startswith", "endswith", "find", "index", "count"}:
            return _is_error_text(node.func.value)
        if node.func.attr in {"match", "search", "fullmatch", "findall"}:
            return any(_is_error_text(a) for a in node.args)
    return False
