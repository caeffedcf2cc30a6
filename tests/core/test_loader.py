"""``load_agent`` assembles an agent folder, and names the file when something is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from suite_paths import FIXTURES, ROOT

import turnkit
from turnkit.testing import ScriptedModel

EXAMPLE = ROOT / "examples" / "ops"


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_the_example_folder_assembles() -> None:
    agent = turnkit.load_agent(EXAMPLE)
    assert agent.name == "ops"
    assert [t.name for t in agent.tools] == ["create_order", "lookup_order", "refund_order"]
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


FIXTURE = FIXTURES / "support"


async def test_a_folder_with_overlays_and_surfaces_assembles() -> None:
    agent = turnkit.load_agent(FIXTURE, model=ScriptedModel([]))
    assert agent.name == "support" and agent.max_steps == 8
    assert sorted(t.name for t in agent.tools) == ["issue_refund", "lookup_order"]
    assert dict(agent.source_instructions) == {
        "email": "You answer email. Be formal and never promise refunds.",
        "slack": "Reply in two sentences at most.",
    }
    slack = agent.policy_for("slack")
    assert slack.system == (
        "You are the support assistant for a small shop.\n\nReply in two sentences at most."
    )
    assert slack.deny_tools == {"issue_refund"}
    email = agent.policy_for("email")
    assert email.system == "You answer email. Be formal and never promise refunds."
    assert email.deny_tools == {"issue_refund", "lookup_order"}
    assert agent.policy_for(None).system == "You are the support assistant for a small shop."
    assert agent.authorize_answer is not None
    check = turnkit.AnswerCheck(policy="support-lead", scope=None, by="U-lead")
    assert await agent.authorize_answer(check) is True


def test_a_dict_config_with_an_unknown_setting_names_the_file(tmp_path: Path) -> None:
    folder = write(tmp_path / "x", {"agent.py": "agent = {'name': 'x', 'surface': {}}\n"})
    with pytest.raises(turnkit.ConfigurationError, match=r"agent\.py: unknown agent setting"):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_replace_mode_without_its_overlay_file_is_an_assembly_error(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {
            "agent.py": "agent = {'surfaces': {'slack': {'mode': 'replace'}}}\n",
            "instructions.md": "Base.\n",
        },
    )
    with pytest.raises(
        turnkit.ConfigurationError,
        match=r"agent folder .*'slack' has mode 'replace' but no instructions.*instructions"
        r"\.slack\.md",
    ):
        turnkit.load_agent(folder, model=ScriptedModel([]))
    write(folder, {"instructions.slack.md": "Slack only.\n"})
    assert turnkit.load_agent(folder, model=ScriptedModel([])).policy_for("slack").system == (
        "Slack only."
    )


def test_an_explicit_append_mode_without_its_overlay_file_is_an_assembly_error(
    tmp_path: Path,
) -> None:
    folder = write(
        tmp_path / "x",
        {
            "agent.py": (
                "from turnkit import SurfacePolicy\n"
                "agent = {'surfaces': {'slack': SurfacePolicy(mode='append')}}\n"
            ),
            "instructions.md": "Base.\n",
        },
    )
    with pytest.raises(
        turnkit.ConfigurationError, match=r"'slack' has mode 'append' but no instructions"
    ):
        turnkit.load_agent(folder, model=ScriptedModel([]))
    write(folder, {"instructions.slack.md": "Slack too.\n"})
    agent = turnkit.load_agent(folder, model=ScriptedModel([]))
    assert agent.policy_for("slack").system == "Base.\n\nSlack too."


def test_a_surface_that_only_denies_tools_needs_no_overlay_file(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {
            "agent.py": "agent = {'surfaces': {'slack': {'deny_tools': ['ping']}}}\n",
            "instructions.md": "Base.\n",
            "tools/ping.py": (
                "from turnkit import tool\n\n\n@tool\ndef ping() -> str:\n"
                '    """Ping."""\n    return "pong"\n'
            ),
        },
    )
    policy = turnkit.load_agent(folder, model=ScriptedModel([])).policy_for("slack")
    assert policy.system == "Base." and policy.deny_tools == {"ping"}


def test_an_empty_overlay_file_with_replace_mode_gives_an_empty_prompt(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {
            "agent.py": "agent = {'surfaces': {'sms': {'mode': 'replace'}}}\n",
            "instructions.md": "Base.\n",
            "instructions.sms.md": "\n",
        },
    )
    agent = turnkit.load_agent(folder, model=ScriptedModel([]))
    assert agent.policy_for("sms").system is None
    assert agent.policy_for("cli").system == "Base."


def test_an_agent_py_that_fails_to_import_is_named(tmp_path: Path) -> None:
    folder = write(tmp_path / "x", {"agent.py": "raise ValueError('bad settings')\n"})
    with pytest.raises(
        turnkit.ConfigurationError, match=r"agent\.py: failed to import: ValueError: bad settings"
    ):
        turnkit.load_agent(folder, model=ScriptedModel([]))


TOOL_SRC = (
    'from turnkit import tool\n\n@tool\ndef {name}(x: str) -> str:\n    """Echo."""\n    return x\n'
)


def test_an_alias_or_a_sibling_import_counts_once(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {
            "tools/lookup.py": TOOL_SRC.format(name="lookup") + "find = lookup\n",
            "tools/more.py": (
                "import sys\nfrom pathlib import Path\n\n"
                "_sibling = Path(__file__).with_name('lookup.py')\n"
                "lookup = next(m.lookup for m in list(sys.modules.values())\n"
                "              if getattr(m, '__file__', None) == str(_sibling))\n"
            )
            + TOOL_SRC.format(name="other"),
        },
    )
    agent = turnkit.load_agent(folder, model=ScriptedModel([]))
    assert sorted(t.name for t in agent.tools) == ["lookup", "other"]


def test_two_tools_with_one_name_name_both_files(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {"tools/a.py": TOOL_SRC.format(name="echo"), "tools/b.py": TOOL_SRC.format(name="echo")},
    )
    with pytest.raises(
        turnkit.ConfigurationError,
        match=r"two tools are named 'echo': one in .*a\.py, one in .*b\.py",
    ):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_a_module_all_limits_what_it_exports(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "x",
        {
            "tools/a.py": TOOL_SRC.format(name="echo")
            + TOOL_SRC.format(name="hidden")
            + "__all__ = ['echo']\n"
        },
    )
    agent = turnkit.load_agent(folder, model=ScriptedModel([]))
    assert [t.name for t in agent.tools] == ["echo"]


def test_malformed_settings_name_agent_py(tmp_path: Path) -> None:
    folder = write(tmp_path / "x", {"agent.py": "agent = {'surfaces': ['slack']}\n"})
    with pytest.raises(turnkit.ConfigurationError, match=r"agent\.py: surfaces must be a dict"):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_agent_py_sets_max_parallel_tools(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "par",
        {
            "agent.py": 'agent = {"max_parallel_tools": 2}\n',
            "instructions.md": "x",
        },
    )
    assert turnkit.load_agent(folder, model=ScriptedModel([])).max_parallel_tools == 2
    (folder / "agent.py").write_text('agent = {"max_parallel_tools": 0}\n')
    with pytest.raises(turnkit.ConfigurationError, match="max_parallel_tools"):
        turnkit.load_agent(folder, model=ScriptedModel([]))


def test_agent_py_sets_history_and_a_typed_answer(tmp_path: Path) -> None:
    folder = write(
        tmp_path / "typed",
        {
            "agent.py": (
                "from pydantic import BaseModel\n"
                "from turnkit import LastTurns\n\n"
                "class Quote(BaseModel):\n"
                "    total: int\n\n"
                "agent = {'history': LastTurns(3), 'output_type': Quote, 'output_retries': 2}\n"
            ),
            "instructions.md": "x",
        },
    )
    agent = turnkit.load_agent(folder, model=ScriptedModel([]))
    assert isinstance(agent.history, turnkit.LastTurns)
    assert agent.output_type is not None and agent.output_type.__name__ == "Quote"
    assert agent.output_retries == 2
    (folder / "agent.py").write_text("agent = {'output_retries': -1}\n")
    with pytest.raises(turnkit.ConfigurationError, match=r"agent folder .*output_retries"):
        turnkit.load_agent(folder, model=ScriptedModel([]))
    (folder / "agent.py").write_text("agent = {'history': 'last 3'}\n")
    with pytest.raises(turnkit.ConfigurationError, match=r"agent folder .*history"):
        turnkit.load_agent(folder, model=ScriptedModel([]))
