"""Where the suite's shared pieces live, so a test names them by what they are
rather than by where its own folder happens to sit."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
CHILDREN = TESTS / "children"
FIXTURES = TESTS / "fixtures"
FAKES = TESTS / "fakes"
JS = TESTS / "js"
