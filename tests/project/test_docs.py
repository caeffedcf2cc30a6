"""Every Python example in the README and docs/ runs, so the docs cannot rot.

A block runs whatever its fence calls Python (``python``, ``py``, ``python3``), and
runs twice in one temporary working directory: an example must not trip over what
its own earlier run left behind (a database file, a table). A fence in a language
this test does not know fails it, so no Python block hides under a new spelling.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest
from suite_paths import ROOT

from turnkit import TurnEvent

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Fence languages that are Python: every such block is run.
PYTHON = {"python", "py", "python3"}
#: Fence languages that are not Python (shell sessions, output, file trees, data, SQL,
#: the React examples of docs/frontends.md).
NOT_PYTHON = {"", "sh", "text", "json", "sql", "tsx"}
FENCE = re.compile(r"^\s*```(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, dedented to their fence."""
    found: list[Block] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None:
            if fence is not None:
                info = fence.group("info").strip()
                opened = (number, info.split()[0] if info else "")
                body = []
        elif fence is not None and not fence.group("info").strip():
            start, language = opened
            code = textwrap.dedent("\n".join(body)) + "\n"
            found.append(Block(path, start, language.lower(), code))
            opened = None
        else:
            body.append(line)
    assert opened is None, f"{path.name}:{opened[0]}: a fence is never closed"
    return found


ALL_BLOCKS = [block for path in DOCS for block in blocks(path)]
EXAMPLES = [
    pytest.param(block, id=f"{block.path.name}:{block.line}")
    for block in ALL_BLOCKS
    if block.language in PYTHON
]


@pytest.mark.parametrize("block", EXAMPLES)
def test_example_runs_twice(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples may create files such as calc.db
    compiled = compile(block.code, f"{block.path.name}:{block.line}", "exec")
    for _ in range(2):
        exec(compiled, {"__name__": "__doc_example__"})


def test_every_fence_is_python_or_known_not_to_be() -> None:
    unknown = [
        f"{b.path.name}:{b.line} ```{b.language}"
        for b in ALL_BLOCKS
        if b.language not in PYTHON | NOT_PYTHON
    ]
    assert unknown == []


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 15
    assert {b.language for b in ALL_BLOCKS if b.language in PYTHON} >= {"python"}


def test_the_readme_names_every_event_type_and_links_the_table() -> None:
    # "unknown" is how this version holds a type a newer one logged: no wire type.
    types = [cls.__dataclass_fields__["type"].default for cls in get_args(TurnEvent)]
    types.remove("unknown")
    readme = (ROOT / "README.md").read_text()
    missing = [t for t in types if f"`{t}`" not in readme]
    assert missing == []
    assert "docs/server.md#the-events" in readme
    table = (ROOT / "docs" / "server.md").read_text().split("### The events", 1)[1]
    rows = re.findall(r"^\| `([a-z]+\.[a-z_.]+)` \|", table, re.MULTILINE)
    assert sorted(rows) == sorted(types)


def _packages() -> list[str]:
    """Every package and public module at the top of ``src/turnkit``, as the layer
    maps name them: ``stores/``, ``_values/``, ``crypto``, ``_errors``."""
    source = ROOT / "src" / "turnkit"
    packages = [f"{p.parent.name}/" for p in source.glob("*/__init__.py")]
    modules = [p.stem for p in source.glob("*.py") if p.stem != "__init__"]
    return sorted(packages + modules)


def test_the_layer_maps_name_every_package() -> None:
    """architecture.md's diagram and CONTRIBUTING.md's table: a package added
    without a place on them fails here."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    diagram = architecture.split("## Layers", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    table = (ROOT / "CONTRIBUTING.md").read_text().split("## The layers", 1)[1]
    table = table.split("\n## ", 1)[0]
    for name in _packages():
        assert re.search(rf"(?<![\w/]){re.escape(name)}(?!\w)", diagram), f"diagram: {name}"
        bare = name.rstrip("/")
        assert f"`{bare}`" in table or f"`{bare} " in table, f"CONTRIBUTING.md: {name}"


def test_the_seam_tables_name_every_protocol_of_the_seams() -> None:
    """A protocol added to ``turnkit/_seams`` gets a row (or a mention) in
    architecture.md's seam tables."""
    source = ROOT / "src" / "turnkit" / "_seams"
    protocols = sorted(
        name
        for path in source.glob("*.py")
        for name in re.findall(r"^class (\w+)\([^)]*Protocol\)", path.read_text(), re.M)
    )
    assert "SessionStore" in protocols and "TurnQueue" in protocols
    section = (ROOT / "docs" / "architecture.md").read_text().split("## The seams", 1)[1]
    section = section.split("\n## ", 1)[0]
    missing = [p for p in protocols if not re.search(rf"`(\w+\.)*{p}[`(]", section)]
    assert missing == []
