"""The OpenAI adapter: the official SDK against a local server speaking Chat Completions'
streaming wire protocol (the one OpenAI-compatible servers copy), through the engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import openai_wire as wire
from fakes.server import FakeProvider

import turnkit
from turnkit import ModelReply, StopReason, ToolCall, TurnResult, UserMessage
from turnkit.models import openai
from turnkit.stores import SqliteStore
from turnkit.testing import RecordingSink, ScriptedModel, ScriptedReply

RAN: list[str] = []


@turnkit.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    RAN.append("add")
    return a + b


@turnkit.tool
def note(text: str) -> str:
    """Write a note."""
    RAN.append("note")
    return "noted"


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    RAN.clear()
    with FakeProvider() as provider:
        yield provider


def calc(
    server: FakeProvider, *, model_retry: turnkit.Retry | None = None, **options: Any
) -> turnkit.Agent:
    model = openai("gpt-test", api_key="test-key", base_url=server.url + "/v1", **options)
    return turnkit.Agent(
        name="calc",
        model=model,
        instructions="Be brief.",
        tools=[add, note],
        model_retry=model_retry,
    )


async def run_turn(
    agent: turnkit.Agent, db: Path, text: str = "go", *, turn_id: str | None = None
) -> tuple[TurnResult, list[turnkit.Message], RecordingSink]:
    sink = RecordingSink()
    async with turnkit.Runtime([agent], store=SqliteStore(db), sink=sink) as runtime:
        session = runtime.session(agent.name, "s1")
        result = await session.result(session.start(text, turn_id=turn_id))
        return result, await session.messages(), sink


async def final_reply(model: turnkit.Model) -> ModelReply:
    messages = [UserMessage(text="hi", turn_id="t")]
    done = [d async for d in model.stream(messages, [], system=None) if d.type == "done"]
    assert len(done) == 1 and isinstance(done[0], turnkit.ModelDone)
    return done[0].reply


async def test_text_streams_as_several_deltas(server: FakeProvider, tmp_path: Path) -> None:
    server.add(wire.completion("Hel", "lo", " there."))
    result, _, sink = await run_turn(calc(server), tmp_path / "t.db", "hi")
    assert result.text == "Hello there."
    assert [e.text for e in sink.events if e.type == "message.delta"] == ["Hel", "lo", " there."]
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test-key"
    body = request.body
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": add.spec.input_schema,
        },
    }
    assert "max_completion_tokens" not in body


async def test_a_two_step_tool_turn_assembles_streamed_arguments(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        wire.completion(
            "On it.",
            calls=[
                wire.Call("call_a", "add", '{"a": 2, "b": 3}'),
                wire.Call("call_b", "note", '{"text": "sum asked"}'),
            ],
            finish="tool_calls",
        ),
        wire.completion("5, and noted."),
    )
    result, messages, _ = await run_turn(calc(server), tmp_path / "t.db", "2+3?")
    assert result.text == "5, and noted." and RAN == ["add", "note"]
    asked = messages[1]
    assert isinstance(asked, turnkit.AssistantMessage)
    assert [(c.id, c.input) for c in asked.tool_calls] == [
        ("call_a", {"a": 2, "b": 3}),
        ("call_b", {"text": "sum asked"}),
    ]
    assert asked.stop == StopReason(kind="tool_use", raw="tool_calls")
    second = server.requests[1].body["messages"]
    assert second[2] == {
        "role": "assistant",
        "content": "On it.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "note", "arguments": '{"text": "sum asked"}'},
            },
        ],
    }
    assert second[3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "noted"},
    ]


async def test_malformed_arguments_become_an_error_result_the_model_can_correct(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        wire.completion(calls=[wire.Call("call_1", "add", '{"a": 2, "b": ')], finish="tool_calls"),
        wire.completion(
            calls=[wire.Call("call_2", "add", '{"a": 2, "b": 3}')], finish="tool_calls"
        ),
        wire.completion("5."),
    )
    result, messages, sink = await run_turn(calc(server), tmp_path / "t.db")
    assert result.status == "completed" and result.text == "5."
    assert RAN == ["add"]  # the unreadable call never ran the tool
    bad = messages[2]
    assert isinstance(bad, turnkit.ToolMessage) and bad.is_error
    error = bad.result["error"]
    assert error.startswith("invalid arguments for add: they were not valid JSON")
    assert error.endswith('Received: {"a": 2, "b":')
    completed = [e for e in sink.events if e.type == "action.completed"]
    assert completed[0].error == error and completed[1].error is None
    resent = server.requests[1].body["messages"]
    assert resent[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert json.loads(resent[3]["content"]) == {"error": error}


@pytest.mark.parametrize(
    ("arguments", "why"),
    [("[1, 2]", "a JSON list, not an object"), ('"two"', "a JSON str, not an object")],
)
async def test_arguments_that_are_json_but_no_object_are_refused(
    server: FakeProvider, arguments: str, why: str
) -> None:
    server.add(wire.completion(calls=[wire.Call("c", "add", arguments)], finish="tool_calls"))
    (call,) = (await final_reply(calc(server).model)).tool_calls
    assert call.input == {} and call.provider_state is not None
    assert why in call.provider_state["input_error"]


async def test_the_engine_answers_a_call_with_an_input_error_without_running_it(
    tmp_path: Path,
) -> None:
    broken = ToolCall(id="c1", name="add", input={}, provider_state={"input_error": "bad args"})
    model = ScriptedModel([ScriptedReply(tool_calls=[broken]), "ok"])
    agent = turnkit.Agent(name="calc", model=model, tools=[add])
    RAN.clear()
    result, messages, _ = await run_turn(agent, tmp_path / "t.db")
    assert result.text == "ok" and RAN == []
    assert messages[2] == turnkit.ToolMessage(
        call_id="c1",
        name="add",
        result={"error": "bad args"},
        turn_id=result.turn_id,
        is_error=True,
    )


@pytest.mark.parametrize(
    ("finish", "kind"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("content_filter", "content_filter"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("a_reason_from_the_future", "other"),
    ],
)
async def test_every_finish_reason_is_normalized(
    server: FakeProvider, finish: str, kind: str
) -> None:
    server.add(wire.completion("some text", finish=finish))
    reply = await final_reply(calc(server).model)
    assert reply.stop == StopReason(kind=kind, raw=finish)  # type: ignore[arg-type]
    assert reply.model == "gpt-test"  # the model the server says answered


async def test_a_refusal_is_the_reply_text_with_a_refusal_stop(server: FakeProvider) -> None:
    server.add(wire.completion(refusal="I can't help with that."))
    reply = await final_reply(calc(server).model)
    assert reply.text == "I can't help with that."
    assert reply.stop == StopReason(kind="refusal", raw="stop")


async def test_reasoning_from_compatible_servers_streams_as_reasoning(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(wire.completion("4.", reasoning=["2+2 ", "is 4"]))
    result, _, sink = await run_turn(calc(server), tmp_path / "t.db")
    assert result.text == "4."
    assert [e.text for e in sink.events if e.type == "reasoning.delta"] == ["2+2 ", "is 4"]


@pytest.mark.parametrize("finish", ["length", "content_filter"])
async def test_an_abnormal_stop_fails_when_empty_and_commits_with_content(
    server: FakeProvider, tmp_path: Path, finish: str
) -> None:
    server.add(wire.completion(finish=finish), wire.completion("Partial", finish=finish))
    db = tmp_path / "t.db"
    failed, messages, _ = await run_turn(calc(server), db, turn_id="t1")
    assert failed.status == "failed" and failed.error is not None
    assert f"({finish}) and an empty reply" in failed.error
    assert [m.role for m in messages] == ["user"]
    done, messages, _ = await run_turn(calc(server), db, turn_id="t1")
    assert done.text == "Partial" and len(server.requests) == 2


async def test_a_stream_without_a_finish_reason_fails_the_step(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(wire.completion("Hal", finish=None))
    failed, messages, _ = await run_turn(calc(server), tmp_path / "t.db")
    assert failed.error is not None and "the stream ended without a finish_reason" in failed.error
    assert [m.role for m in messages] == ["user"]


async def test_rate_limits_and_5xx_are_retried(server: FakeProvider, tmp_path: Path) -> None:
    server.add(
        wire.error(429, "Rate limit reached", code="rate_limit_exceeded"),
        wire.error(503, "The server is overloaded"),
        wire.completion("Made it."),
    )
    result, _, _ = await run_turn(calc(server, max_retries=2), tmp_path / "t.db")
    assert result.text == "Made it." and len(server.requests) == 3


async def test_what_the_retries_leave_fails_the_step_before_commit(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(*[wire.error(429, "Rate limit reached", code="rate_limit_exceeded")] * 2)
    db = tmp_path / "t.db"
    once = turnkit.Retry(attempts=1)  # no durable wait after the SDK's own retries
    agent = calc(server, max_retries=1, model_retry=once)
    failed, messages, _ = await run_turn(agent, db, turn_id="t1")
    assert len(server.requests) == 2 and [m.role for m in messages] == ["user"]
    label = f"openai-compatible server {server.url}/v1/"
    assert failed.error == f"model error: {label}: HTTP 429 rate_limit_exceeded: Rate limit reached"
    server.add(wire.completion("Back."))
    done, _, _ = await run_turn(calc(server, max_retries=1), db, turn_id="t1")
    assert done.text == "Back."


async def test_a_local_server_needs_no_key(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.add(wire.completion("hi"))
    model = openai("llama3.2:3b", base_url=server.url + "/v1", max_tokens=256)
    assert (await final_reply(model)).text == "hi"
    assert server.requests[0].headers["authorization"] == "Bearer unused"
    assert server.requests[0].body["max_completion_tokens"] == 256


async def test_without_a_key_or_server_the_error_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(turnkit.ConfigurationError, match="OPENAI_API_KEY"):
        openai("gpt-test")
