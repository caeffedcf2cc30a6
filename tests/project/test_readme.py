"""The README's fresh-machine commands stay what CI runs, and name real extras."""

from __future__ import annotations

import re
import tomllib

from suite_paths import ROOT


def first_two_commands() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text().splitlines()
    fence = readme.index("```sh")
    return readme[fence + 1], readme[fence + 2]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    run_main, run_tests = first_two_commands()
    assert "turnkit run" in run_main or "turnkit dev" in run_main
    assert "pytest" in run_tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert run_tests in ci


def test_the_commands_install_extras_that_exist() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    run_main, run_tests = first_two_commands()
    asked = {
        extra
        for line in (run_main, run_tests, *(ROOT / ".ci" / "run").read_text().splitlines())
        for group in re.findall(r"'\.\[([^\]]+)\]'", line)
        for extra in group.split(",")
    }
    assert asked and asked <= extras
    # `turnkit dev` serves over HTTP: the first command installs the server extra.
    assert "turnkit dev" not in run_main or ".[server]" in run_main
