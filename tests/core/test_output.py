"""Typed answers through the engine: ``Agent(output_type=...)`` with the scripted model
(which has no structured output of its own, so it gets the answer as a tool), a model
that takes the ``output`` keyword, validation retries, and the answer read back from
the store by another runtime, after a crash too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from server_support import serving
from typing_extensions import TypedDict  # pydantic wants this one before Python 3.12

import turnkit
from turnkit import (
    AssistantMessage,
    ConfigurationError,
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    OutputSpec,
    ToolMessage,
    ToolSpec,
    TriggerMessage,
    TurnError,
    TurnFailedError,
)
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call


class Invoice(BaseModel):
    """An invoice's total."""

    total: int = Field(ge=0)
    currency: str


@dataclass
class Point:
    x: int
    y: int


class Person(TypedDict):
    name: str
    age: int


@turnkit.tool
def lookup(number: str) -> dict[str, Any]:
    """Look an invoice up."""
    return {"number": number, "total": 42}


def answer(**fields: Any) -> ScriptedReply:
    return ScriptedReply(tool_calls=[tool_call("final_answer", fields)])


def invoices(model: turnkit.Model, *, retries: int = 1) -> turnkit.Agent:
    return turnkit.Agent(
        name="a", model=model, tools=[lookup], output_type=Invoice, output_retries=retries
    )


@pytest.fixture
async def runtime_for(tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[turnkit.Runtime] = []

    async def open_(agent: turnkit.Agent, store: Store | None = None) -> turnkit.Runtime:
        runtime = turnkit.Runtime([agent], store=store or SqliteStore(tmp_path / "t.db"))
        await runtime.__aenter__()
        opened.append(runtime)
        return runtime

    yield open_
    for runtime in reversed(opened):
        await runtime.__aexit__(None, None, None)


async def test_an_answer_given_with_the_output_tool_is_parsed(runtime_for: Any) -> None:
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=[tool_call("lookup", {"number": "A1"})]),
            answer(total=42, currency="EUR"),
        ]
    )
    sink = RecordingSink()
    rt = turnkit.Runtime([invoices(model)], store=MemoryStore(), sink=sink)
    async with rt:
        session = rt.session("a", "s1")
        invoice = await session.turn_output("what is A1's total?", Invoice)
        assert invoice == Invoice(total=42, currency="EUR")
        messages = await session.messages()
    # Without native support the model is offered the answer as one more tool.
    offered = model.calls[0].tools
    assert [t.name for t in offered] == ["lookup", "final_answer"]
    assert offered[1].input_schema == Invoice.model_json_schema()
    # The answer's call gets its result, then the answer as the turn's last message.
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    accepted, last = messages[4], messages[5]
    assert isinstance(accepted, ToolMessage) and accepted.name == "final_answer"
    assert not accepted.is_error
    assert isinstance(last, AssistantMessage) and last.tool_calls == ()
    assert Invoice.model_validate_json(last.text) == invoice
    assert sink.types()[-5:] == [
        "message.completed",
        "action.requested",
        "action.completed",
        "message.completed",
        "turn.completed",
    ]
    completed = sink.events[-1]
    assert completed.type == "turn.completed" and completed.text == last.text
    seqs = [e.seq for e in sink.events if e.seq]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_a_json_text_reply_is_an_answer_too(runtime_for: Any) -> None:
    agent = turnkit.Agent(
        name="a", model=ScriptedModel(['```json\n{"x": 1, "y": 2}\n```']), output_type=Point
    )
    rt = await runtime_for(agent)
    session = rt.session("a", "s1")
    tid = await session.submit("where?")
    result = await session.result(tid)
    assert result.status == "completed" and result.output == Point(1, 2)
    assert result.output_as(Point) == Point(1, 2)
    with pytest.raises(TypeError, match="not a Invoice"):
        result.output_as(Invoice)


async def test_a_typed_dict_answer(runtime_for: Any) -> None:
    model = ScriptedModel([answer(name="Ada", age="36")])
    agent = turnkit.Agent(name="a", model=model, output_type=Person)
    rt = await runtime_for(agent)
    person = await rt.session("a", "s1").turn_output("who?", Person)
    assert person == {"name": "Ada", "age": 36}


async def test_a_refused_answer_is_shown_to_the_model_which_corrects_it(runtime_for: Any) -> None:
    model = ScriptedModel(
        [answer(total=-5, currency="EUR"), "not JSON at all", answer(total=5, currency="EUR")]
    )
    rt = await runtime_for(invoices(model, retries=2))
    session = rt.session("a", "s1")
    assert await session.turn_output("total?", Invoice) == Invoice(total=5, currency="EUR")
    # The second call saw the first answer's error as the output call's result ...
    refused = model.calls[1].messages[-1]
    assert isinstance(refused, ToolMessage) and refused.is_error
    assert "total: Input should be greater than or equal to 0" in refused.result["error"]
    # ... and the third saw the text reply, then a message saying what was wrong.
    told = model.calls[2].messages[-1]
    assert isinstance(told, TriggerMessage) and told.by == "turnkit:output"
    assert "Invalid JSON" in told.text and "final_answer" in told.text
    # All of it is in the transcript, so a replay shows the model the same.
    roles = [m.role for m in await session.messages()]
    assert roles == [
        *["user", "assistant", "tool"],
        *["assistant", "trigger"],
        *["assistant", "tool", "assistant"],
    ]


async def test_retries_used_up_fail_the_turn_with_the_error(runtime_for: Any) -> None:
    model = ScriptedModel([answer(total="lots", currency="EUR"), answer(currency="EUR")])
    rt = await runtime_for(invoices(model, retries=1))
    session = rt.session("a", "s1")
    with pytest.raises(TurnFailedError) as failed:
        await session.turn_output("total?", Invoice)
    error = failed.value.error
    assert "does not fit Invoice (1 of 1 retries used)" in error
    assert "total: Field required" in error
    result = await session.result(failed.value.turn_id)
    assert result.status == "failed" and result.output is None
    # The last answer was never committed: the transcript ends at the first refusal.
    assert [m.role for m in await session.messages()] == ["user", "assistant", "tool"]


async def test_no_retries_fails_at_the_first_refused_answer(runtime_for: Any) -> None:
    rt = await runtime_for(invoices(ScriptedModel(["{}"]), retries=0))
    with pytest.raises(TurnFailedError, match=r"0 of 0 retries used\): total: Field required"):
        await rt.session("a", "s1").turn_output("total?", Invoice)


async def test_the_output_tool_with_other_tools_is_refused_and_the_others_run(
    runtime_for: Any,
) -> None:
    both = ScriptedReply(
        tool_calls=[
            tool_call("lookup", {"number": "A1"}),
            tool_call("final_answer", {"total": 1, "currency": "EUR"}),
        ]
    )
    model = ScriptedModel([both, answer(total=42, currency="EUR")])
    rt = await runtime_for(invoices(model))
    session = rt.session("a", "s1")
    assert (await session.turn_output("total?", Invoice)).total == 42
    seen = model.calls[1].messages
    results = {m.name: m for m in seen if isinstance(m, ToolMessage)}
    assert results["lookup"].result == {"number": "A1", "total": 42}
    assert results["final_answer"].is_error
    assert "call final_answer once and alone" in results["final_answer"].result["error"]


class NativeModel:
    """A model with structured output of its own: it takes the ``output`` keyword."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.asked: list[tuple[tuple[str, ...], OutputSpec | None]] = []

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[ModelDelta]:
        self.asked.append((tuple(t.name for t in tools), output))
        yield ModelDone(reply=ModelReply(text=self.replies.pop(0)))


async def test_a_native_model_gets_the_spec_and_no_extra_tool(runtime_for: Any) -> None:
    model = NativeModel(['{"total": "x"}', '{"total": 7, "currency": "USD"}'])
    rt = await runtime_for(invoices(model))
    assert await rt.session("a", "s1").turn_output("total?", Invoice) == Invoice(
        total=7, currency="USD"
    )
    (tools, spec), _ = model.asked
    assert tools == ("lookup",)
    assert spec is not None and spec.name == "final_answer"
    assert spec.schema == Invoice.model_json_schema()
    messages = await rt.session("a", "s1").messages()
    told = messages[2]
    # Natively asked, the model is told to answer with JSON, not to call a tool.
    assert isinstance(told, TriggerMessage) and "Give it as its JSON alone" in told.text


async def test_the_answer_is_read_back_from_the_store_by_another_runtime(
    make_store: Any,
) -> None:
    model = ScriptedModel([answer(total=3, currency="EUR")])
    async with turnkit.Runtime([invoices(model)], store=make_store()) as rt:
        session = rt.session("a", "s1")
        tid = await session.submit("total?")
        first = await session.result(tid)
    # Another "process": a fresh runtime over the same store, whose model is never asked.
    later = invoices(ScriptedModel([]))
    async with turnkit.Runtime([later], store=make_store()) as rt:
        again = await rt.session("a", "s1").result(tid)
    assert again.output == first.output == Invoice(total=3, currency="EUR")
    assert again.text == first.text


async def test_the_http_chat_answer_carries_the_output(runtime_for: Any) -> None:
    rt = await runtime_for(invoices(ScriptedModel([answer(total=3, currency="EUR")])))
    async with serving(rt) as served:
        reply = await served.client.post(
            served.path("a", "s1", "chat"), json={"text": "total?"}, headers={"X-User": "ann"}
        )
    body = reply.json()
    assert body["status"] == "completed", body
    assert body["output"] == {"total": 3, "currency": "EUR"} == json.loads(body["text"])


class Crash(Exception):
    """What the crashing store raises in place of dying."""


def crash() -> None:
    raise Crash


async def test_a_replay_after_a_crash_does_not_ask_the_model_again(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    # Commit 1 queues the turn, 2 opens it, 3 is the refused answer with its error.
    store = CrashingStore(SqliteStore(db), crash_at=3, when="after", on_crash=crash)
    first = ScriptedModel([answer(total=-1, currency="EUR")])
    async with turnkit.Runtime([invoices(first)], store=store) as rt:
        with pytest.raises(Crash):
            await rt.session("a", "s1").turn_output("total?", Invoice, turn_id="t1")
    second = ScriptedModel([answer(total=1, currency="EUR")])
    async with turnkit.Runtime([invoices(second)], store=SqliteStore(db)) as rt:
        (result,) = await rt.recover()
        assert result.output == Invoice(total=1, currency="EUR")
        assert await rt.session("a", "s1").result("t1") == result
    assert len(first.calls) == 1
    # The refused step was committed, so the replay asked only for the next one.
    (call,) = second.calls
    assert isinstance(call.messages[-1], ToolMessage) and call.messages[-1].is_error


async def test_a_crash_before_the_answer_commits_asks_again(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = CrashingStore(SqliteStore(db), crash_at=3, when="before", on_crash=crash)
    first = ScriptedModel([answer(total=1, currency="EUR")])
    async with turnkit.Runtime([invoices(first)], store=store) as rt:
        with pytest.raises(Crash):
            await rt.session("a", "s1").turn_output("total?", Invoice, turn_id="t1")
    second = ScriptedModel([answer(total=2, currency="EUR")])
    async with turnkit.Runtime([invoices(second)], store=SqliteStore(db)) as rt:
        (result,) = await rt.recover()
    assert result.output == Invoice(total=2, currency="EUR") and len(second.calls) == 1


async def test_turn_output_checks_the_type_before_running(runtime_for: Any) -> None:
    model = ScriptedModel([])
    rt = await runtime_for(invoices(model))
    with pytest.raises(ConfigurationError, match=r"turn_output\(Point\).*output_type="):
        await rt.session("a", "s1").turn_output("where?", Point)
    assert model.calls == [] and await rt.session("a", "s1").status() == "new"


async def test_an_answer_that_no_longer_fits_its_type_says_so(runtime_for: Any) -> None:
    rt = await runtime_for(invoices(ScriptedModel([answer(total=3, currency="EUR")])))
    tid = await rt.session("a", "s1").submit("total?")
    await rt.session("a", "s1").result(tid)
    changed = turnkit.Agent(name="a", model=ScriptedModel([]), output_type=Point)
    other = await runtime_for(changed)
    with pytest.raises(TurnError, match="stored answer does not fit Point"):
        await other.session("a", "s1").result(tid)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"output_type": str}, "must be a pydantic model, a dataclass or a TypedDict"),
        ({"output_type": list[Invoice]}, "an answer is a JSON object"),
        ({"output_type": object()}, "has no JSON schema pydantic can make"),
        ({"output_type": Invoice, "output_retries": -1}, "output_retries must be an int"),
        ({"output_type": Invoice, "output_retries": True}, "output_retries must be an int"),
        ({"output_retries": 1.5}, "output_retries must be an int"),
    ],
)
def test_bad_output_settings_are_refused_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        turnkit.Agent(name="a", model=ScriptedModel([]), **options)


def test_a_tool_named_like_the_output_tool_is_refused() -> None:
    @turnkit.tool
    def final_answer(text: str) -> str:
        """Clash."""
        return text

    with pytest.raises(ConfigurationError, match="'final_answer'"):
        turnkit.Agent(name="a", model=ScriptedModel([]), tools=[final_answer], output_type=Invoice)


def test_an_agent_without_output_type_has_no_output_spec() -> None:
    assert turnkit.Agent(name="a", model=ScriptedModel([])).output_spec is None
    spec = invoices(ScriptedModel([])).output_spec
    assert spec is not None and spec.tool().input_schema == spec.schema
