"""``load_agent`` assembles an agent folder, and names the file when something is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

import turnkit
from turnkit.testing import ScriptedModel

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ops"


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_the_example_folder_assembles() -> None:
    agent = turnkit.load_agent(EXAMPLE)
    assert agent.name == "ops"
    assert [t.name for t in agent.tools] == ["create_order", "lookup_order"]
    assert agent.tool("create_order").local and not agent.tool("lookup_order").local  # type: ignore[union-attr]
    assert "ops assistant" in agent.instructions


def test_a_folder_with_no_agent_py_takes_its_name_and_the_given_model(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "helper",
        {
            "instructions.md": "Be helpful.\n",
            "tools/_private.py": "raise RuntimeError('never imported')\n",
            "tools/hello.py": (
                "from turnkit import tool\n\n@tool\ndef hello(name: str) -> str:\n"
                '    """Say hello."""\n    return name\n'
            ),
        },
    )
    model = ScriptedModel(["hi"])
    agent = turnkit.load_agent(folder, model=model)
    assert (agent.name, agent.instructions, agent.model) == ("helper", "Be helpful.", model)
    assert [t.name for t in agent.tools] == ["hello"]


def test_a_tool_module_that_fails_to_import_is_named(tmp_path: Path) -> None:
    folder = write(tmp_path / "bad", {"tools/broken.py": "import no_such_module_xyz\n"})
    with pytest.raises(turnkit.ConfigurationError, match=r"broken\.py: failed to import"):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_a_tool_module_without_a_tool_is_named(tmp_path: Path) -> None:
    folder = write(tmp_path / "empty", {"tools/nothing.py": "X = 1\n"})
    with pytest.raises(turnkit.ConfigurationError, match=r"nothing\.py: defines no Tool"):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_no_model_anywhere_is_a_clear_error(tmp_path: Path) -> None:
    folder = write(tmp_path / "nomodel", {"instructions.md": "x"})
    with pytest.raises(turnkit.ConfigurationError, match="names no model"):
        turnkit.load_agent(folder)
