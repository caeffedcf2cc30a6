"""The chat page's inbox for someone other than a session's owner, in real Chromium:
``create_app(chat_page=True)`` with an ``X-User`` principal, one person's turn asking
another to decide. The decider sees the question in the inbox and approves or
rejects it there, without the session, which is not theirs to read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import chromium, watched_page
from eventually import eventually_blocking
from playwright.sync_api import Browser, expect
from server_support import by_header, serve_app_in_thread

import turnkit
from turnkit import ActionContext, Answerers, Approval, Decision, define_action
from turnkit.server import create_app
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ALICE = {"X-User": "alice"}


def refund_agent() -> turnkit.Agent:
    def run(data: dict[str, Any], actx: ActionContext) -> str:
        return f"refunded {data['order']}"

    refund = define_action(
        name="refund",
        description="Refund an order.",
        input_schema={"type": "object", "properties": {"order": {"type": "string"}}},
        run=run,
        approval=Approval(
            allowed=("approve", "reject"),
            answerers=Answerers.user("bo"),
            prompt=lambda args: f"Refund {args['order']}?",
        ),
    )

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        last = transcript[-1]
        if isinstance(last, turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order": last.text})])
        assert isinstance(last, turnkit.ToolMessage)
        return ScriptedReply(text=f"Tool said: {last.result}")

    return turnkit.Agent(name="shop", model=ScriptedModel(respond=respond), tools=[refund])


@contextmanager
def served(db: Path) -> Iterator[str]:
    """The app, with the chat page, on a loopback port in a thread of its own."""
    runtime = turnkit.Runtime(refund_agent(), store=SqliteStore(db))
    app = create_app(runtime, authenticate=by_header, chat_page=True, own_runtime=True)
    with serve_app_in_thread(app, lifespan=True) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def settled(client: httpx.Client, session: str) -> dict[str, Any]:
    """Alice's view of her session once its turn is no longer running."""

    def transcript() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(
            f"/agents/shop/sessions/{session}/transcript", headers=ALICE
        ).json()
        return body if body["status"] == "idle" else None

    return eventually_blocking(transcript, what=f"session {session} idle", timeout=20)


@pytest.mark.parametrize(
    ("button", "decision", "says"),
    [
        ("inbox-approve", Decision.approve(), "Tool said: refunded A-1"),
        ("inbox-reject", Decision.reject(), "rejected it."),
    ],
)
def test_a_decider_answers_from_the_inbox_a_session_they_may_not_read(
    tmp_path: Path, browser: Browser, button: str, decision: Decision, says: str
) -> None:
    with served(tmp_path / "s.db") as url, httpx.Client(base_url=url, timeout=30) as client:
        asked = client.post("/agents/shop/sessions/s1/chat", json={"text": "A-1"}, headers=ALICE)
        assert asked.json()["status"] == "suspended", asked.text
        assert (
            client.get("/agents/shop/sessions/s1/transcript", headers={"X-User": "bo"}).status_code
            == 404
        )
        with watched_page(browser, extra_http_headers={"X-User": "bo"}) as page:
            page.goto(url)
            entry = page.get_by_test_id("inbox-entry")
            expect(entry).to_have_count(1)
            expect(entry.get_by_test_id("inbox-prompt")).to_have_text("Refund A-1?")
            entry.get_by_test_id(button).click()
            expect(page.get_by_test_id("inbox-entry")).to_have_count(0)
            expect(page.get_by_test_id("inbox-empty")).to_be_visible()
        body = settled(client, "s1")
        assert body["status"] == "idle"
        assert says in body["messages"][-1]["text"]
        (record,) = client.get("/agents/shop/sessions/s1/answers", headers=ALICE).json()["answers"]
        assert (record["by"], record["source"]) == ("bo", "http")
        assert record["decision"] == decision.to_dict()
