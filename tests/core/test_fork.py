"""Forking a session (issue 38), on every store: mid-batch, at a park, across a
generation. A fork copies the original's committed history up to the fork point and
re-runs nothing before it; the original is only read."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit import (
    AssistantMessage,
    ConfigurationError,
    ToolContext,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

NO_MESSAGES = 2**31 - 1  # load() then reads no message


class Tools:
    """Three tools called in one reply; ``ran`` counts each one's runs, ``version``
    is what ``weather`` answers (a tool "changed" between the original and a fork)."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {"clock": 0, "weather": 0, "news": 0}
        self.version = 1

    def agent(self, name: str = "a", *, answer_prefix: str = "") -> turnkit.Agent:
        @tool
        async def clock() -> str:
            """What time it is."""
            self.ran["clock"] += 1
            return "noon"

        @tool
        async def weather() -> str:
            """The weather."""
            self.ran["weather"] += 1
            return f"sunny v{self.version}"

        @tool
        async def news() -> str:
            """Today's news."""
            self.ran["news"] += 1
            return "quiet"

        def respond(messages: Any) -> Any:
            last = messages[-1]
            if isinstance(last, UserMessage | TriggerMessage):
                return ScriptedReply(
                    tool_calls=[tool_call("clock"), tool_call("weather"), tool_call("news")]
                )
            results = [str(m.result) for m in messages[messages.index(last) - 2 :]]
            return answer_prefix + ", ".join(results)

        model = ScriptedModel(respond=respond)
        return turnkit.Agent(name=name, model=model, tools=[clock, weather, news])


async def test_fork_mid_batch_keeps_the_calls_before_the_fork_point_and_reruns_the_rest(
    open_runtime: Any,
) -> None:
    tools = Tools()
    rt = await open_runtime(tools.agent())
    original = rt.session("a", "s1")
    assert await original.turn("what's up?") == "noon, sunny v1, quiet"
    before = await original.messages()
    reply = before[1]
    assert isinstance(reply, AssistantMessage)
    weather_call = reply.tool_calls[1]

    tools.version = 2  # the weather tool changed; fork just before its call
    fork = await original.fork(f"tool:1:{weather_call.id}", new_session="s1-try")
    assert fork.session_id == "s1-try"
    kept = await fork.messages()
    assert [type(m) for m in kept] == [UserMessage, AssistantMessage, ToolMessage]
    assert kept == before[:3]
    turn_id = before[0].turn_id
    record = await fork.turn_record(turn_id)
    assert record is not None and record.status == "running" and record.text is None
    steps = (await rt.store.session("s1-try").load(turn_id, from_index=NO_MESSAGES)).steps
    tool_steps = sorted(s for s in steps if s.startswith("tool:"))
    assert tool_steps == [f"tool:1:{reply.tool_calls[0].id}"]
    assert "model:1" in steps and "model:5" not in steps

    ran = dict(tools.ran)
    result = await fork.redeliver()
    assert result.status == "completed" and result.text == "noon, sunny v2, quiet"
    assert tools.ran == {"clock": ran["clock"], "weather": ran["weather"] + 1, "news": 2}
    # The original is untouched.
    assert await original.messages() == before
    done = await original.turn_record(turn_id)
    assert done is not None and done.status == "completed" and done.text == "noon, sunny v1, quiet"


async def test_fork_at_a_position_inside_a_batch_and_at_a_model_step(open_runtime: Any) -> None:
    tools = Tools()
    rt = await open_runtime(tools.agent())
    original = rt.session("a", "s1")
    await original.turn("first")
    await original.turn("second")
    messages = await original.messages()
    assert len(messages) == 12

    # Position 10: the second turn's opening, its reply and two of its three results.
    cut = await original.fork(10, new_session="s1-p10")
    assert await cut.messages() == messages[:10]
    ran = dict(tools.ran)
    result = await cut.redeliver()
    assert result.text == "noon, sunny v1, quiet"
    assert tools.ran["news"] == ran["news"] + 1 and tools.ran["weather"] == ran["weather"]

    # model:5 is the first turn's answer: the fork re-asks the model, runs no tool.
    again = await original.fork("model:5", new_session="s1-m5")
    assert await again.messages() == messages[:5]
    ran = dict(tools.ran)
    assert (await again.redeliver()).text == "noon, sunny v1, quiet"
    assert tools.ran == ran
    # A turn wholly before the fork point keeps its record; the fork goes on as usual.
    first = await cut.turn_record(messages[0].turn_id)
    assert first is not None and first.status == "completed"
    assert len(await rt.store.session("s1-p10").events(turn_id=messages[0].turn_id)) > 0
    assert await cut.turn("third") == "noon, sunny v1, quiet"


def approval_agent(asked: list[str], ran: dict[str, int]) -> turnkit.Agent:
    @tool
    async def lookup() -> str:
        """Look the order up."""
        ran["lookup"] += 1
        return "order 7"

    @tool
    async def refund(ctx: ToolContext) -> str:
        """Refund once approved."""
        asked.append(ctx.turn_id)
        yes = await ctx.request_input("approve", "Refund order 7?", schema={"type": "boolean"})
        return "refunded" if yes else "kept"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("lookup"), tool_call("refund")])
        return str(messages[-1].result)

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[lookup, refund])


async def test_fork_at_a_park_waits_for_its_own_answer(open_runtime: Any) -> None:
    asked: list[str] = []
    ran = {"lookup": 0}
    rt = await open_runtime(approval_agent(asked, ran))
    original = rt.session("a", "s1")
    parked = await original.result(original.start("refund it"))
    assert parked.status == "suspended" and parked.request is not None
    turn_id = parked.turn_id

    # Mid-batch and parked: lookup's result is committed, refund waits.
    fork = await original.fork(new_session="s1-no")
    assert await fork.status() == "suspended"
    request = await fork.pending()
    assert request is not None and request.id == parked.request.id
    await fork.resume(turn_id, request.id, False)
    assert (await fork.result(turn_id)).text == "kept"
    assert ran["lookup"] == 1  # not run again in the fork
    # The original still waits on its own question, and gets another answer.
    assert await original.status() == "suspended"
    await original.resume(turn_id, parked.request.id, True)
    assert (await original.result(turn_id)).text == "refunded"

    # A fork at the refund call after it was answered asks again (answers stay behind).
    reply = (await original.messages())[1]
    assert isinstance(reply, AssistantMessage)
    again = await original.fork(f"tool:1:{reply.tool_calls[1].id}", new_session="s1-again")
    result = await again.redeliver()
    assert result.status == "suspended" and result.request is not None
    assert result.request.id == parked.request.id
    assert ran["lookup"] == 1


async def test_fork_across_a_generation(open_runtime: Any) -> None:
    tools = Tools()
    rt = await open_runtime(tools.agent())
    original = rt.session("a", "s1")
    await original.turn("before the reset")
    archived = await original.messages()
    await original.reset()
    await original.turn("after it")

    whole = await original.fork(generation=0, new_session="s1-g0")
    assert await whole.messages() == archived
    record = await whole.turn_record(archived[0].turn_id)
    assert record is not None and record.status == "completed"
    assert record.text == "noon, sunny v1, quiet"
    assert await whole.status() == "idle"
    assert await whole.turn("go on") == "noon, sunny v1, quiet"

    # Cut inside the archived turn: it runs on from there in the fork.
    reply = archived[1]
    assert isinstance(reply, AssistantMessage)
    cut = await original.fork(
        f"tool:1:{reply.tool_calls[2].id}", new_session="s1-g0-cut", generation=0
    )
    ran = dict(tools.ran)
    assert (await cut.redeliver()).text == "noon, sunny v1, quiet"
    assert tools.ran["news"] == ran["news"] + 1 and tools.ran["clock"] == ran["clock"]
    assert len(await original.messages()) == 6  # the live generation is untouched
    assert await original.generations() == [0]


async def test_a_fork_may_run_on_another_agent(open_runtime: Any) -> None:
    tools = Tools()
    rt = await open_runtime(tools.agent("a"), tools.agent("b", answer_prefix="B: "))
    original = rt.session("a", "s1")
    await original.turn("hi")
    fork = await original.fork("model:5", new_session="s1-b", agent="b")
    assert fork.agent.name == "b"
    assert (await fork.redeliver()).text == "B: noon, sunny v1, quiet"
    infos = {i.session_id: i for i in await rt.sessions()}
    assert infos["s1-b"].agent == "b" and infos["s1"].agent == "a"


async def test_fork_refusals_name_what_is_wrong(open_runtime: Any) -> None:
    tools = Tools()
    rt = await open_runtime(tools.agent())
    original = rt.session("a", "s1")
    await original.turn("hi")
    await rt.session("a", "taken").turn("hello")
    with pytest.raises(ConfigurationError, match="already exists"):
        await original.fork(new_session="taken")
    with pytest.raises(ValueError, match=r"outside the transcript \(1 to 6\)"):
        await original.fork(7, new_session="x")
    with pytest.raises(ValueError, match="no model step 'model:2'"):
        await original.fork("model:2", new_session="x")
    with pytest.raises(ValueError, match="no tool step 'tool:1:nope'"):
        await original.fork("tool:1:nope", new_session="x")
    with pytest.raises(ValueError, match="not 'input:t:x'"):
        await original.fork("input:t:x", new_session="x")
    with pytest.raises(ConfigurationError, match="no archived generation 3"):
        await original.fork(generation=3, new_session="x")
    with pytest.raises(ConfigurationError, match="unknown agent 'zz'"):
        await original.fork(agent="zz", new_session="x")
    with pytest.raises(ConfigurationError, match="does not exist"):
        await rt.session("a", "nobody").fork(new_session="x")
    # Nothing of a refused fork was stored.
    assert "x" not in {i.session_id for i in await rt.sessions()}
