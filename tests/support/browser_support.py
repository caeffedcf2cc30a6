"""Driving turnkit's pages in a real browser: Debian's headless chromium through
Playwright. A test module that imports this is skipped where that chromium is
missing, except in CI (``CI`` set), where the page tests always run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists() and not os.environ.get("CI"):
    pytest.skip(
        f"the page tests need Debian's chromium at {CHROMIUM} "
        "(apt-get install chromium); in CI (CI set) they always run",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000


@contextmanager
def chromium() -> Iterator[Browser]:
    """One headless chromium, for a module's tests to open pages in."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@contextmanager
def watched_page(browser: Browser, **context_options: Any) -> Iterator[Page]:
    """A page in a browser context of its own (``context_options``: a viewport, extra
    headers), waiting ``TIMEOUT_MS`` at most; a script error on it fails the test."""
    context = browser.new_context(**context_options)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"the page raised: {errors}"
