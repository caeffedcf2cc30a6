"""The inbox: every open question one answerer may answer, across sessions and agents,
paged by a cursor — on every store."""

from __future__ import annotations

import time
from typing import Any

import pytest
from eventually import eventually

import turnkit
from turnkit import AnswerCheck, Answerers, PendingInput, ToolContext, UserMessage, tool
from turnkit.stores import InboxStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def asking_agent(name: str, *, authorize: Any = None) -> turnkit.Agent:
    """Each turn's text says who its one question is for: ``user:ana``,
    ``policy:leads``, ``anyone``, or ``two:ana`` (two calls asking ana at once)."""

    @tool
    async def ask(who: str, ctx: ToolContext) -> str:
        """Ask someone."""
        kind, _, name_ = who.partition(":")
        answerers = (
            Answerers.user(name_)
            if kind in ("user", "two")
            else Answerers.policy(name_)
            if kind == "policy"
            else None
        )
        answer = await ctx.request_input("q", f"question for {who}", answerers=answerers)
        return f"got {answer}"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            calls = [tool_call("ask", {"who": last.text})]
            if last.text.startswith("two:"):
                calls.append(tool_call("ask", {"who": last.text}))
            return ScriptedReply(tool_calls=calls)
        return "done"

    return turnkit.Agent(
        name=name, model=ScriptedModel(respond=respond), tools=[ask], authorize_answer=authorize
    )


async def leads(check: AnswerCheck) -> bool:
    return check.policy == "leads" and check.by == "ana"


async def park(rt: turnkit.Runtime, agent: str, session: str, who: str) -> turnkit.TurnResult:
    s = rt.session(agent, session)
    result = await s.result(s.start(who))
    assert result.status == "suspended", result
    return result


async def everything(rt: turnkit.Runtime, by: str, **kw: Any) -> list[PendingInput]:
    """Every page of ``by``'s inbox, checking that pages never overlap."""
    items: list[PendingInput] = []
    after = None
    for _ in range(100):
        page = await rt.pending_inputs(by, after=after, **kw)
        items.extend(page.items)
        if page.next is None:
            break
        after = page.next
    keys = [(i.session_id, i.request.id) for i in items]
    assert len(keys) == len(set(keys)), keys
    return items


async def test_the_inbox_lists_what_the_answerer_may_answer_across_agents(
    open_runtime: Any,
) -> None:
    rt = await open_runtime(asking_agent("a", authorize=leads), asking_agent("b"))
    before = time.time()
    await park(rt, "a", "s1", "user:ana")
    await park(rt, "b", "s2", "user:bo")
    await park(rt, "b", "s3", "user:ana")
    await park(rt, "a", "s4", "policy:leads")
    await park(rt, "b", "s5", "policy:leads")  # b has no authorize_answer: nobody's
    await park(rt, "a", "s6", "anyone")
    ana = await everything(rt, "ana")
    assert [(i.agent, i.session_id) for i in ana] == [("a", "s1"), ("b", "s3"), ("a", "s4")]
    assert [i.answer_as for i in ana] == ["ana", "ana", None]
    first = ana[0]
    assert first.request.prompt == "question for user:ana" and first.request.id == "q"
    assert before - 1 <= first.asked_at <= time.time() and 0 <= first.age() < 60
    assert first.to_dict()["request"] == first.request.to_dict()
    assert [i.session_id for i in await everything(rt, "bo")] == ["s2"]
    # The policy is asked about the first name; other names match user answerers.
    assert [i.session_id for i in await everything(rt, ["cy", "bo"])] == ["s2"]
    # Questions that name nobody are shown only where the caller says they may answer.

    async def open_to(agent: str, session_id: str) -> bool:
        return session_id == "s6"

    assert [i.session_id for i in await everything(rt, "zed", open_to=open_to)] == ["s6"]
    assert await everything(rt, "zed") == []


async def test_pages_follow_a_cursor_oldest_first_and_never_shift(open_runtime: Any) -> None:
    rt = await open_runtime(asking_agent("a"))
    for n in range(7):
        await park(rt, "a", f"s{n}", "user:ana" if n != 3 else "user:bo")
    page1 = await rt.pending_inputs("ana", limit=3)
    assert [i.session_id for i in page1.items] == ["s0", "s1", "s2"] and page1.next
    # Answering from the inbox is a normal resume; the next page is not shifted by it.
    item = page1.items[0]
    session = rt.session(item.agent, item.session_id)
    await session.result(
        await session.resume(item.turn_id, item.request.id, "yes", by=item.answer_as)
    )
    page2 = await rt.pending_inputs("ana", limit=3, after=page1.next)
    assert [i.session_id for i in page2.items] == ["s4", "s5", "s6"]
    page3 = await rt.pending_inputs("ana", limit=3, after=page2.next)
    assert page3.items == [] and page3.next is None
    assert [i.session_id for i in await everything(rt, "ana", limit=2)] == [
        "s1",
        "s2",
        "s4",
        "s5",
        "s6",
    ]


async def test_a_page_ends_between_turns(open_runtime: Any) -> None:
    rt = await open_runtime(asking_agent("a"))
    await park(rt, "a", "s1", "two:ana")
    await park(rt, "a", "s2", "user:ana")
    page = await rt.pending_inputs("ana", limit=1)
    # One turn's two questions stay together, even past the limit.
    assert [(i.session_id, i.request.id.split("@")[0]) for i in page.items] == [
        ("s1", "q"),
        ("s1", "q"),
    ]
    rest = await rt.pending_inputs("ana", limit=1, after=page.next)
    assert [i.session_id for i in rest.items] == ["s2"]
    page = await rt.pending_inputs("ana", limit=2)
    assert [i.session_id for i in page.items] == ["s1", "s1"]


async def test_the_store_lists_parked_turns_by_key(open_runtime: Any) -> None:
    rt = await open_runtime(asking_agent("a"))
    parked = [await park(rt, "a", f"s{n}", "user:ana") for n in range(3)]
    s = rt.session("a", "s9")
    await s.result(s.start("anyone"))  # parked too
    store = rt.store
    assert isinstance(store, InboxStore)
    rows = await store.parked_turns(limit=10)
    assert [r.turn_id for r in rows][:3] == [p.turn_id for p in parked]
    assert all(r.status == "suspended" and r.pending is not None for r in rows)
    key = (rows[0].created_at, rows[0].session_id, rows[0].turn_id)
    assert [r.turn_id for r in await store.parked_turns(limit=2, after=key)] == [
        r.turn_id for r in rows[1:3]
    ]


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"limit": 0}, "limit must be an integer from 1"),
        ({"limit": 10_000}, "limit must be an integer from 1"),
        ({"after": "nope"}, "not an inbox cursor"),
        ({"after": "5b315d"}, "not an inbox cursor"),
    ],
)
async def test_a_bad_page_request_is_refused(
    open_runtime: Any, kw: dict[str, Any], problem: str
) -> None:
    rt = await open_runtime(asking_agent("a"))
    with pytest.raises(ValueError, match=problem):
        await rt.pending_inputs("ana", **kw)
    with pytest.raises(ValueError, match="answerer's name"):
        await rt.pending_inputs([])


async def test_the_inbox_shows_a_questions_deadline_and_never_a_timer(open_runtime: Any) -> None:
    @tool
    async def wait_then_ask(order: str, ctx: ToolContext) -> str:
        """Wait a while, then ask."""
        if order == "sleepy":
            await ctx.sleep(3600)
        answer = await ctx.request_input(
            "q",
            f"ship {order}?",
            answerers=Answerers.user("ana"),
            expires_in=7200,  # past the sleep's end: firing that leaves this open
            on_expiry="cancel",
        )
        return f"got {answer}"

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("wait_then_ask", {"order": last.text})])
        return "done"

    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[wait_then_ask])
    rt = await open_runtime(agent)
    await park(rt, "a", "s1", "sleepy")  # parked on its sleep: nobody's question
    await park(rt, "a", "s2", "now")
    (item,) = await everything(rt, "ana")
    assert item.session_id == "s2" and item.expires_at is not None
    assert item.expires_at == pytest.approx(item.asked_at + 7200)
    assert item.to_dict()["expires_at"] == item.expires_at
    # A sleep that ends is no one's answer: the record lists only people's answers.
    sleeping = rt.session("a", "s1")
    parked = await sleeping.pending()
    assert parked is not None and parked.kind == "timer" and parked.expires_at is not None
    await rt.timers.fire_due(rt.store, now=parked.expires_at + 1)

    async def both_open() -> bool:
        return [i.session_id for i in await everything(rt, "ana")] == ["s1", "s2"]

    await eventually(both_open, what="the sleep ended", timeout=20)
    assert await sleeping.answers() == []
