"""Typed answers through both adapters, each the official SDK against a local server
speaking its provider's wire protocol: what the requests ask for (a forced output
tool, a JSON-schema response format), the answer parsed, and a refused answer
corrected on the next request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import anthropic_wire as aw
from fakes import openai_wire as ow
from fakes.server import FakeProvider
from pydantic import BaseModel, Field

import turnkit
from turnkit.models import anthropic, openai
from turnkit.models._strict_schema import strict_schema
from turnkit.stores import SqliteStore


class Line(BaseModel):
    item: str
    amount: int


class Invoice(BaseModel):
    """An invoice, as the model read it."""

    total: int = Field(ge=0)
    lines: list[Line]


class Draft(BaseModel):
    total: int
    note: str = ""  # optional: strict mode cannot take it


@turnkit.tool
def lookup(number: str) -> int:
    """Look an invoice's total up."""
    return 42


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


async def typed_turn(
    model: turnkit.Model, db: Path, output_type: type[Any] = Invoice, **options: Any
) -> turnkit.TurnResult:
    agent = turnkit.Agent(name="a", model=model, output_type=output_type, **options)
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session("a", "s1")
        return await session.result(await session.submit("read the invoice"))


GOOD = {"total": 5, "lines": [{"item": "tea", "amount": 5}]}


# -- Anthropic: the answer as a forced tool ------------------------------------


def claude(server: FakeProvider, **options: Any) -> turnkit.Model:
    return anthropic("claude-test", api_key="k", base_url=server.url, **options)


async def test_anthropic_forces_the_output_tool(server: FakeProvider, tmp_path: Path) -> None:
    server.add(aw.message(aw.ToolUse("tu_1", "final_answer", GOOD), stop_reason="tool_use"))
    result = await typed_turn(claude(server), tmp_path / "t.db")
    assert result.status == "completed" and result.output == Invoice.model_validate(GOOD)
    (request,) = server.bodies()
    assert request["tool_choice"] == {"type": "tool", "name": "final_answer"}
    (offered,) = request["tools"]
    assert offered["name"] == "final_answer"
    assert offered["input_schema"] == Invoice.model_json_schema()


async def test_anthropic_with_other_tools_forces_any_tool_and_corrects_a_refusal(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        aw.message(aw.ToolUse("tu_1", "lookup", {"number": "A1"}), stop_reason="tool_use"),
        aw.message(aw.ToolUse("tu_2", "final_answer", {"total": -1}), stop_reason="tool_use"),
        aw.message(aw.ToolUse("tu_3", "final_answer", GOOD), stop_reason="tool_use"),
    )
    result = await typed_turn(claude(server), tmp_path / "t.db", tools=[lookup])
    assert result.output == Invoice.model_validate(GOOD)
    bodies = server.bodies()
    assert [b["tool_choice"] for b in bodies] == [{"type": "any"}] * 3
    assert [t["name"] for t in bodies[0]["tools"]] == ["lookup", "final_answer"]
    # The third request carries the refusal as the output call's error result.
    last = bodies[2]["messages"][-1]["content"][-1]
    assert last["type"] == "tool_result" and last["tool_use_id"] == "tu_2"
    assert last["is_error"] is True
    assert "total: Input should be greater than or equal to 0" in last["content"]
    assert "lines: Field required" in last["content"]


async def test_anthropic_with_thinking_offers_the_tool_without_forcing_it(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        aw.message(aw.text("The total is 5."), stop_reason="end_turn"),
        aw.message(aw.ToolUse("tu_1", "final_answer", GOOD), stop_reason="tool_use"),
    )
    result = await typed_turn(claude(server, thinking=True), tmp_path / "t.db")
    assert result.output == Invoice.model_validate(GOOD)
    first, second = server.bodies()
    assert "tool_choice" not in first and first["tools"][0]["name"] == "final_answer"
    # The text reply was refused, and the model was told how to answer.
    told = second["messages"][-1]
    assert told["role"] == "user"
    assert "or by calling final_answer" in told["content"][-1]["text"]


async def test_a_later_turn_sends_the_answered_output_call_back_validly(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        aw.message(aw.ToolUse("tu_1", "final_answer", GOOD), stop_reason="tool_use"),
        aw.message(aw.ToolUse("tu_2", "final_answer", GOOD), stop_reason="tool_use"),
    )
    agent = turnkit.Agent(name="a", model=claude(server), output_type=Invoice)
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db")) as runtime:
        session = runtime.session("a", "s1")
        await session.turn_output("first", Invoice)
        await session.turn_output("second", Invoice)
    sent = server.bodies()[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[1]["content"][0]["type"] == "tool_use"
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert json.loads(sent[3]["content"][0]["text"]) == GOOD


# -- OpenAI: the answer as a JSON-schema response format -----------------------


def gpt(server: FakeProvider, **options: Any) -> turnkit.Model:
    return openai("gpt-test", api_key="k", base_url=server.url + "/v1", **options)


async def test_openai_asks_for_a_strict_json_schema_response(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(ow.completion(json.dumps(GOOD)[:10], json.dumps(GOOD)[10:]))
    result = await typed_turn(gpt(server), tmp_path / "t.db")
    assert result.output == Invoice.model_validate(GOOD)
    assert json.loads(result.text or "") == GOOD
    (request,) = server.bodies()
    assert "tools" not in request
    form = request["response_format"]
    assert form["type"] == "json_schema"
    assert form["json_schema"]["name"] == "final_answer"
    assert form["json_schema"]["strict"] is True
    schema = form["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Line"]["additionalProperties"] is False
    assert schema["required"] == ["total", "lines"]


async def test_openai_sends_a_schema_strict_mode_cannot_take_without_strict(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(ow.completion('{"total": 3}'))
    result = await typed_turn(gpt(server), tmp_path / "t.db", output_type=Draft)
    assert result.output == Draft(total=3)
    form = server.bodies()[0]["response_format"]["json_schema"]
    assert form["strict"] is False and form["schema"] == Draft.model_json_schema()


async def test_openai_corrects_a_refused_answer(server: FakeProvider, tmp_path: Path) -> None:
    server.add(ow.completion('{"total": -3, "lines": []}'), ow.completion(json.dumps(GOOD)))
    result = await typed_turn(gpt(server), tmp_path / "t.db")
    assert result.output == Invoice.model_validate(GOOD)
    second = server.bodies()[1]
    assert second["response_format"] == server.bodies()[0]["response_format"]
    refused, told = second["messages"][-2:]
    assert refused == {"role": "assistant", "content": '{"total": -3, "lines": []}'}
    assert told["role"] == "user"
    assert "total: Input should be greater than or equal to 0" in told["content"]


async def test_openai_retries_used_up_fail_the_turn(server: FakeProvider, tmp_path: Path) -> None:
    server.add(ow.completion("{"), ow.completion("[]"))
    result = await typed_turn(gpt(server), tmp_path / "t.db")
    assert result.status == "failed"
    assert result.error is not None and "1 of 1 retries used" in result.error
    assert "Input should be an object" in result.error
    assert len(server.requests) == 2


async def test_openai_without_structured_output_offers_the_tool(
    server: FakeProvider, tmp_path: Path
) -> None:
    call = ow.Call("call_1", "final_answer", json.dumps(GOOD))
    server.add(ow.completion(calls=[call], finish="tool_calls"))
    result = await typed_turn(gpt(server, structured_output=False), tmp_path / "t.db")
    assert result.output == Invoice.model_validate(GOOD)
    (request,) = server.bodies()
    assert "response_format" not in request
    assert [t["function"]["name"] for t in request["tools"]] == ["final_answer"]


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, True),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": []}, False),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, False),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "format": "uri"}},
                "required": ["a"],
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                "required": ["a"],
            },
            True,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/A", "description": "x"}},
                "required": ["a"],
                "$defs": {"A": {"type": "string"}},
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 2}},
                "required": ["a"],
            },
            False,
        ),
    ],
)
def test_strict_mode_takes_only_its_subset(schema: dict[str, Any], strict: bool) -> None:
    made = strict_schema(schema)
    assert (made is not None) is strict
    if made is not None:
        assert made["additionalProperties"] is False
        assert "additionalProperties" not in schema  # the given schema is left alone
