"""The operator console's page (issue 38) in a real browser (Debian's headless
chromium): the real ``turnkit console`` serves a SQLite store that ``turnkit run``
filled with a parked session and a failed one; the test answers the park and
retries the failed turn as an operator would, with screenshots in /tmp."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from browser_support import chromium, watched_page
from cli_support import OFFLINE_ENV, turnkit_with_input
from console_takeover import Deployment, agent_folder, hold, release, take_over
from playwright.sync_api import Browser, Page, expect
from test_chat_page import _pump
from test_ops import free_port

CONSOLE = [sys.executable, "-m", "turnkit.cli", "console"]
URL = re.compile(r"turnkit console: (http://127\.0\.0\.1:\d+/)")
AGENT = {
    "agent.py": """
from turnkit import ToolMessage, UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "deployer"}


def _reply(messages):
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("deploy", {"service": last.text})])
    return f"finished: {last.result}"


def demo_model():
    return ScriptedModel(respond=_reply)
""",
    "tools/deploy.py": '''
from pathlib import Path

from turnkit import FatalToolError, ToolContext, tool

FIXED = Path(__file__).parent.parent / "fixed"


@tool
async def deploy(service: str, ctx: ToolContext) -> dict:
    """Deploy a service; the api after approval, the database once it is fixed."""
    if service == "db" and not FIXED.exists():
        raise FatalToolError("the database is locked down")
    ok = True
    if service == "api":
        ok = await ctx.request_input("approve", f"Deploy {service}?", schema={"type": "boolean"})
    return {"deployed": ok}
''',
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with watched_page(browser, viewport={"width": 1400, "height": 860}) as page:
        yield page


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A store with a parked and a failed session, and ``turnkit console`` on it."""
    agent = tmp_path / "deployer"
    for name, text in AGENT.items():
        (agent / name).parent.mkdir(parents=True, exist_ok=True)
        (agent / name).write_text(text)
    db = tmp_path / "s.db"
    parked = turnkit_with_input(
        "run", str(agent), "api", "--session", "s-park", "--store", str(db), cwd=tmp_path
    )
    assert parked.returncode == 3, parked.stderr
    failed = turnkit_with_input(
        "run", str(agent), "db", "--session", "s-fail", "--store", str(db), cwd=tmp_path
    )
    assert failed.returncode == 1 and "locked down" in failed.stderr
    with serve_console(str(agent), "--store", str(db), cwd=tmp_path) as url:
        yield url, agent


@contextmanager
def serve_console(*args: str, cwd: Path) -> Iterator[str]:
    """``turnkit console ARGS --port 0`` running; its URL once it printed it."""
    log = cwd / "console.err"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*CONSOLE, *args, "--port", "0"],
            cwd=cwd,
            env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    url = None
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            found = URL.search(lines.get(timeout=0.2))
        except queue.Empty:
            continue
        url = found.group(1) if found else None
    try:
        assert url is not None, f"turnkit console printed no URL:\n{log.read_text()}"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_an_operator_answers_a_park_and_retries_a_failed_turn(
    console: tuple[str, Path], page: Page
) -> None:
    url, agent = console
    page.goto(url)
    rows = page.get_by_test_id("session-row")
    expect(rows).to_have_count(2)
    expect(page.get_by_test_id("live-parked")).to_have_text("1")

    page.locator('[data-testid="session-row"][data-session="s-park"]').click()
    turn = page.get_by_test_id("turn")
    expect(turn).to_have_attribute("data-status", "suspended")
    steps = turn.get_by_test_id("step")
    expect(steps).to_have_count(3)
    kinds = [steps.nth(i).get_attribute("data-kind") for i in range(3)]
    assert kinds == ["model", "tool", "park"]
    expect(page.get_by_test_id("park")).to_contain_text("Deploy api?")
    expect(page.get_by_test_id("transcript")).to_contain_text("deploy")
    page.screenshot(path="/tmp/turnkit-console-park.png")

    page.get_by_test_id("answer-value").fill("true")
    page.get_by_test_id("answer").click()
    expect(page.get_by_test_id("action-result")).to_have_text("answer: done")
    expect(page.get_by_test_id("turn")).to_have_attribute("data-status", "completed")
    expect(
        page.get_by_test_id("timeline").get_by_text(re.compile("answered by local:"))
    ).to_be_visible()
    expect(page.get_by_test_id("live-parked")).to_have_text("0")
    page.screenshot(path="/tmp/turnkit-console-answered.png")

    page.locator('[data-testid="session-row"][data-session="s-fail"]').click()
    failed = page.get_by_test_id("turn")
    expect(failed).to_have_attribute("data-status", "failed")
    expect(page.get_by_test_id("turn-error")).to_contain_text("the database is locked down")
    # The tool that failed the turn, and the turn's end, are marked.
    bad = failed.locator('[data-testid="step"][data-error="true"]')
    expect(bad).to_have_count(2)
    assert [bad.nth(i).get_attribute("data-kind") for i in range(2)] == ["tool", "end"]
    page.screenshot(path="/tmp/turnkit-console-failed.png")

    (agent / "fixed").write_text("yes")
    page.get_by_test_id("retry").click()
    expect(page.get_by_test_id("action-result")).to_have_text("retry: done")
    expect(page.get_by_test_id("turn")).to_have_attribute("data-status", "completed")
    expect(page.get_by_test_id("transcript")).to_contain_text("finished:")

    # Fork it before its first model step (the step's own fork button names it): the
    # fork runs that step (and the rest) again.
    first_model = failed.locator('[data-testid="step"][data-kind="model"]').first
    first_model.get_by_test_id("fork-here").click()
    expect(page.get_by_test_id("fork-at")).to_have_value("model:1")
    page.get_by_test_id("fork-to").fill("s-fail-again")
    page.get_by_test_id("fork").click()
    expect(page.locator("#detail h2")).to_contain_text("s-fail-again")
    expect(page.get_by_test_id("turn")).to_have_attribute("data-status", "completed")
    expect(rows).to_have_count(3)

    page.get_by_test_id("filter-status").select_option("idle")
    expect(rows).to_have_count(3)
    page.get_by_test_id("filter-status").select_option("suspended")
    expect(rows).to_have_count(0)
    page.screenshot(path="/tmp/turnkit-console-retried.png")


@pytest.mark.slow
def test_a_takeover_in_the_timeline_and_the_workers_live(
    pg_dsn: str, pg_schema: str, tmp_path: Path, page: Page
) -> None:
    """On PostgreSQL with real ``turnkit worker`` processes: the first is SIGKILLed in
    the middle of a tool call and the second takes the turn over; the console shows
    each step's worker and the takeover, the surviving worker holding a session, and
    the step-latency histogram scraped from the worker's ops port."""
    deployment = Deployment(agent_folder(tmp_path), pg_dsn, pg_schema)
    port = free_port()
    try:
        done = take_over(deployment, "--ops-port", str(port))
        held_turn = hold(deployment)
        metrics = f"http://127.0.0.1:{port}/metrics"
        args = (str(deployment.folder), "--store", deployment.cli_dsn, "--metrics", metrics)
        with serve_console(*args, cwd=tmp_path) as url:
            page.goto(url)
            expect(page.get_by_test_id("live-takeovers")).to_have_text("1")
            second = page.locator(f'[data-testid="worker"][data-holder="{done.second}"]')
            expect(second.get_by_test_id("held-session")).to_have_attribute(
                "data-session", "s-held"
            )
            expect(page.get_by_test_id("live-running")).to_have_text("1")
            model_bars = page.locator(
                '[data-testid="histogram-bar"][data-kind="model"]:not([data-count="0"])'
            )
            expect(model_bars.first).to_be_attached()

            page.locator('[data-testid="session-row"][data-session="s-takeover"]').click()
            turn = page.get_by_test_id("turn")
            expect(turn).to_have_attribute("data-status", "completed")
            steps = turn.get_by_test_id("step")
            expect(steps).to_have_count(5)
            kinds = [steps.nth(i).get_attribute("data-kind") for i in range(5)]
            assert kinds == ["model", "tool", "takeover", "model", "end"]
            workers = [steps.nth(i).get_attribute("data-worker") for i in range(5)]
            assert workers == [done.first, *[done.second] * 4]
            taken = turn.locator('[data-testid="step"][data-kind="takeover"]')
            expect(taken).to_contain_text(f"taken over by {done.second}")
            expect(taken).to_contain_text(f"from {done.first}")
            expect(page.get_by_test_id("transcript")).to_contain_text("crash done")
            page.screenshot(path="/tmp/turnkit-console-takeover.png")

            release(deployment, held_turn)
            expect(page.get_by_test_id("held-session")).to_have_count(0)
            expect(page.get_by_test_id("live-running")).to_have_text("0")
    finally:
        deployment.stop()
