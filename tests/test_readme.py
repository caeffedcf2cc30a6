"""The README's fresh-machine commands stay what CI runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    fence = readme.index("```sh")
    run_main, run_tests = readme[fence + 1], readme[fence + 2]
    assert "turnkit run" in run_main or "turnkit dev" in run_main
    assert "pytest" in run_tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert run_tests in ci
