"""``turnkit.testing.replay`` (issue 38): a recorded session, from any store or an
exported file, played against a changed agent names the first step that differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_fork import approval_agent

import turnkit
from turnkit import ToolMessage, UserMessage, export_session, tool
from turnkit.testing import (
    Divergence,
    ReplayDivergenceError,
    ScriptedModel,
    ScriptedReply,
    replay,
    tool_call,
)


def shop(ran: list[str], *, schema: str = "order", answer: str = "shipped") -> turnkit.Agent:
    """An agent whose second turn looks an order up; ``schema`` names the lookup's
    parameter (the "changed schema" renames it), ``answer`` what it finds."""

    @tool
    async def clock() -> str:
        """What time it is."""
        ran.append("clock")
        return "noon"

    async def find(**kwargs: str) -> str:
        ran.append("lookup")
        return f"order {next(iter(kwargs.values()))}: {answer}"

    if schema == "order":

        @tool
        async def lookup(order: str) -> str:
            """Look an order up."""
            return await find(order=order)
    else:

        @tool
        async def lookup(order_id: str) -> str:  # type: ignore[misc]
            """Look an order up."""
            return await find(order_id=order_id)

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            if "time" in last.text:
                return ScriptedReply(tool_calls=[tool_call("clock")])
            return ScriptedReply(tool_calls=[tool_call("lookup", {"order": "7"})])
        assert isinstance(last, ToolMessage)
        return f"it says {last.result}"

    return turnkit.Agent(name="shop", model=ScriptedModel(respond=respond), tools=[clock, lookup])


async def record(open_runtime: Any) -> turnkit.Runtime:
    rt = await open_runtime(shop([]))
    session = rt.session("shop", "s1")
    assert await session.turn("what time is it?") == "it says noon"
    assert await session.turn("where is 7?") == "it says order 7: shipped"
    return rt


async def test_an_unchanged_agent_replays_as_recorded(open_runtime: Any) -> None:
    rt = await record(open_runtime)
    ran: list[str] = []
    report = await replay(rt.store, shop(ran), session="s1")
    assert report.same and report.divergence is None
    assert (report.turns, report.steps) == (2, 6)
    assert str(report) == "replay of s1: 2 turn(s), 6 step(s) as recorded"
    assert ran == ["clock", "lookup"]  # the tools ran for real
    report.check()


async def test_a_changed_tool_schema_is_caught_at_its_first_call(open_runtime: Any) -> None:
    rt = await record(open_runtime)
    report = await replay(rt.store, shop([], schema="order_id"), session="s1")
    divergence = report.divergence
    assert isinstance(divergence, Divergence)
    second_turn = (await rt.session("shop", "s1").messages())[4].turn_id
    assert (divergence.turn_id, divergence.step_id, divergence.kind) == (
        second_turn,
        "tool:5:call_1",
        "arguments",
    )
    assert divergence.expected == {"order": "7"}
    assert "'order_id' is a required property" in divergence.detail
    assert report.turns == 2
    with pytest.raises(ReplayDivergenceError, match=r"step tool:5:call_1 \(arguments\)") as err:
        report.check()
    assert isinstance(err.value, AssertionError) and err.value.report is report


async def test_a_changed_result_or_a_missing_tool_names_the_step(
    open_runtime: Any, tmp_path: Path
) -> None:
    rt = await record(open_runtime)
    path = tmp_path / "s1.json"
    path.write_text(json.dumps(await export_session(rt.store, "s1")))

    report = await replay(path, shop([], answer="lost"))
    assert report.divergence is not None
    assert (report.divergence.step_id, report.divergence.kind) == ("tool:5:call_1", "tool_result")
    assert report.divergence.expected == "order 7: shipped"
    assert report.divergence.actual == "order 7: lost"

    # Recorded results, tools not run: nothing differs, nothing ran.
    ran: list[str] = []
    assert (await replay(path, shop(ran, answer="lost"), tools="recorded")).same
    assert ran == []

    no_lookup = turnkit.Agent(
        name="shop", model=ScriptedModel([]), tools=[t for t in shop([]).tools if t.name == "clock"]
    )
    gone = await replay(path, no_lookup)
    assert gone.divergence is not None
    assert (gone.divergence.step_id, gone.divergence.kind) == ("tool:5:call_1", "tool_call")
    assert "no longer offers" in gone.divergence.detail


async def test_another_model_diverges_at_its_first_different_answer(open_runtime: Any) -> None:
    rt = await record(open_runtime)
    terse = ScriptedModel(
        respond=lambda m: (
            ScriptedReply(tool_calls=[tool_call("clock")])
            if isinstance(m[-1], UserMessage)
            else "noon."
        )
    )
    agent = turnkit.Agent(name="shop", model=terse, tools=shop([]).tools)
    report = await replay(rt.store, agent, session="s1", model="agent")
    assert report.divergence is not None
    assert (report.divergence.step_id, report.divergence.kind) == ("model:3", "answer")
    assert (report.divergence.expected, report.divergence.actual) == ("it says noon", "noon.")


async def test_parks_are_answered_with_the_recorded_answers(open_runtime: Any) -> None:
    rt = await open_runtime(approval_agent([], {"lookup": 0}))
    session = rt.session("a", "s1")
    parked = await session.result(session.start("refund it"))
    assert parked.request is not None
    await session.resume(parked.turn_id, parked.request.id, False)
    await session.result(parked.turn_id)
    assert (await session.result(session.start("and again"))).status == "suspended"

    ran = {"lookup": 0}
    report = await replay(rt.store, approval_agent([], ran), session="s1")
    assert report.same, report
    assert ran["lookup"] == 2
