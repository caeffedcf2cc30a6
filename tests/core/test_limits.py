"""``Agent(limits=...)``: a turn over its model-step, tool-call or token cap stops
before the next model call (or before the tool batch that would cross it) as a failed
turn saying which limit it reached; the counts come from the store, so a redelivery
in a new runtime stops at the same point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

import turnkit
from turnkit import Limits, Usage
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

RAN: list[int] = []


@turnkit.tool
def step(n: int) -> int:
    """Record a step."""
    RAN.append(n)
    return n


def busy(transcript: Sequence[turnkit.Message]) -> ScriptedReply:
    """Two tool calls per step, each step reporting 100 tokens, until told to stop."""
    last = transcript[-1]
    if isinstance(last, turnkit.UserMessage) and last.text == "just answer":
        return ScriptedReply(text="done", usage=Usage(input_tokens=90, output_tokens=10))
    calls = [tool_call("step", {"n": len(transcript)}), tool_call("step", {"n": -len(transcript)})]
    return ScriptedReply(tool_calls=calls, usage=Usage(input_tokens=90, output_tokens=10))


def agent(model: ScriptedModel, **options: object) -> turnkit.Agent:
    return turnkit.Agent(name="busy", model=model, tools=[step], **options)  # type: ignore[arg-type]


async def run(agent: turnkit.Agent, db: Path, text: str, turn_id: str) -> turnkit.TurnResult:
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session(agent.name, "s1")
        return await session.result(session.start(text, turn_id=turn_id))


async def test_a_tool_batch_past_the_cap_does_not_run(tmp_path: Path) -> None:
    RAN.clear()
    model = ScriptedModel(respond=busy)
    result = await run(agent(model, limits=Limits(tool_calls=3)), tmp_path / "t.db", "go", "t1")
    assert result.status == "failed"
    assert result.error == (
        "the turn's model asked for 2 more tool call(s) after 2, past agent 'busy''s "
        "limit of 3 tool calls; none of them ran"
    )
    assert len(RAN) == 2 and len(model.calls) == 2  # the second batch never ran


async def test_a_token_cap_stops_before_the_next_model_call_in_every_process(
    tmp_path: Path,
) -> None:
    RAN.clear()
    db = tmp_path / "t.db"
    model = ScriptedModel(respond=busy)
    limited = agent(model, limits=Limits(tokens=250))
    result = await run(limited, db, "go", "t1")
    assert result.status == "failed" and len(model.calls) == 3
    assert result.usage.total_tokens == 300
    assert result.error == (
        "the turn used 300 tokens, reaching agent 'busy''s limit of 250 tokens; it "
        "stopped before the next model call"
    )
    # Redelivered by a new runtime: the usage is read from the store, so no new call.
    again = ScriptedModel(respond=busy)
    redelivered = await run(agent(again, limits=Limits(tokens=250)), db, "go", "t1")
    assert redelivered.status == "failed" and redelivered.error == result.error
    assert again.calls == []
    # The session stays usable: the next turn counts from nothing.
    fresh = ScriptedModel(respond=busy)
    answered = await run(agent(fresh, limits=Limits(tokens=250)), db, "just answer", "t2")
    assert answered.status == "completed" and answered.text == "done"


async def test_model_steps_and_max_steps_are_one_limit(tmp_path: Path) -> None:
    model = ScriptedModel(respond=busy)
    assert agent(model, max_steps=3).limits == Limits(model_steps=3)
    assert agent(model, limits=Limits(model_steps=2)).max_steps == 2
    assert agent(model, max_steps=2, limits=Limits(model_steps=2, tokens=9)).limits == Limits(
        model_steps=2, tokens=9
    )
    with pytest.raises(turnkit.ConfigurationError, match="disagree"):
        agent(model, max_steps=3, limits=Limits(model_steps=2))
    with pytest.raises(turnkit.ConfigurationError, match=r"Limits\.tokens must be a positive"):
        Limits(tokens=0)
    with pytest.raises(turnkit.ConfigurationError, match=r"must be a turnkit\.Limits"):
        agent(model, limits={"tokens": 5})
    result = await run(agent(model, limits=Limits(model_steps=2)), tmp_path / "t.db", "go", "t1")
    assert result.error == "the turn reached agent 'busy''s limit of 2 model steps"
    assert len(model.calls) == 2


def test_an_agent_folder_sets_limits_as_a_dict(tmp_path: Path) -> None:
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / "instructions.md").write_text("Be busy.")
    (folder / "agent.py").write_text('agent = {"limits": {"tool_calls": 4, "tokens": 1000}}\n')
    loaded = turnkit.load_agent(folder, model=ScriptedModel(["hi"]))
    assert loaded.limits == Limits(tool_calls=4, tokens=1000)
    (folder / "agent.py").write_text('agent = {"limits": {"calls": 4}}\n')
    with pytest.raises(turnkit.ConfigurationError, match=r"unknown limit\(s\) \['calls'\]"):
        turnkit.load_agent(folder, model=ScriptedModel(["hi"]))
