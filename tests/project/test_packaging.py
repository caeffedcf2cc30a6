"""What a package index shows and a wheel installs: metadata, extras, README links,
and the bundled example running from an installed wheel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from cli_support import OFFLINE_ENV
from suite_paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: Where the README's links point, so they work on a package index page too.
REPOSITORY = "https://github.com/turnkit/turnkit"
LINK = re.compile(r"\]\(([^)\s]+)\)")
INTEGRATIONS = {
    "anthropic",
    "openai",
    "postgres",
    "server",
    "cron",
    "slack",
    "otel",
    "mcp",
    "metrics",
    "crypto",
    "a2a",
    "s3",
}


def test_every_extra_installs_something_and_all_is_every_integration() -> None:
    extras: dict[str, list[str]] = PROJECT["optional-dependencies"]
    assert all(extras.values()), [name for name, needs in extras.items() if not needs]
    assert set(extras) == INTEGRATIONS | {"all", "test", "bench"}  # bench: the peers
    everything = {need for name in INTEGRATIONS for need in extras[name]}
    assert set(extras["all"]) == everything


def test_the_metadata_says_what_it_is_and_where_its_docs_are() -> None:
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and (ROOT / "src" / "turnkit" / "py.typed").exists()
    assert "License :: OSI Approved :: MIT License" in classifiers
    assert PROJECT["license"] == {"text": "MIT"}
    minimum = PROJECT["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {minimum}" in classifiers
    documentation = PROJECT["urls"]["Documentation"]
    assert documentation == f"{REPOSITORY}/tree/main/docs"
    assert (ROOT / "docs").is_dir()


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_readme_links_are_absolute_and_name_files_that_exist() -> None:
    links = LINK.findall((ROOT / "README.md").read_text())
    assert links
    for link in links:
        assert link.startswith("https://"), f"{link}: a relative link breaks on the index page"
        if not link.startswith(f"{REPOSITORY}/"):
            continue
        path, _, anchor = link.removeprefix(f"{REPOSITORY}/").partition("#")
        kind, branch, inside = path.split("/", 2)
        assert (kind, branch) in {("blob", "main"), ("tree", "main")}, link
        target = ROOT / inside
        assert target.exists(), f"{link}: no {inside} in the repository"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"{link}: no such heading"


@pytest.mark.slow
def test_an_installed_wheel_runs_the_bundled_example(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(
        ROOT / "src",
        source / "src",
        ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"),
    )
    pip = [sys.executable, "-m", "pip", "-q"]
    wheels = tmp_path / "wheels"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, timeout=300
    )
    (wheel,) = wheels.glob("turnkit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(meta).decode())
    assert "turnkit/examples/ops/agent.py" in names
    assert "turnkit/examples/ops/tools/create_order.py" in names
    assert "slack" in metadata.get_all("Provides-Extra", [])
    assert f"Documentation, {REPOSITORY}/tree/main/docs" in metadata.get_all("Project-URL", [])
    assert "Typing :: Typed" in metadata.get_all("Classifier", [])
    installed = tmp_path / "installed"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(installed), str(wheel)],
        check=True,
        timeout=300,
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {**OFFLINE_ENV, "PYTHONPATH": str(installed), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONSAFEPATH", None)
    command = [sys.executable, "-m", "turnkit.cli"]
    where = subprocess.run(
        [sys.executable, "-c", "import turnkit; print(turnkit.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(installed) + os.sep)  # the wheel, not the checkout
    version = subprocess.run(
        [*command, "--version"], cwd=work, env=env, capture_output=True, text=True
    )
    assert version.stdout == f"turnkit {PROJECT['version']}\n"
    done = subprocess.run(
        [*command, "run", "order 2 blue widgets"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Done: order #1 (2 x blue widgets) is packed." in done.stdout
