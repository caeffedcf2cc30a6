"""The chat page of ``turnkit dev``, driven in a real browser (Debian's headless chromium).

Each test starts the real ``turnkit dev`` as a subprocess on a SQLite file, opens its
page with Playwright and clicks and types as a person would.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from browser_support import chromium, watched_page
from cli_support import OFFLINE_ENV
from playwright.sync_api import Browser, Page, Route, expect
from suite_paths import ROOT

EXAMPLE = ROOT / "examples" / "ops"
SLOW_AGENT = ROOT / "tests" / "fixtures" / "slow_agent"
FORM_AGENT = ROOT / "tests" / "fixtures" / "form_agent"
DECISION_AGENT = ROOT / "tests" / "fixtures" / "decision_agent"
ECHO_AGENT = ROOT / "tests" / "fixtures" / "echo_agent"
TIMER_AGENT = ROOT / "tests" / "fixtures" / "timer_agent"
#: Who ``turnkit dev`` says answered: its loopback principal, the local user ``local:<login>``.
BY_ME = r"local:\S+"
URL = re.compile(r"http://127\.0\.0\.1:(\d+)/")
DEV_COMMAND = [sys.executable, "-m", "turnkit.cli", "dev"]
VIEWPORT = {"width": 1200, "height": 800}


class DevServer:
    """``turnkit dev`` in a subprocess; ``start()`` returns its URL once it serves."""

    def __init__(
        self, agent: Path, store: Path, *, port: int = 0, env: dict[str, str] | None = None
    ) -> None:
        self.agent, self.store, self.port = agent, store, port
        self.env = {**OFFLINE_ENV, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log = store.parent / f"dev-{time.monotonic_ns()}.err"

    def start(self) -> str:
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(
                [
                    *DEV_COMMAND,
                    str(self.agent),
                    "--port",
                    str(self.port),
                    "--store",
                    str(self.store),
                ],
                cwd=self.store.parent,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            found = URL.search(line)
            if found:
                self.port = int(found.group(1))
                return found.group(0)
        self.stop()
        raise AssertionError(f"turnkit dev did not print its URL; stderr:\n{self.log.read_text()}")

    def kill(self, how: signal.Signals = signal.SIGKILL) -> None:
        """SIGKILL: no clean-up, no goodbye, as a crash or an OOM kill; SIGTERM: a
        graceful stop, as a deploy does."""
        assert self.proc is not None
        os.kill(self.proc.pid, how)
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with watched_page(browser, viewport=VIEWPORT) as page:
        yield page


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[DevServer]]:
    started: list[DevServer] = []
    yield started
    for server in started:
        server.stop()


def serve(
    servers: list[DevServer],
    tmp_path: Path,
    agent: Path = EXAMPLE,
    *,
    port: int = 0,
    env: dict[str, str] | None = None,
) -> tuple[DevServer, str]:
    server = DevServer(agent, tmp_path / "s.db", port=port, env=env)
    servers.append(server)
    return server, server.start()


def say(page: Page, text: str) -> None:
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("send").click()


def wait_for_turns(page: Page, status: str, count: int) -> None:
    expect(page.locator(f'[data-testid="turn"][data-status="{status}"]')).to_have_count(count)


def log_text(page: Page) -> str:
    return page.get_by_test_id("log").inner_text()


# The texts a streaming assistant message showed before its message completed.
WATCH_DRAFTS = """
window.__drafts = [];
new MutationObserver(() => {
  const drafts = '[data-testid="assistant-message"][data-state="streaming"]';
  for (const el of document.querySelectorAll(drafts)) {
    const text = el.textContent;
    if (window.__drafts[window.__drafts.length - 1] !== text) window.__drafts.push(text);
  }
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


def test_a_reply_streams_in_pieces(servers: list[DevServer], tmp_path: Path, page: Page) -> None:
    _, url = serve(servers, tmp_path)
    page.add_init_script(WATCH_DRAFTS)
    page.goto(url)
    expect(page.get_by_test_id("notice")).to_contain_text("offline demo model")
    say(page, "hello")
    wait_for_turns(page, "completed", 1)
    final = (
        "(offline demo) I place, track and refund orders. "
        "Try: order 2 blue widgets, or: refund order 1"
    )
    reply = page.get_by_test_id("assistant-message")
    expect(reply).to_have_text(final)
    expect(reply).to_have_attribute("data-state", "done")
    deltas = int(reply.get_attribute("data-deltas") or 0)
    assert deltas > 1, f"the reply arrived in {deltas} delta(s)"
    assert page.evaluate("window.turnkitChat.frames['message.delta']") == deltas
    drafts: list[str] = page.evaluate("window.__drafts")
    partial = [d for d in drafts if d and d != final]
    assert len(partial) > 1 and all(final.startswith(d) for d in partial), drafts
    assert log_text(page).count(final) == 1
    page.screenshot(path="/tmp/turnkit-chat-streamed.png")


def test_tool_calls_show_as_a_timeline_with_errors_marked(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "order 2 blue widgets")
    wait_for_turns(page, "completed", 1)
    calls = page.get_by_test_id("tool-call")
    expect(calls).to_have_count(2)
    expect(calls.nth(0)).to_have_attribute("data-tool", "create_order")
    expect(calls.nth(0)).to_have_attribute("data-status", "ok")
    expect(calls.nth(0).get_by_test_id("tool-result")).to_contain_text('"order_id":1')
    expect(calls.nth(1)).to_have_attribute("data-tool", "lookup_order")
    expect(calls.nth(1)).to_have_attribute("data-status", "ok")
    expect(calls.nth(1).get_by_test_id("tool-result")).to_contain_text('"status":"packed"')
    done = "Done: order #1 (2 x blue widgets) is packed."
    expect(page.get_by_test_id("assistant-message").last).to_have_text(done)

    say(page, "order 0 ghosts")
    wait_for_turns(page, "completed", 2)
    failed = calls.nth(2)
    expect(failed).to_have_attribute("data-tool", "create_order")
    expect(failed).to_have_attribute("data-status", "error")
    expect(failed.get_by_test_id("tool-result")).to_have_text(
        "✗ ValueError: quantity must be at least 1"
    )
    page.screenshot(path="/tmp/turnkit-chat-timeline.png")

    # Opened again, the session's transcript shows the same timeline.
    page.reload()
    expect(calls).to_have_count(3)
    expect(page.locator('[data-testid="tool-call"][data-status="error"]')).to_have_count(1)
    expect(failed.get_by_test_id("tool-result")).to_contain_text("quantity must be at least 1")
    assert log_text(page).count(done) == 1


def test_an_approval_is_clicked_through(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "refund order 1")
    card = page.get_by_test_id("approval")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund order #1 in full?")
    expect(page.get_by_test_id("send")).to_be_disabled()
    page.screenshot(path="/tmp/turnkit-chat-approval.png")
    card.get_by_test_id("approve").click()
    wait_for_turns(page, "completed", 1)
    expect(card).to_have_attribute("data-state", "answered")
    approved = re.compile(rf"^Approved by {BY_ME}$")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(approved)
    call = page.get_by_test_id("tool-call")
    expect(call).to_have_attribute("data-status", "ok")
    expect(call.get_by_test_id("tool-result")).to_contain_text('"refunded":true')
    expect(page.get_by_test_id("assistant-message").last).to_have_text("Refunded order #1.")
    assert log_text(page).count("Refunded order #1.") == 1
    expect(page.get_by_test_id("send")).to_be_enabled()
    assert_result_below_its_approval(page)
    page.screenshot(path="/tmp/turnkit-chat-approved.png")

    # Opened again, the history still says who approved, and when.
    page.reload()
    card = page.get_by_test_id("approval")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-state", "answered")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund order #1 in full?")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(approved)
    expect(card.get_by_test_id("message-time")).to_have_count(2)  # asked, answered
    expect(page.get_by_test_id("approve")).to_have_count(0)
    expect(page.get_by_test_id("tool-result")).to_contain_text('"refunded":true')
    assert_result_below_its_approval(page)
    expect(page.get_by_test_id("send")).to_be_enabled()
    assert log_text(page).count("Refunded order #1.") == 1


def assert_result_below_its_approval(page: Page) -> None:
    """The approval sits inside the tool call that asked, and the call's result below it."""
    call = page.get_by_test_id("tool-call")
    expect(call.get_by_test_id("approval")).to_have_count(1)
    below = call.evaluate(
        """el => {
            const card = el.querySelector('[data-testid="approval"]');
            const result = el.querySelector('[data-testid="tool-result"]');
            return Boolean(card.compareDocumentPosition(result) & Node.DOCUMENT_POSITION_FOLLOWING);
        }"""
    )
    assert below


def test_a_parked_question_survives_a_reload_and_can_be_denied(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "refund order 7")
    expect(page.get_by_test_id("approve")).to_be_visible()
    page.reload()  # the question comes back from …/pending
    card = page.get_by_test_id("approval")
    expect(card).to_have_count(1)
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund order #7 in full?")
    card.get_by_test_id("deny").click()
    declined = "Refund of order #7 declined; nothing was changed."
    expect(page.get_by_test_id("assistant-message").last).to_have_text(declined)
    denied = re.compile(rf"^Denied by {BY_ME}$")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(denied)
    expect(page.get_by_test_id("tool-result")).to_contain_text('"refunded":false')
    assert log_text(page).count(declined) == 1
    assert log_text(page).count("Asking for approval to refund order #7.") == 1
    page.reload()
    expect(page.get_by_test_id("approval-outcome")).to_have_text(denied)
    assert_result_below_its_approval(page)


def test_sessions_are_listed_opened_and_reset(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "order 3 pens")
    wait_for_turns(page, "completed", 1)
    first = page.get_by_test_id("session-title").inner_text().split(" / ")[1]

    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("empty")).to_be_visible()
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    items = page.get_by_test_id("session-item")
    expect(items).to_have_count(2)

    page.locator(f'[data-testid="session-item"][data-session-id="{first}"]').click()
    expect(page.get_by_test_id("user-message")).to_have_text("order 3 pens")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("3 x pens")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("reset").click()
    expect(page.get_by_test_id("note")).to_contain_text("Session reset")
    expect(page.get_by_test_id("turn")).to_have_count(0)
    page.reload()
    expect(page.get_by_test_id("empty")).to_be_visible()
    expect(page.get_by_test_id("turn")).to_have_count(0)


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_the_page_reconnects_after_a_server_restart_mid_turn(
    servers: list[DevServer], tmp_path: Path, page: Page, how: signal.Signals
) -> None:
    release = tmp_path / "release"
    env = {"TURNKIT_TEST_RELEASE": str(release)}
    first, url = serve(servers, tmp_path, SLOW_AGENT, env=env)
    page.goto(url)
    say(page, "job-7")
    call = page.get_by_test_id("tool-call")
    expect(call).to_have_attribute("data-status", "running")
    expect(page.get_by_test_id("assistant-message")).to_have_text("Starting the slow job now.")

    first.kill(how)
    status = page.get_by_test_id("connection-status")
    expect(status).to_have_text("reconnecting…")
    page.screenshot(path=f"/tmp/turnkit-chat-reconnecting-{how.name}.png")
    serve(servers, tmp_path, SLOW_AGENT, port=first.port, env=env)
    # Reconnected to the feed while the recovered tool still waits; the rest of the
    # turn then arrives live, deltas included.
    expect(status).to_have_text("streaming…")
    deltas_before = page.evaluate("window.turnkitChat.frames['message.delta']")
    release.touch()

    wait_for_turns(page, "completed", 1)
    expect(status).not_to_have_text("reconnecting…")
    expect(call).to_have_count(1)
    expect(call).to_have_attribute("data-status", "ok")
    expect(page.get_by_test_id("tool-result")).to_have_count(1)
    expect(page.get_by_test_id("tool-result")).to_contain_text('"released":true')
    replies = page.get_by_test_id("assistant-message")
    expect(replies).to_have_text(["Starting the slow job now.", "The slow job job-7 finished."])
    text = log_text(page)
    for once in ("Starting the slow job now.", "The slow job job-7 finished.", '"released":true'):
        assert text.count(once) == 1, text
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    assert page.evaluate("window.turnkitChat.frames['message.delta']") > deltas_before
    page.screenshot(path=f"/tmp/turnkit-chat-reconnected-{how.name}.png")


def test_a_reopened_page_follows_a_running_turn_to_its_end(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    release = tmp_path / "release"
    _, url = serve(servers, tmp_path, SLOW_AGENT, env={"TURNKIT_TEST_RELEASE": str(release)})
    page.goto(url)
    say(page, "job-9")
    expect(page.get_by_test_id("tool-call")).to_have_attribute("data-status", "running")
    page.reload()  # the session is running: the page shows it from its event feed
    call = page.get_by_test_id("tool-call")
    expect(call).to_have_attribute("data-status", "running")
    expect(page.get_by_test_id("send")).to_be_disabled()
    release.touch()
    wait_for_turns(page, "completed", 1)
    expect(call).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_text("job-9")
    expect(page.get_by_test_id("assistant-message")).to_have_text(
        ["Starting the slow job now.", "The slow job job-9 finished."]
    )
    expect(page.get_by_test_id("send")).to_be_enabled()


def test_a_dropped_stream_carries_on_from_the_last_event_id(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    """The turn's stream stops mid-turn, inside a half-sent frame (a dropped connection):
    the page reconnects to the event feed and shows the rest once."""
    _, url = serve(servers, tmp_path)
    cut: list[str] = []

    def drop_after_the_first_result(route: Route) -> None:
        frames = route.fetch().text().split("\n\n")
        first_result = next(i for i, f in enumerate(frames) if "event: action.completed" in f)
        kept = frames[: first_result + 3]  # the result and two deltas of the next reply
        cut.extend(kept)
        body = "\n\n".join(kept) + '\n\nevent: message.delta\ndata: {"type": "message.de'
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    page.route("**/turns", drop_after_the_first_result, times=1)
    feeds: list[str] = []
    page.on("request", lambda r: feeds.append(r.url) if "/events?" in r.url else None)
    page.goto(url)
    say(page, "order 2 blue widgets")
    wait_for_turns(page, "completed", 1)
    assert "event: message.delta" in cut[-1] and "turn.completed" not in "".join(cut)
    last_id = max(int(m) for m in re.findall(r"^id: (\d+)$", "\n".join(cut), re.MULTILINE))
    assert len(feeds) == 1 and f"after={last_id}&turn_id=" in feeds[0], feeds
    calls = page.get_by_test_id("tool-call")
    expect(calls).to_have_count(2)
    expect(calls.nth(1)).to_have_attribute("data-status", "ok")
    expect(page.get_by_test_id("assistant-message")).to_have_text(
        [
            "Placing an order for 2 x blue widgets.",
            "Checking its status.",
            "Done: order #1 (2 x blue widgets) is packed.",
        ]
    )
    text = log_text(page)
    assert text.count("Checking its status.") == 1 and text.count('"status":"packed"') == 1, text


def test_other_answers_are_given_in_a_form(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, FORM_AGENT)
    page.goto(url)
    say(page, "name please")
    card = page.get_by_test_id("approval")
    expect(card).to_have_attribute("data-kind", "string")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Whose order is it?")
    card.get_by_test_id("answer-text").fill("Ann")
    card.get_by_test_id("answer-submit").click()
    expect(page.get_by_test_id("assistant-message")).to_have_text('Got "Ann".')
    expect(card.get_by_test_id("approval-outcome")).to_have_text(
        re.compile(rf"^Answered by {BY_ME}: Ann$")
    )

    say(page, "a note please")
    card = page.get_by_test_id("approval").nth(1)
    expect(card).to_have_attribute("data-kind", "json")
    field, send = card.get_by_test_id("answer-json"), card.get_by_test_id("answer-submit")
    field.fill("{not json")
    send.click()
    expect(card.get_by_test_id("approval-error")).to_contain_text("Not valid JSON")
    field.fill('{"approved": "yes"}')  # breaks the schema: the server refuses it (422)
    send.click()
    expect(card.get_by_test_id("approval-error")).to_contain_text("422")
    expect(card).to_have_attribute("data-state", "open")
    page.screenshot(path="/tmp/turnkit-chat-form.png")
    field.fill('{"approved": true, "note": "fine"}')
    send.click()
    wait_for_turns(page, "completed", 2)
    expect(page.get_by_test_id("assistant-message").last).to_have_text(
        'Got {"approved": true, "note": "fine"}.'
    )
    expect(card.get_by_test_id("approval-error")).to_be_hidden()
    expect(card.get_by_test_id("approval-outcome")).to_have_text(
        re.compile(rf"^Approved by {BY_ME}: fine$")
    )


def test_two_questions_at_once_are_answered_one_by_one(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, FORM_AGENT)
    page.goto(url)
    say(page, "both please")
    cards = page.get_by_test_id("approval")
    expect(cards).to_have_count(2)
    name, note = cards.nth(0), cards.nth(1)
    expect(name).to_have_attribute("data-kind", "string")
    expect(note).to_have_attribute("data-kind", "json")
    note.get_by_test_id("answer-json").fill('{"approved": false}')
    note.get_by_test_id("answer-submit").click()
    expect(note).to_have_attribute("data-state", "answered")
    expect(name).to_have_attribute("data-state", "open")  # still waiting on this one
    wait_for_turns(page, "suspended", 1)
    expect(page.get_by_test_id("send")).to_be_disabled()
    page.reload()  # the open question comes back from …/pending, the answer from the log
    cards = page.get_by_test_id("approval")
    expect(cards).to_have_count(2)
    name, note = cards.nth(0), cards.nth(1)
    expect(note.get_by_test_id("approval-outcome")).to_have_text(
        re.compile(rf"^Denied by {BY_ME}$")
    )
    name.get_by_test_id("answer-text").fill("Bo")
    name.get_by_test_id("answer-submit").click()
    wait_for_turns(page, "completed", 1)
    expect(page.get_by_test_id("assistant-message").last).to_have_text(
        'Got "Bo" and {"approved": false}.'
    )
    expect(page.get_by_test_id("send")).to_be_enabled()


def test_a_message_sent_while_the_server_is_down_is_reported(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    server, url = serve(servers, tmp_path)
    page.goto(url)
    expect(page.get_by_test_id("notice")).to_be_visible()
    server.kill()
    say(page, "order 1 lamp")
    expect(page.get_by_test_id("connection-status")).to_have_text("reconnecting…")
    serve(servers, tmp_path, port=server.port)
    expect(page.get_by_test_id("error")).to_have_text(
        "The message did not reach the server; send it again."
    )
    expect(page.get_by_test_id("turn")).to_have_attribute("data-status", "unsent")
    # What did not arrive is still in the box, to send again as it is.
    expect(page.get_by_test_id("message-input")).to_have_value("order 1 lamp")
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("1 x lamp")


# -- Markdown, and what a reply must never do -----------------------------------------

#: Each payload would set ``window.__pwned`` (or open a dialog) if it ran.
HOSTILE = [
    "<img src=x onerror=\"window.__pwned='img'\">",
    "<script>window.__pwned='script'</script>",
    "<svg onload=\"window.__pwned='svg'\"><circle r=5></circle></svg>",
    "<iframe srcdoc=\"<script>parent.__pwned='iframe'</script>\"></iframe>",
    "<details open ontoggle=\"window.__pwned='details'\">x</details>",
    "<a href=\"javascript:window.__pwned='a-js'\">raw link</a>",
    "[md link](javascript:window.__pwned='md-js')",
    "[data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![img](x\" onerror=\"window.__pwned='md-img')",
    "![tracker](https://example.invalid/pixel.png)",
    "![data img](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "<style>body { display: none }</style><form action=/x><button>go</button></form>",
    '<p class="approval" style="color:red" data-testid="approve">spoof</p>',
]

#: Everything in the log that a sanitized reply may not contain.
UNSAFE_DOM = """
(root) => {
  const banned = ["script", "img", "svg", "iframe", "style", "form", "details", "object"];
  const found = [];
  for (const el of root.querySelectorAll("*")) {
    const tag = el.tagName.toLowerCase();
    if (banned.includes(tag)) found.push(tag);
    for (const attr of el.attributes) {
      const name = attr.name;
      if (name.startsWith("on") || name === "style" || name === "srcdoc") {
        found.push(`${tag}[${name}]`);
      }
    }
    const href = el.getAttribute("href");
    if (tag === "a" && href !== null && !/^(https?|mailto):/i.test(href)) {
      found.push(`a[href=${href}]`);
    }
  }
  return found;
}
"""


def watch_for_attacks(page: Page) -> list[str]:
    dialogs: list[str] = []

    def dismiss(dialog: Any) -> None:
        dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", dismiss)
    return dialogs


def test_replies_render_as_markdown_with_code_blocks(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, ECHO_AGENT)
    page.add_init_script(WATCH_DRAFTS)
    page.goto(url)
    text = (
        "## Plan\n\nSome **bold**, some *emphasis* and `inline code`.\n\n"
        "- first\n- second\n\n1. one\n2. two\n\n"
        "```python\ndef add(a, b):\n    return a + b\n```\n\n"
        "> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "See [the docs](https://example.invalid/docs) or mail [us](mailto:a@example.invalid)."
    )
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("send").click()
    wait_for_turns(page, "completed", 1)
    reply = page.get_by_test_id("assistant-message")
    expect(reply.locator("h2")).to_have_text("Plan")
    expect(reply.locator("strong")).to_have_text("bold")
    expect(reply.locator("em")).to_have_text("emphasis")
    expect(reply.locator("ul > li")).to_have_text(["first", "second"])
    expect(reply.locator("ol > li")).to_have_text(["one", "two"])
    expect(reply.locator("pre > code")).to_have_text("def add(a, b):\n    return a + b")
    expect(reply.locator("p > code")).to_have_text("inline code")
    expect(reply.locator("blockquote")).to_have_text("quoted")
    expect(reply.locator("td")).to_have_text(["1", "2"])
    link = reply.get_by_role("link", name="the docs")
    expect(link).to_have_attribute("href", "https://example.invalid/docs")
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(reply.get_by_role("link", name="us")).to_have_attribute(
        "href", "mailto:a@example.invalid"
    )
    # The user's own text is never Markdown: it shows as typed.
    expect(page.get_by_test_id("user-message")).to_have_text(text)
    # The draft was drawn as Markdown while it streamed, more than once.
    drafts: list[str] = page.evaluate("window.__drafts")
    assert len([d for d in drafts if d]) > 1, drafts
    page.screenshot(path="/tmp/turnkit-chat-markdown.png", full_page=True)
    page.reload()  # the history draws it the same way
    expect(page.get_by_test_id("assistant-message").locator("pre > code")).to_have_count(1)
    expect(page.get_by_test_id("assistant-message").locator("h2")).to_have_text("Plan")


@pytest.mark.parametrize("payload", HOSTILE)
def test_hostile_markdown_is_sanitized_live_and_after_a_reload(
    servers: list[DevServer], tmp_path: Path, browser: Browser, payload: str
) -> None:
    # One page per payload; the fixture's page is not used, so each starts clean.
    _, url = serve(servers, tmp_path, ECHO_AGENT)
    with watched_page(browser, viewport=VIEWPORT) as page:
        dialogs = watch_for_attacks(page)
        page.goto(url)
        text = f"Here it comes:\n\n{payload}\n\nand after it."
        page.get_by_test_id("message-input").fill(text)
        page.get_by_test_id("send").click()
        wait_for_turns(page, "completed", 1)
        for round in ("live", "reloaded"):
            log = page.get_by_test_id("log")
            reply = page.get_by_test_id("assistant-message")
            expect(reply).to_contain_text("and after it.")
            expect(page.get_by_test_id("user-message")).to_have_text(text)  # as text
            assert log.evaluate(UNSAFE_DOM) == [], round
            for link in reply.locator("a").all():
                link.click(modifiers=["Control"])  # a link that survived must not run code
            expect(page.get_by_test_id("approve")).to_have_count(0)
            preview = page.get_by_test_id("session-preview").first
            expect(preview).to_contain_text("Here it comes:")  # escaped, as text
            assert page.evaluate("window.__pwned") is None, round
            assert dialogs == [], round
            page.reload()
            wait_for_turns(page, "completed", 1)


def test_markdown_images_become_links_and_fetch_nothing(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, ECHO_AGENT)
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url) if "example.invalid" in r.url else None)
    page.goto(url)
    say(page, "![a chart](https://example.invalid/chart.png)")
    wait_for_turns(page, "completed", 1)
    link = page.get_by_test_id("assistant-message").get_by_role("link")
    expect(link).to_have_text("image: a chart")
    expect(link).to_have_attribute("href", "https://example.invalid/chart.png")
    assert fetched == []


# -- times, sessions, reset, archives, the address ------------------------------------


def test_messages_show_the_time_they_were_sent_live_and_after_a_reload(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    before = time.time()
    say(page, "order 2 blue widgets")
    wait_for_turns(page, "completed", 1)
    after = time.time()

    def times() -> list[float]:
        stamps = page.get_by_test_id("message-time")
        expect(stamps).to_have_count(4)  # the user's message and three replies
        found = []
        for stamp in stamps.all():
            expect(stamp).to_have_text(re.compile(r"\d{1,2}[:.]\d\d"))
            iso = stamp.get_attribute("datetime") or ""
            found.append(page.evaluate("iso => Date.parse(iso) / 1000", iso))
        return found

    live = times()
    assert all(before - 1 <= t <= after + 1 for t in live), (before, live, after)
    assert live == sorted(live)
    page.reload()
    assert times() == live  # the history shows the logged times, not the reload's


def test_sessions_are_listed_by_their_first_message(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    first = "order 3 pens <b>now</b> " + "and more " * 20
    say(page, first)
    wait_for_turns(page, "completed", 1)
    page.get_by_test_id("new-session").click()
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    previews = page.get_by_test_id("session-preview")
    expect(previews).to_have_count(2)
    expect(previews.nth(0)).to_have_text("order 1 lamp")  # newest first
    shown = previews.nth(1).inner_text()
    assert shown.startswith("order 3 pens <b>now</b> and more") and shown.endswith("…")
    assert len(shown) == 80
    expect(previews.nth(1).locator("b")).to_have_count(0)
    item = page.get_by_test_id("session-item").nth(1)
    expect(item).to_have_attribute("title", re.compile(r"^chat-"))  # the id, on hover
    item.click()
    expect(page.get_by_test_id("user-message")).to_have_text(first.strip())


def test_reset_asks_first_and_says_a_question_would_go_unanswered(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "refund order 4")
    expect(page.get_by_test_id("approve")).to_be_visible()
    asked: list[str] = []

    def answer(accept: bool) -> Any:
        def on_dialog(dialog: Any) -> None:
            asked.append(f"{dialog.type}: {dialog.message}")
            dialog.accept() if accept else dialog.dismiss()

        return on_dialog

    page.once("dialog", answer(False))
    page.get_by_test_id("reset").click()
    expect(page.get_by_test_id("approve")).to_be_visible()  # dismissed: nothing happened
    assert len(asked) == 1 and asked[0].startswith("confirm: Reset this session?")
    assert "A question is waiting for an answer" in asked[0]
    page.reload()
    expect(page.get_by_test_id("approve")).to_be_visible()  # still parked on the server

    page.once("dialog", answer(True))
    page.get_by_test_id("reset").click()
    expect(page.get_by_test_id("note")).to_contain_text("Session reset")
    expect(page.get_by_test_id("approval")).to_have_count(0)
    assert len(asked) == 2


def test_an_archived_generation_can_be_read_after_a_reset(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "order 3 pens")
    wait_for_turns(page, "completed", 1)
    menu = page.get_by_test_id("generation-select")
    expect(menu).to_be_hidden()  # nothing archived yet
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("reset").click()
    expect(page.get_by_test_id("note")).to_contain_text("Session reset")
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    page.reload()
    expect(menu).to_be_visible()
    menu.select_option("0")
    expect(page.get_by_test_id("archived-banner")).to_contain_text("Archived generation #0")
    expect(page.get_by_test_id("user-message")).to_have_text("order 3 pens")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("3 x pens")
    expect(page.get_by_test_id("tool-call")).to_have_count(2)
    # Read-only: nothing to send, nothing to reset.
    expect(page.get_by_test_id("message-input")).to_be_disabled()
    expect(page.get_by_test_id("send")).to_be_disabled()
    expect(page.get_by_test_id("reset")).to_be_disabled()
    page.screenshot(path="/tmp/turnkit-chat-archive.png")
    menu.select_option("live")
    expect(page.get_by_test_id("archived-banner")).to_be_hidden()
    expect(page.get_by_test_id("user-message")).to_have_text("order 1 lamp")
    expect(page.get_by_test_id("message-input")).to_be_enabled()


def test_a_refused_message_stays_in_the_box(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    busy = {"error": "the session is busy; try again", "code": "session_busy"}
    page.route("**/turns", lambda route: route.fulfill(status=503, json=busy), times=1)
    page.goto(url)
    say(page, "order 5 cups")
    expect(page.get_by_test_id("error")).to_contain_text("the session is busy")
    expect(page.get_by_test_id("message-input")).to_have_value("order 5 cups")
    page.get_by_test_id("send").click()  # sent again as it was
    wait_for_turns(page, "completed", 1)
    expect(page.get_by_test_id("message-input")).to_have_value("")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("5 x cups")


def test_a_question_turnkit_run_parked_is_listed_shown_and_approved_on_the_page(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    """One person on one machine: the page's user is the one ``turnkit run`` spoke as."""
    parked = subprocess.run(
        [
            *DEV_COMMAND[:-1],
            "run",
            str(EXAMPLE),
            "refund order 1",
            *("--session", "from-cli", "--store", str(tmp_path / "s.db")),
        ],
        cwd=tmp_path,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )
    assert parked.returncode == 3, parked.stderr
    _, url = serve(servers, tmp_path)
    page.goto(url)
    item = page.locator('[data-testid="session-item"][data-session-id="from-cli"]')
    expect(item.get_by_test_id("session-preview")).to_have_text("refund order 1")
    item.click()
    expect(page.get_by_test_id("user-message")).to_have_text("refund order 1")
    card = page.get_by_test_id("approval")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund order #1 in full?")
    card.get_by_test_id("approve").click()
    wait_for_turns(page, "completed", 1)
    approved = re.compile(rf"^Approved by {BY_ME}$")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(approved)
    expect(page.get_by_test_id("assistant-message").last).to_have_text("Refunded order #1.")


def test_a_message_the_server_refuses_leaves_no_session_in_the_list(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    """A session someone else (here ``TURNKIT_USER=bob``) opened is not yours: sending
    to it is refused as if it did not exist, and the list gains no entry for it."""
    bobs, bobs_url = serve(servers, tmp_path, env={"TURNKIT_USER": "bob"})
    page.goto(f"{bobs_url}#ops/theirs")
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    bobs.stop()
    _, url = serve(servers, tmp_path)
    page.goto(f"{url}#ops/theirs")
    expect(page.get_by_test_id("empty")).to_be_visible()
    say(page, "order 2 lamps")
    expect(page.get_by_test_id("error")).to_contain_text("has no session 'theirs' for you")
    expect(page.get_by_test_id("turn")).to_have_attribute("data-status", "refused")
    # Until then it was listed as the new session you were on; now it is not listed.
    expect(page.locator('[data-session-id="theirs"]')).to_have_count(0)
    expect(page.get_by_test_id("session-item")).to_have_count(0)


def test_the_page_follows_its_address_when_it_is_edited(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path)
    page.goto(url)
    say(page, "order 3 pens")
    wait_for_turns(page, "completed", 1)
    first = page.evaluate("location.hash")
    page.get_by_test_id("new-session").click()
    say(page, "order 1 lamp")
    wait_for_turns(page, "completed", 1)
    second = page.evaluate("location.hash")
    assert first != second and first.startswith("#ops/chat-")
    page.evaluate("hash => { location.hash = hash; }", first)
    expect(page.get_by_test_id("user-message")).to_have_text("order 3 pens")
    expect(page.get_by_test_id("session-title")).to_have_text(f"ops / {first.split('/')[1]}")
    page.go_back()  # the browser's history works too: back to the second session
    expect(page.get_by_test_id("user-message")).to_have_text("order 1 lamp")
    page.evaluate("() => { location.hash = '#ops/new-one'; }")
    expect(page.get_by_test_id("session-title")).to_have_text("ops / new-one")
    expect(page.get_by_test_id("empty")).to_be_visible()


def test_a_failed_delivery_elsewhere_shows_as_a_note_in_its_turn(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    """Another channel's reply to the turn failed (a live ``delivery.failed``, as the
    Slack channel emits): the page says so in the turn, which still completes."""
    _, url = serve(servers, tmp_path)

    def with_a_failed_delivery(route: Route) -> None:
        frames = route.fetch().text().split("\n\n")
        started = next(f for f in frames if "event: turn.started" in f)
        turn_id = json.loads(started.split("data: ", 1)[1])["turn_id"]
        failed = {
            "type": "delivery.failed",
            "turn_id": turn_id,
            "session_id": "ignored",
            "seq": None,
            "at": None,
            "channel": "slack",
            "target": "C1",
            "method": "chat.update",
            "error": "<b>token_revoked</b>",
        }
        frames.insert(2, f"event: delivery.failed\ndata: {json.dumps(failed)}")
        body = "\n\n".join(frames)
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    page.route("**/turns", with_a_failed_delivery, times=1)
    page.goto(url)
    say(page, "hello")
    wait_for_turns(page, "completed", 1)
    note = page.get_by_test_id("turn").get_by_test_id("delivery-failed")
    expect(note).to_have_text(
        "The slack reply to C1 failed (chat.update): <b>token_revoked</b>. The turn runs on."
    )
    expect(page.get_by_test_id("error")).to_have_count(0)


def test_a_proposed_call_is_approved_with_edits_rejected_or_answered_instead(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, DECISION_AGENT)
    page.goto(url)
    expect(page.get_by_test_id("inbox-empty")).to_be_visible()
    say(page, "refund A-9")
    card = page.get_by_test_id("approval")
    expect(card).to_have_attribute("data-kind", "decision")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund 500 cents on A-9?")
    proposal = json.loads(card.get_by_test_id("decision-proposal").inner_text())
    assert proposal == {"order_id": "A-9", "cents": 500}
    for kind in ("approve", "edit", "reject", "respond"):
        expect(card.get_by_test_id(f"decide-{kind}")).to_be_visible()
    expect(card.get_by_test_id("approval-due")).to_have_text(re.compile(r"^Answer by \S"))
    # The question waits in the inbox too, with its deadline.
    item = page.get_by_test_id("inbox-item")
    expect(item).to_have_count(1)
    expect(item.get_by_test_id("inbox-prompt")).to_have_text("Refund 500 cents on A-9?")
    expect(item.get_by_test_id("inbox-when")).to_contain_text(" · due ")
    card.get_by_test_id("decide-edit").click()
    field = card.get_by_test_id("decision-arguments")
    field.fill('{"order_id": "A-9", "cents": 0}')  # the tool's schema refuses it: 422
    card.get_by_test_id("decide-edit-submit").click()
    expect(card.get_by_test_id("approval-error")).to_contain_text("cents")
    expect(card).to_have_attribute("data-state", "open")
    field.fill('{"order_id": "A-9", "cents": 120}')
    card.get_by_test_id("decide-edit-submit").click()
    expect(page.get_by_test_id("assistant-message")).to_have_text("Tool said: refunded 120 on A-9")
    edited = re.compile(rf'^Approved with edits by {BY_ME}: {{"order_id":"A-9","cents":120}}$')
    expect(card.get_by_test_id("approval-outcome")).to_have_text(edited)
    expect(card.get_by_test_id("approval-due")).to_have_count(0)
    expect(page.get_by_test_id("inbox-item")).to_have_count(0)

    say(page, "refund B-1")
    card = page.get_by_test_id("approval").nth(1)
    card.get_by_test_id("decide-reject").click()
    card.get_by_test_id("decision-reason").fill("a duplicate")
    card.get_by_test_id("decide-reject-submit").click()
    wait_for_turns(page, "completed", 2)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("Reason: a duplicate")
    rejected = re.compile(rf"^Rejected by {BY_ME}: a duplicate$")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(rejected)

    say(page, "refund C-3")
    card = page.get_by_test_id("approval").nth(2)
    card.get_by_test_id("decide-respond").click()
    card.get_by_test_id("decision-message").fill("Ask for a photo first.")
    card.get_by_test_id("decide-respond-submit").click()
    wait_for_turns(page, "completed", 3)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("Ask for a photo first.")
    page.reload()
    outcomes = page.get_by_test_id("approval-outcome")
    expect(outcomes).to_have_count(3)
    expect(outcomes.nth(0)).to_have_text(edited)
    expect(outcomes.nth(1)).to_have_text(rejected)
    expect(outcomes.nth(2)).to_have_text(
        re.compile(rf"^Responded by {BY_ME}: Ask for a photo first\.$")
    )


def test_a_wait_shows_when_it_ends_wakes_early_or_ends_by_itself(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, TIMER_AGENT)
    page.goto(url)
    say(page, "wait 600")
    card = page.get_by_test_id("timer")
    expect(card).to_have_attribute("data-state", "open")
    expect(card.get_by_test_id("timer-until")).to_have_text(re.compile(r"^Waiting until \S"))
    expect(page.get_by_test_id("send")).to_be_disabled()
    page.reload()  # the wait comes back from …/pending, Wake button and all
    card = page.get_by_test_id("timer")
    expect(card).to_have_attribute("data-state", "open")
    card.get_by_test_id("wake").click()
    wait_for_turns(page, "completed", 1)
    expect(page.get_by_test_id("assistant-message")).to_have_text("Woken early.")
    woken = re.compile(rf"^Woken early by {BY_ME}$")
    expect(card.get_by_test_id("approval-outcome")).to_have_text(woken)
    expect(page.get_by_test_id("send")).to_be_enabled()
    page.screenshot(path="/tmp/turnkit-chat-woken.png")

    # A short wait ends by itself, and the page opens the session again to show it.
    say(page, "wait 0.02")
    expect(page.get_by_test_id("assistant-message").last).to_have_text("Waited.")
    outcomes = page.get_by_test_id("approval-outcome")
    expect(outcomes).to_have_count(2)
    expect(outcomes.nth(0)).to_have_text(woken)
    expect(outcomes.nth(1)).to_have_text(re.compile(r"^Waited until \S"))
    expect(page.get_by_test_id("wake")).to_have_count(0)
    expect(page.get_by_test_id("send")).to_be_enabled()


def test_the_inbox_lists_questions_of_other_sessions_and_opens_them(
    servers: list[DevServer], tmp_path: Path, page: Page
) -> None:
    _, url = serve(servers, tmp_path, DECISION_AGENT)
    page.goto(url)
    say(page, "refund A-1")
    expect(page.get_by_test_id("approval")).to_have_count(1)
    first = page.get_by_test_id("session-title").inner_text()
    page.get_by_test_id("new-session").click()
    say(page, "refund B-2")
    expect(page.get_by_test_id("approval")).to_have_count(1)
    items = page.get_by_test_id("inbox-item")
    expect(items).to_have_count(2)
    expect(page.get_by_test_id("inbox-count")).to_have_text("(2)")
    expect(items.nth(0).get_by_test_id("inbox-prompt")).to_have_text("Refund 500 cents on A-1?")
    items.nth(0).click()
    expect(page.get_by_test_id("session-title")).to_have_text(first)
    card = page.get_by_test_id("approval")
    expect(card.get_by_test_id("approval-prompt")).to_have_text("Refund 500 cents on A-1?")
    card.get_by_test_id("decide-approve").click()
    expect(page.get_by_test_id("assistant-message")).to_have_text("Tool said: refunded 500 on A-1")
    expect(page.get_by_test_id("inbox-item")).to_have_count(1)
    expect(page.get_by_test_id("inbox-prompt")).to_have_text("Refund 500 cents on B-2?")
