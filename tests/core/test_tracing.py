"""OpenTelemetry spans (``turnkit.otel``) recorded by the SDK's in-memory exporter.

One turn through the Anthropic adapter (against a local server speaking its wire
protocol) gives a span tree with the GenAI semantic conventions' attributes; a turn
recovered after its process was SIGKILLed, and a turn parked in one process and
resumed in another, link to the trace the turn first opened in, which the store
kept with the turn. SQLite files and PostgreSQL, as in production.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracing_child as child
from fakes import anthropic_wire as wire
from fakes.server import FakeProvider
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from suite_paths import CHILDREN

import turnkit
from turnkit.cli._progress import Progress
from turnkit.cli._render import render_session
from turnkit.cli._show import read_session
from turnkit.models import anthropic
from turnkit.otel import OtelTracer
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

CHILD = CHILDREN / "tracing_child.py"


@turnkit.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@turnkit.tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


class Traced:
    """An SDK tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = OtelTracer(self.provider)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


def ids(span: ReadableSpan | None) -> tuple[int, int]:
    assert span is not None and span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def named_span(context: dict[str, str]) -> tuple[int, int]:
    """The trace and span ids a stored W3C context names."""
    assert set(context) <= {"traceparent", "tracestate"}
    version, trace_id, span_id, flags = context["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return int(trace_id, 16), int(span_id, 16)


async def test_one_turn_is_a_span_tree_with_genai_attributes(
    server: FakeProvider, traced: Traced, tmp_path: Path
) -> None:
    server.add(
        wire.message(
            wire.ToolUse("toolu_1", "add", {"a": 2, "b": 3}),
            wire.ToolUse("toolu_2", "divide", {"a": 1, "b": 0}),
            stop_reason="tool_use",
            tokens=wire.Tokens(input=100, output=20, cache_write=400),
        ),
        wire.message(
            wire.text("5, and 1/0 fails."),
            tokens=wire.Tokens(input=30, output=7, cache_read=400),
        ),
    )
    model = anthropic("claude-test", api_key="k", base_url=server.url)
    agent = turnkit.Agent(name="calc", model=model, tools=[add, divide])
    store = SqliteStore(tmp_path / "t.db")
    outer = traced.provider.get_tracer("test")
    async with turnkit.Runtime(agent, store=store, tracer=traced.tracer) as runtime:
        session = runtime.session("calc", "s1")
        with outer.start_as_current_span("request") as request:
            turn_id = session.start("2+3 and 1/0?", turn_id="t-1")
        result = await session.result(turn_id)
        assert result.text == "5, and 1/0 fails."
        stored = (await store.session("s1").load("t-1")).steps["trace:t-1"]
        view = await read_session(store, "s1", Progress(io.StringIO()), where="t.db")

    (turn,) = traced.named("invoke_agent")
    chats = traced.named("chat")
    tools = traced.named("execute_tool")
    assert turn.name == "invoke_agent calc"
    assert [c.name for c in chats] == ["chat claude-test"] * 2
    assert [t.name for t in tools] == ["execute_tool add", "execute_tool divide"]
    # The turn runs under the span of the code that started it, the steps under the turn.
    assert ids(turn)[0] == ids(request)[0] and parent_of(turn) == ids(request)[1]
    assert {parent_of(s) for s in chats + tools} == {ids(turn)[1]}
    assert turn.kind == trace.SpanKind.INTERNAL and not turn.links
    assert dict(turn.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "calc",
        "gen_ai.conversation.id": "s1",
        "turnkit.session.id": "s1",
        "turnkit.turn.id": "t-1",
        "turnkit.replayed": False,
        "turnkit.agent.version": agent.turn_version,
        "turnkit.turn.status": "completed",
        # The delivery's model steps, summed (input counts the cached tokens too).
        "gen_ai.usage.input_tokens": 500 + 430,
        "gen_ai.usage.output_tokens": 27,
        "gen_ai.usage.cache_read.input_tokens": 400,
        "gen_ai.usage.cache_creation.input_tokens": 400,
        "gen_ai.usage.reasoning.output_tokens": 0,
    }
    first = dict(chats[0].attributes or {})
    assert chats[0].kind == trace.SpanKind.CLIENT
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "claude-test"
    assert first["gen_ai.response.model"] == "claude-test"  # what the server said
    assert first["gen_ai.provider.name"] == "anthropic"
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["turnkit.step.id"] == "model:1"
    assert first["turnkit.replayed"] is False
    assert first["gen_ai.usage.input_tokens"] == 500  # as the server reported it
    assert first["gen_ai.usage.output_tokens"] == 20
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 400
    assert first["gen_ai.usage.cache_read.input_tokens"] == 0
    second = dict(chats[1].attributes or {})
    assert second["gen_ai.usage.input_tokens"] == 430
    assert second["gen_ai.usage.cache_read.input_tokens"] == 400
    assert second["turnkit.step.id"] == "model:4"
    added, divided = (dict(t.attributes or {}) for t in tools)
    assert added["gen_ai.tool.name"] == "add" and added["gen_ai.tool.call.id"] == "toolu_1"
    assert added["turnkit.step.id"] == "tool:1:toolu_1" and "error.type" not in added
    assert tools[0].status.status_code == trace.StatusCode.UNSET
    # A tool's error is its span's error, though the turn goes on.
    assert divided["error.type"] == "ZeroDivisionError"
    assert tools[1].status.status_code == trace.StatusCode.ERROR
    assert "division by zero" in (tools[1].status.description or "")
    # What the store keeps: the turn span's own context, for later deliveries.
    assert named_span(stored) == ids(turn)
    # ``turnkit show`` names it, so a turn's trace can be found from its session.
    shown = render_session(view, store="t.db", store_flag="")
    trace_id, span_id = ids(turn)
    assert re.search(rf"trace:t-1 +opened in trace {trace_id:032x} \(span {span_id:016x}\)", shown)


async def test_a_failed_model_step_fails_its_span_and_the_turn(
    traced: Traced, tmp_path: Path
) -> None:
    model = ScriptedModel([turnkit.ModelError("overloaded")])
    agent = turnkit.Agent(name="a", model=model)
    store = SqliteStore(tmp_path / "t.db")
    async with turnkit.Runtime(agent, store=store, tracer=traced.tracer) as rt:
        session = rt.session("a", "s1")
        result = await session.result(session.start("hi"))
    assert result.status == "failed"
    (chat,) = traced.named("chat")
    (turn,) = traced.named("invoke_agent")
    for span in (chat, turn):
        assert dict(span.attributes or {})["error.type"] == "turnkit.ModelError"
        assert span.status.status_code == trace.StatusCode.ERROR
    assert dict(turn.attributes or {})["turnkit.turn.status"] == "failed"


async def test_a_subagents_turn_runs_under_the_tool_call_that_asked_for_it(
    traced: Traced, tmp_path: Path
) -> None:
    def lead_reply(messages: Any) -> Any:
        if isinstance(messages[-1], turnkit.UserMessage):
            return ScriptedReply(tool_calls=[tool_call("researcher", {"task": "price?"})])
        return f"says: {messages[-1].result['text']}"

    lead = turnkit.Agent(
        name="lead",
        model=ScriptedModel(respond=lead_reply),
        tools=[turnkit.subagent("researcher", description="Looks things up.")],
    )
    researcher = turnkit.Agent(name="researcher", model=ScriptedModel(["$3."]))
    store = SqliteStore(tmp_path / "t.db")
    async with turnkit.Runtime([lead, researcher], store=store, tracer=traced.tracer) as rt:
        assert await rt.session("lead", "s1").turn("How much?") == "says: $3."
    (parent,) = traced.named("invoke_agent lead")
    (call,) = traced.named("execute_tool researcher")
    (child_turn,) = traced.named("invoke_agent researcher")
    assert parent_of(call) == ids(parent)[1]
    assert parent_of(child_turn) == ids(call)[1] and ids(child_turn)[0] == ids(parent)[0]
    assert dict(child_turn.attributes or {})["gen_ai.conversation.id"].startswith("s1/")


async def test_without_an_sdk_nothing_is_recorded_or_stored(tmp_path: Path) -> None:
    # The global provider is the API's own until an application sets an SDK's.
    store = SqliteStore(tmp_path / "t.db")
    agent = turnkit.Agent(name="a", model=ScriptedModel(["hi"]))
    async with turnkit.Runtime(agent, store=store, tracer=OtelTracer()) as rt:
        session = rt.session("a", "s1")
        assert (await session.result(session.start("hi", turn_id="t-1"))).text == "hi"
        steps = (await store.session("s1").load("t-1")).steps
    assert set(steps) == {"model:1", "policy:t-1"}


def test_a_runtime_refuses_a_tracer_that_is_not_one() -> None:
    agent = turnkit.Agent(name="a", model=ScriptedModel([]))
    with pytest.raises(turnkit.ConfigurationError, match="tracer must implement"):
        turnkit.Runtime(agent, store=MemoryStore(), tracer=object())  # type: ignore[arg-type]


# -- across processes ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "traced.db")
    dsn = request.getfixturevalue("pg_dsn")
    schema = request.getfixturevalue("pg_schema")
    return f"postgres:{schema}:{dsn}"


def run_child(spec: str, mode: str, spans: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), spec, mode, str(spans)],
        capture_output=True,
        text=True,
        timeout=120,  # only so a wedged child cannot hang the suite
        check=False,
    )


def exported(spans: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in spans.read_text().splitlines()]


def hex_ids(span: dict[str, Any]) -> tuple[int, int]:
    return int(span["context"]["trace_id"], 16), int(span["context"]["span_id"], 16)


async def stored_context(spec: str) -> tuple[int, int]:
    store = child.open_store(spec)
    await store.open()
    try:
        steps = (await store.session(child.SESSION).load(child.TURN_ID)).steps
        return named_span(steps[f"trace:{child.TURN_ID}"])
    finally:
        await store.close()


async def test_a_turn_recovered_after_sigkill_links_to_its_first_trace(
    spec: str, traced: Traced, tmp_path: Path
) -> None:
    spans = tmp_path / "spans.jsonl"
    killed = run_child(spec, "crash", spans)
    assert killed.returncode == -9, killed.stderr
    # The dead process exported its finished model step, not its turn span.
    (first_chat,) = exported(spans)
    assert first_chat["name"] == "chat"
    first_trace, _ = hex_ids(first_chat)
    first_turn = int(first_chat["parent_id"], 16)
    assert await stored_context(spec) == (first_trace, first_turn)

    async with turnkit.Runtime(
        child.build_agent(), store=child.open_store(spec), tracer=traced.tracer
    ) as runtime:
        (result,) = await runtime.recover()
    assert result.status == "completed"

    (turn,) = traced.named("invoke_agent")
    (tool,) = traced.named("execute_tool")
    (chat,) = traced.named("chat")
    (link,) = turn.links
    assert (link.context.trace_id, link.context.span_id) == (first_trace, first_turn)
    assert dict(link.attributes or {}) == {"turnkit.link": "turn.origin"}
    # A trace of its own (recover() ran under no span), the steps inside it.
    assert ids(turn)[0] != first_trace and turn.parent is None
    assert {ids(tool)[0], ids(chat)[0]} == {ids(turn)[0]}
    assert dict(turn.attributes or {})["turnkit.replayed"] is True
    # The call the dead process was running is the replayed step; the model step
    # it committed is not asked again, and the answer is new work.
    assert dict(tool.attributes or {})["turnkit.replayed"] is True
    assert dict(tool.attributes or {})["turnkit.step.id"] == "tool:1:call_1"
    assert dict(chat.attributes or {})["turnkit.replayed"] is False
    assert dict(chat.attributes or {})["turnkit.step.id"] == "model:3"
    # The stored context stays the first delivery's, for every later one.
    assert await stored_context(spec) == (first_trace, first_turn)


async def test_a_turn_resumed_in_another_process_links_to_the_trace_it_parked_in(
    spec: str, traced: Traced, tmp_path: Path
) -> None:
    spans = tmp_path / "spans.jsonl"
    parked = run_child(spec, "park", spans)
    assert parked.stdout == "suspended\n", parked.stderr
    by_name = {s["name"]: s for s in exported(spans)}
    assert set(by_name) == {"invoke_agent a", "chat", "execute_tool refund"}
    first = by_name["invoke_agent a"]
    assert first["attributes"]["turnkit.turn.status"] == "suspended"
    assert by_name["execute_tool refund"]["attributes"]["turnkit.step.outcome"] == "parked"
    assert by_name["execute_tool refund"]["status"]["status_code"] == "UNSET"

    outer = traced.provider.get_tracer("test")
    async with turnkit.Runtime(
        child.build_agent(), store=child.open_store(spec), tracer=traced.tracer
    ) as runtime:
        session = runtime.session(child.AGENT, child.SESSION)
        request = await session.pending()
        assert request is not None
        with outer.start_as_current_span("answer") as answer:
            await session.resume(request.turn_id, request.id, {"approved": True})
        result = await session.result(child.TURN_ID)
    assert result.text == "done: {'refunded': True}"

    (turn,) = traced.named("invoke_agent")
    (tool,) = traced.named("execute_tool")
    (chat,) = traced.named("chat")
    (link,) = turn.links
    assert (link.context.trace_id, link.context.span_id) == hex_ids(first)
    # Under the span of the code that answered, linked to where the turn parked.
    assert parent_of(turn) == ids(answer)[1] and ids(turn)[0] == ids(answer)[0]
    assert dict(turn.attributes or {})["turnkit.replayed"] is True
    assert dict(turn.attributes or {})["turnkit.turn.status"] == "completed"
    assert dict(tool.attributes or {})["turnkit.replayed"] is True
    assert dict(tool.attributes or {})["turnkit.step.outcome"] == "ok"
    assert dict(chat.attributes or {})["turnkit.replayed"] is False


async def test_calls_run_in_parallel_get_a_span_each_under_the_turn(
    traced: Traced, tmp_path: Path
) -> None:
    @turnkit.tool
    async def fetch(label: str) -> str:
        """Fetch one thing from a slow service."""
        await asyncio.sleep(0.05)  # not a wait: the slow service's work
        if label == "b":
            raise ValueError("b is gone")
        return f"got {label}"

    calls = [tool_call("fetch", {"label": label}) for label in ("a", "b", "c")]
    model = ScriptedModel([ScriptedReply(tool_calls=calls), "done"])
    agent = turnkit.Agent(name="calc", model=model, tools=[fetch])
    store = SqliteStore(tmp_path / "t.db")
    async with turnkit.Runtime(agent, store=store, tracer=traced.tracer) as runtime:
        assert await runtime.session("calc", "s1").turn("fetch three") == "done"
    (turn,) = traced.named("invoke_agent calc")
    spans = traced.named("execute_tool fetch")
    assert len(spans) == 3
    assert {parent_of(s) for s in spans} == {ids(turn)[1]}
    # They ran at the same time: each started before any of them ended.
    assert max(s.start_time or 0 for s in spans) < min(s.end_time or 0 for s in spans)
    failed = [s for s in spans if not s.status.is_ok]
    assert len(failed) == 1 and "b is gone" in (failed[0].status.description or "")


# -- the history policy's summary calls ----------------------------------------------


class Summarizing(ScriptedModel):
    """A scripted model with a name, so its span is ``chat summarizer-1``."""

    model = "summarizer-1"
    provider = "scripted"


def summary_reply(messages: Any) -> ScriptedReply:
    return ScriptedReply(
        text=f"summary of {len(messages[0].text)} chars",
        usage=turnkit.Usage(input_tokens=100, output_tokens=9, cache_read_tokens=40),
    )


def chat_reply(messages: Any) -> ScriptedReply:
    return ScriptedReply(
        text="noted " + "w" * 80, usage=turnkit.Usage(input_tokens=10, output_tokens=2)
    )


async def test_a_summary_call_has_a_chat_span_of_its_own(traced: Traced, tmp_path: Path) -> None:
    summarizer = Summarizing(respond=summary_reply)
    policy = turnkit.SummarizeOlder(max_tokens=60, summarizer=turnkit.Summarizer(model=summarizer))
    agent = turnkit.Agent(name="s", model=ScriptedModel(respond=chat_reply), history=policy)
    store = SqliteStore(tmp_path / "t.db")
    async with turnkit.Runtime(agent, store=store, tracer=traced.tracer) as rt:
        session = rt.session("s", "s1")
        results = [
            await session.result(session.start(f"note {n} " + "n" * 80, turn_id=f"t-{n}"))
            for n in range(4)
        ]
    assert summarizer.calls, "the policy made no summary"
    summaries = traced.named("chat summarizer-1")
    assert len(summaries) == len(summarizer.calls)
    turns = {dict(t.attributes or {})["turnkit.turn.id"]: t for t in traced.named("invoke_agent")}
    for span in summaries:
        attributes = dict(span.attributes or {})
        turn = turns[attributes["turnkit.turn.id"]]
        assert parent_of(span) == ids(turn)[1] and ids(span)[0] == ids(turn)[0]
        assert span.kind == trace.SpanKind.CLIENT
        assert re.fullmatch(
            rf"history:{attributes['turnkit.turn.id']}:\d+", attributes["turnkit.step.id"]
        )
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "summarizer-1"
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["gen_ai.usage.input_tokens"] == 100
        assert attributes["gen_ai.usage.output_tokens"] == 9
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == 40
        assert attributes["turnkit.replayed"] is False
        assert attributes["turnkit.step.outcome"] == "ok"
        # The summary is made before the model step it is for, not inside its span.
        step = next(
            s
            for s in traced.named("chat")
            if s.name == "chat" and parent_of(s) == ids(turn)[1] and s.start_time >= span.end_time
        )
        assert dict(step.attributes or {})["turnkit.step.id"].startswith("model:")
    # Each turn span sums its summary calls' tokens with its model steps', as the
    # turn's result does.
    for result in results:
        turn = turns[result.turn_id]
        children = [s for s in traced.named("chat") if parent_of(s) == ids(turn)[1]]
        attributes = dict(turn.attributes or {})
        assert attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
        assert attributes["gen_ai.usage.input_tokens"] == sum(
            dict(s.attributes or {})["gen_ai.usage.input_tokens"] for s in children
        )
        assert attributes["gen_ai.usage.output_tokens"] == result.usage.output_tokens
    assert sum(r.usage.input_tokens for r in results) == 100 * len(summaries) + 10 * 4


@pytest.mark.parametrize("died_in", ["call", "model"])
async def test_a_summary_replays_as_a_model_step_does(
    died_in: str, traced: Traced, tmp_path: Path
) -> None:
    spec, spans = str(tmp_path / "traced.db"), tmp_path / "spans.jsonl"
    killed = run_child(spec, f"summary-{died_in}", spans)
    assert killed.returncode == -9, killed.stderr
    made = [
        s["attributes"]["turnkit.turn.id"]
        for s in exported(spans)
        if s["name"] == "chat summarizer"
    ]
    assert made  # the earlier turns' summaries, and t-1's if it committed
    assert made.count(child.TURN_ID) == (1 if died_in == "model" else 0)

    async with turnkit.Runtime(
        child.build_summarizing_agent(), store=child.open_store(spec), tracer=traced.tracer
    ) as runtime:
        (result,) = await runtime.recover()
    assert result.status == "completed"
    (turn,) = traced.named("invoke_agent")
    summaries = traced.named("chat summarizer")
    (step,) = [s for s in traced.named("chat") if s.name == "chat"]
    assert dict(turn.attributes or {})["turnkit.replayed"] is True
    if died_in == "call":
        # The summary call the dead process was making is made again: the first
        # step this delivery runs, so the replayed one; the model step is new work.
        (summary,) = summaries
        attributes = dict(summary.attributes or {})
        assert attributes["turnkit.step.id"].startswith(f"history:{child.TURN_ID}:")
        assert attributes["turnkit.replayed"] is True
        assert parent_of(summary) == ids(turn)[1]
        assert dict(step.attributes or {})["turnkit.replayed"] is False
    else:
        # The summary committed before the crash is read back, not made again: no
        # span (the dead delivery exported one), and the model step is the replay.
        assert summaries == []
        assert dict(step.attributes or {})["turnkit.replayed"] is True
