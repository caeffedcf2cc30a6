"""Token usage: both adapters read the provider's figures (the official SDKs against
local servers speaking the real wire protocols) onto each stored model step, and the
turn, the session, ``turnkit show`` and the HTTP transcript add them up from the store."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import anthropic_wire as aw
from fakes import openai_wire as ow
from fakes.server import FakeProvider

import turnkit
from turnkit import AssistantMessage, Usage
from turnkit.cli._progress import Progress
from turnkit.cli._render import render_session
from turnkit.cli._show import read_session, session_json
from turnkit.models import anthropic, openai
from turnkit.server._transcript import transcript_body
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


@turnkit.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


async def two_turns(agent: turnkit.Agent, db: Path) -> tuple[list[turnkit.TurnResult], Usage]:
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session(agent.name, "s1")
        results = [await session.result(session.start(text)) for text in ("2+3?", "thanks")]
        return results, await session.usage()


async def test_anthropic_usage_with_cache_figures_sums_per_turn_and_session(
    server: FakeProvider, tmp_path: Path
) -> None:
    figures = [
        aw.Tokens(input=30, output=11, cache_write=1000),
        aw.Tokens(input=8, output=5, cache_read=1000, cache_write=40),
        aw.Tokens(input=6, output=4, cache_read=1040),
    ]
    server.add(
        aw.message(
            aw.ToolUse("toolu_1", "add", {"a": 2, "b": 3}),
            stop_reason="tool_use",
            tokens=figures[0],
        ),
        aw.message(aw.text("5."), tokens=figures[1]),
        aw.message(aw.text("You're welcome."), tokens=figures[2]),
    )
    model = anthropic("claude-test", api_key="k", base_url=server.url)
    agent = turnkit.Agent(name="calc", model=model, instructions="Be brief.", tools=[add])
    (first, second), session_total = await two_turns(agent, tmp_path / "t.db")

    def expected(t: aw.Tokens) -> Usage:
        # Anthropic's input_tokens leave the cache out; turnkit's include it.
        return Usage(
            input_tokens=t.input + t.cache_read + t.cache_write,
            output_tokens=t.output,
            cache_read_tokens=t.cache_read,
            cache_write_tokens=t.cache_write,
        )

    assert first.usage == expected(figures[0]) + expected(figures[1])
    assert first.usage.cache_read_tokens == 1000 and first.usage.output_tokens == 16
    assert second.usage == expected(figures[2])
    assert session_total == first.usage + second.usage
    # The prompt cache is marked on the system prompt and the request's last block.
    body = server.requests[1].body
    assert body["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    last = body["messages"][-1]["content"][-1]
    assert last["type"] == "tool_result" and last["cache_control"] == {"type": "ephemeral"}
    assert sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1


async def test_openai_usage_is_asked_for_and_read_from_the_last_chunk(
    server: FakeProvider, tmp_path: Path
) -> None:
    figures = [
        ow.Tokens(prompt=50, completion=12, cached=0, reasoning=4),
        ow.Tokens(prompt=70, completion=3, cached=48),
        ow.Tokens(prompt=90, completion=5, cached=64, reasoning=2),
    ]
    server.add(
        ow.completion(
            calls=[ow.Call("call_a", "add", '{"a": 2, "b": 3}')],
            finish="tool_calls",
            tokens=figures[0],
        ),
        ow.completion("5.", tokens=figures[1]),
        ow.completion("Welcome.", tokens=figures[2]),
    )
    model = openai("gpt-test", api_key="k", base_url=server.url + "/v1")
    agent = turnkit.Agent(name="calc", model=model, tools=[add])
    (first, second), session_total = await two_turns(agent, tmp_path / "t.db")
    assert all(b["stream_options"] == {"include_usage": True} for b in server.bodies())

    def expected(t: ow.Tokens) -> Usage:
        return Usage(
            input_tokens=t.prompt,
            output_tokens=t.completion,
            cache_read_tokens=t.cached,
            reasoning_tokens=t.reasoning,
        )

    assert first.usage == expected(figures[0]) + expected(figures[1])
    assert second.usage == expected(figures[2])
    assert session_total.input_tokens == 210 and session_total.cache_read_tokens == 112
    assert session_total.reasoning_tokens == 6 and session_total.output_tokens == 20


async def test_openai_without_stream_usage_sends_no_option_and_reports_none(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(ow.completion("hi", tokens=None))
    model = openai("gpt-test", api_key="k", base_url=server.url + "/v1", stream_usage=False)
    agent = turnkit.Agent(name="calc", model=model)
    (result,), _ = await two_turns_one(agent, tmp_path / "t.db")
    assert "stream_options" not in server.bodies()[0]
    assert result.usage == Usage()


async def two_turns_one(agent: turnkit.Agent, db: Path) -> tuple[list[turnkit.TurnResult], Usage]:
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session(agent.name, "s1")
        return [await session.result(session.start("hi"))], await session.usage()


def scripted_agent() -> turnkit.Agent:
    model = ScriptedModel(
        [
            ScriptedReply(
                tool_calls=[tool_call("add", {"a": 1, "b": 2})],
                usage=Usage(input_tokens=100, output_tokens=10, cache_read_tokens=60),
            ),
            ScriptedReply(text="3", usage=Usage(input_tokens=120, output_tokens=2)),
        ]
    )
    return turnkit.Agent(name="calc", model=model, tools=[add])


async def test_scripted_usage_is_stored_and_read_back_in_a_new_runtime(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime([scripted_agent()], store=SqliteStore(db)) as runtime:
        session = runtime.session("calc", "s1")
        live = await session.result(session.start("1+2", turn_id="t1"))
        messages = await session.messages()
    assert live.usage == Usage(input_tokens=220, output_tokens=12, cache_read_tokens=60)
    replies = [m for m in messages if isinstance(m, AssistantMessage)]
    assert [r.usage for r in replies] == [
        Usage(input_tokens=100, output_tokens=10, cache_read_tokens=60),
        Usage(input_tokens=120, output_tokens=2),
    ]
    # Read from the store by a runtime that did not run it: the same figures.
    store = SqliteStore(db)
    async with turnkit.Runtime([scripted_agent()], store=store) as runtime:
        session = runtime.session("calc", "s1")
        assert (await session.result("t1")).usage == live.usage
        assert await session.usage() == live.usage
        snapshot = await store.session("s1").load("t1")
    assert snapshot.steps["model:1"]["usage"]["input_tokens"] == 100


def test_usage_refuses_negative_counts_and_adds_up() -> None:
    with pytest.raises(ValueError, match="input_tokens"):
        Usage(input_tokens=-1)
    total = Usage(input_tokens=1, output_tokens=2) + Usage(reasoning_tokens=3, output_tokens=3)
    assert total == Usage(input_tokens=1, output_tokens=5, reasoning_tokens=3)
    assert total.total_tokens == 6
    assert Usage.from_dict(total.to_dict()) == total
    assert Usage.from_dict({}) == Usage()


async def test_show_and_the_http_transcript_show_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    store = SqliteStore(db)
    async with turnkit.Runtime([scripted_agent()], store=store) as runtime:
        session = runtime.session("calc", "s1")
        await session.result(session.start("1+2", turn_id="t1"))
        body = await transcript_body(store.session("s1"), {})
    assert body["usage"]["input_tokens"] == 220 and body["usage"]["cache_read_tokens"] == 60
    assert body["messages"][1]["usage"]["output_tokens"] == 10
    store = SqliteStore(db)
    await store.open()
    try:
        view = await read_session(store, "s1", Progress(io.StringIO()), where=str(db))
    finally:
        await store.close()
    data = session_json(view, str(db))
    assert (
        data["usage"] == Usage(input_tokens=220, output_tokens=12, cache_read_tokens=60).to_dict()
    )
    assert data["turns"][0]["usage"]["output_tokens"] == 12
    text = render_session(view, store=str(db), store_flag="")
    assert re.search(r"^usage +220 in \(60 cached\), 12 out$", text, re.MULTILINE)
    assert "    usage: 220 in (60 cached), 12 out" in text
    assert "[100 in (60 cached), 10 out]" in text  # the first model step's own
