"""Every Python example in the README and docs/ runs, so the docs cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

EXAMPLES = [
    pytest.param(code, id=f"{path.name}:{n}")
    for path in DOCS
    for n, code in enumerate(BLOCK.findall(path.read_text()), start=1)
]


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples may create files such as calc.db
    exec(compile(code, "<doc example>", "exec"), {"__name__": "__doc_example__"})


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4
