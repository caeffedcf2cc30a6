"""The Anthropic adapter: the official SDK against a local server speaking the Messages
API's wire protocol, through the engine on a real SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from fakes import anthropic_wire as wire
from fakes.server import FakeProvider
from fakes.thinking_child import AGENT, SESSION, TURN_ID, build_agent
from suite_paths import TESTS

import turnkit
from turnkit import ModelReply, StopReason, TriggerMessage, TurnResult, UserMessage
from turnkit.models import anthropic
from turnkit.stores import SqliteStore
from turnkit.testing import RecordingSink


@turnkit.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@turnkit.tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


def calc(
    server: FakeProvider, *, model_retry: turnkit.Retry | None = None, **options: Any
) -> turnkit.Agent:
    """The calculator agent; prompt caching is off unless asked for, so the request
    bodies these tests compare are the plain ones (caching has tests of its own)."""
    options.setdefault("cache", False)
    model = anthropic("claude-test", api_key="test-key", base_url=server.url, **options)
    return turnkit.Agent(
        name="calc",
        model=model,
        instructions="Be brief.",
        tools=[add, divide],
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


async def test_text_streams_as_several_deltas(server: FakeProvider, tmp_path: Path) -> None:
    server.add(wire.message(wire.text("Hel", "lo", " there.")))
    result, messages, sink = await run_turn(calc(server), tmp_path / "t.db", "hi")
    assert result.status == "completed" and result.text == "Hello there."
    deltas = [e.text for e in sink.events if e.type == "message.delta"]
    assert deltas == ["Hel", "lo", " there."]
    assert [m.role for m in messages] == ["user", "assistant"]
    (request,) = server.requests
    assert request.path == "/v1/messages"
    # Where the key goes differs by SDK version (x-api-key, or a bearer token).
    auth = request.headers.get("x-api-key", "") + request.headers.get("authorization", "")
    assert "test-key" in auth and "anthropic-version" in request.headers
    body = request.body
    assert body["model"] == "claude-test" and body["stream"] is True
    assert body["system"] == "Be brief." and "thinking" not in body
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert [t["name"] for t in body["tools"]] == ["add", "divide"]
    assert body["tools"][0]["input_schema"]["required"] == ["a", "b"]


async def test_a_two_step_tool_turn_runs_end_to_end(server: FakeProvider, tmp_path: Path) -> None:
    server.add(
        wire.message(
            wire.text("Adding."),
            wire.ToolUse("toolu_1", "add", {"a": 2, "b": 3}),
            stop_reason="tool_use",
        ),
        wire.message(wire.text("The sum", " is 5.")),
    )
    result, messages, _ = await run_turn(calc(server), tmp_path / "t.db", "2+3?")
    assert result.text == "The sum is 5."
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    asked = messages[1]
    assert isinstance(asked, turnkit.AssistantMessage)
    assert asked.stop == StopReason(kind="tool_use", raw="tool_use")
    assert asked.tool_calls[0].input == {"a": 2, "b": 3}  # assembled from streamed pieces
    assert asked.provider_state is None  # nothing to keep without thinking
    second = server.requests[1].body["messages"]
    assert second == [
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5", "is_error": False}
            ],
        },
    ]


async def test_tool_results_are_grouped_and_errors_flagged(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(
        wire.message(
            wire.ToolUse("toolu_1", "add", {"a": 1, "b": 1}),
            wire.ToolUse("toolu_2", "divide", {"a": 1, "b": 0}),
            stop_reason="tool_use",
        ),
        wire.message(wire.text("2, and 1/0 is undefined.")),
    )
    result, _, _ = await run_turn(calc(server), tmp_path / "t.db")
    assert result.status == "completed"
    messages = server.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    ok, failed = messages[2]["content"]  # both results in one user message
    assert ok == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "2",
        "is_error": False,
    }
    assert failed["tool_use_id"] == "toolu_2" and failed["is_error"] is True
    assert "ZeroDivisionError" in failed["content"]


async def test_thinking_blocks_round_trip_across_a_process_restart(
    server: FakeProvider, tmp_path: Path
) -> None:
    thinking = wire.Thinking(("The user wants", " the weather."), signature="sig-EqQBCgIYAh")
    redacted = wire.RedactedThinking("EmwKAhgBEgy3va3pzix")
    server.add(
        wire.message(
            thinking,
            redacted,
            wire.text("Checking."),
            wire.ToolUse("toolu_9", "forecast", {"city": "Oslo"}),
            stop_reason="tool_use",
        ),
        wire.message(wire.Thinking(("Clear skies.",), signature="sig-2"), wire.text("Clear.")),
    )
    db = tmp_path / "restart.db"
    child = subprocess.run(
        [sys.executable, "-m", "fakes.thinking_child", str(db), server.url],
        cwd=TESTS,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr  # killed after the tool step's commit
    assert len(server.requests) == 1
    first = server.requests[0].body
    assert first["thinking"] == {"type": "adaptive"}
    # A new process: a new runtime, model and client on the same SQLite file.
    async with turnkit.Runtime([build_agent(server.url)], store=SqliteStore(db)) as runtime:
        await runtime.recover()
        session = runtime.session(AGENT, SESSION)
        assert (await session.result(TURN_ID)).text == "Clear."
        messages = await session.messages()
    assert len(server.requests) == 2
    assistant = server.requests[1].body["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "The user wants the weather.",
                "signature": "sig-EqQBCgIYAh",
            },
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_9", "name": "forecast", "input": {"city": "Oslo"}},
        ],
    }
    assert server.requests[1].body["messages"][2]["content"][0]["tool_use_id"] == "toolu_9"
    final = messages[-1]
    assert isinstance(final, turnkit.AssistantMessage) and final.provider_state is not None


async def test_a_thinking_budget_asks_for_manual_extended_thinking(server: FakeProvider) -> None:
    server.add(wire.message(wire.text("ok")))
    model = anthropic("claude-test", thinking=2048, api_key="k", base_url=server.url)
    reply = await final_reply(model, [UserMessage(text="hi", turn_id="t")])
    assert reply.text == "ok"
    assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    with pytest.raises(turnkit.ConfigurationError, match="thinking budget"):
        anthropic("claude-test", thinking=100, api_key="k")


async def test_trigger_messages_are_sent_as_user_messages(server: FakeProvider) -> None:
    server.add(wire.message(wire.text("Report sent.")))
    model = anthropic("claude-test", api_key="k", base_url=server.url, cache=False)
    await final_reply(model, [TriggerMessage(text="daily report", turn_id="t", by="cron:daily")])
    body = server.requests[0].body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "daily report"}]}
    ]
    assert "system" not in body


async def final_reply(model: turnkit.Model, messages: list[turnkit.Message]) -> ModelReply:
    done = [d async for d in model.stream(messages, [], system=None) if d.type == "done"]
    assert len(done) == 1 and isinstance(done[0], turnkit.ModelDone)
    return done[0].reply


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("end_turn", "end_turn"),
        ("tool_use", "tool_use"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("pause_turn", "pause"),
        ("refusal", "refusal"),
        ("model_context_window_exceeded", "context_window"),
        ("a_reason_from_the_future", "other"),
    ],
)
async def test_every_stop_reason_is_normalized(server: FakeProvider, raw: str, kind: str) -> None:
    server.add(wire.message(wire.text("some text"), stop_reason=raw))
    model = anthropic("claude-test", api_key="k", base_url=server.url, cache=False)
    reply = await final_reply(model, [UserMessage(text="hi", turn_id="t")])
    assert reply.stop == StopReason(kind=kind, raw=raw)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["max_tokens", "refusal", "model_context_window_exceeded"])
async def test_an_abnormal_stop_fails_when_empty_and_commits_with_content(
    server: FakeProvider, tmp_path: Path, raw: str
) -> None:
    server.add(wire.message(stop_reason=raw), wire.message(wire.text("Partial"), stop_reason=raw))
    db = tmp_path / "t.db"
    failed, messages, _ = await run_turn(calc(server), db, turn_id="t1")
    assert failed.status == "failed"
    assert failed.error is not None and f"({raw}) and an empty reply" in failed.error
    assert [m.role for m in messages] == ["user"]  # nothing of the reply committed
    done, messages, _ = await run_turn(calc(server), db, turn_id="t1")  # redelivered: asks again
    assert done.status == "completed" and done.text == "Partial"
    assert len(server.requests) == 2
    last = messages[-1]
    assert isinstance(last, turnkit.AssistantMessage) and last.stop is not None
    assert last.stop.raw == raw and last.stop.abnormal


async def test_overload_and_rate_limit_are_retried(server: FakeProvider, tmp_path: Path) -> None:
    server.add(
        wire.error(529, "overloaded_error", "Overloaded"),
        wire.error(429, "rate_limit_error", "Number of request tokens has exceeded your limit"),
        wire.message(wire.text("Made it.")),
    )
    result, _, _ = await run_turn(calc(server, max_retries=2), tmp_path / "t.db")
    assert result.text == "Made it."
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0", "1", "2"]


async def test_what_the_retries_leave_fails_the_step_before_commit(
    server: FakeProvider, tmp_path: Path
) -> None:
    server.add(*[wire.error(529, "overloaded_error", "Overloaded")] * 2)
    db = tmp_path / "t.db"
    once = turnkit.Retry(attempts=1)  # no durable wait either
    failed, messages, _ = await run_turn(
        calc(server, max_retries=1, model_retry=once), db, turn_id="t1"
    )
    assert failed.status == "failed" and len(server.requests) == 2
    assert failed.error == (
        "model error: anthropic: HTTP 529 overloaded_error: Overloaded [request-id req_529]"
    )
    assert [m.role for m in messages] == ["user"]
    server.add(wire.message(wire.text("Back.")))
    done, _, _ = await run_turn(calc(server, max_retries=1), db, turn_id="t1")
    assert done.text == "Back."


async def test_an_overloaded_provider_parks_the_turn_for_its_retry_after(
    server: FakeProvider, tmp_path: Path
) -> None:
    """What the SDK's own retries leave waits durably, as long as the provider asked
    (``retry-after``), holding no process; then the step asks again."""
    an_hour = str(3600 * 1000)
    server.add(
        wire.error(429, "rate_limit_error", "Slow down", retry_after_ms=an_hour),
        wire.message(wire.text("Made it.")),
    )
    sink = RecordingSink()
    agent = calc(server, max_retries=0)
    async with turnkit.Runtime([agent], store=SqliteStore(tmp_path / "t.db"), sink=sink) as rt:
        session = rt.session("calc", "s1")
        parked = await session.result(session.start("go"))
        assert parked.status == "suspended" and parked.request is not None
        assert parked.request.kind == "timer" and parked.request.tool == ""
        assert parked.request.expires_at == pytest.approx(time.time() + 3600, abs=60)
        assert len(server.requests) == 1
        await rt.timers.fire_due(rt.store, now=time.time() + 3700)  # type: ignore[arg-type]

        async def completed() -> Any:
            record = await session._store.turn(parked.turn_id)
            return record if record is not None and record.status == "completed" else None

        record = await eventually(completed, what="the turn completed after its timer")
        assert record.text == "Made it."
    assert len(server.requests) == 2
    (retry,) = [e for e in sink.events if e.type == "step.retry"]
    assert retry.step_id == "model:1" and "HTTP 429" in retry.error


async def test_a_client_error_is_not_retried(server: FakeProvider, tmp_path: Path) -> None:
    server.add(
        wire.error(400, "invalid_request_error", "messages: text content blocks must be non-empty")
    )
    failed, _, _ = await run_turn(calc(server, max_retries=3), tmp_path / "t.db")
    assert len(server.requests) == 1
    assert failed.error is not None
    assert "HTTP 400 invalid_request_error: messages: text content blocks" in failed.error


@pytest.mark.parametrize(
    ("canned", "says"),
    [
        (
            wire.stream_error(wire.text("Hal")),
            "anthropic: the stream reported overloaded_error: Overloaded",
        ),
        (
            wire.message(wire.text("Hal"), finish=False),
            "anthropic: the stream ended before message_stop",
        ),
    ],
)
async def test_a_broken_stream_fails_the_step(
    server: FakeProvider, tmp_path: Path, canned: Any, says: str
) -> None:
    server.add(canned)
    failed, messages, sink = await run_turn(calc(server), tmp_path / "t.db")
    assert failed.status == "failed" and failed.error is not None and says in failed.error
    assert [m.role for m in messages] == ["user"]
    assert [e.text for e in sink.events if e.type == "message.delta"] == ["Hal"]  # shown live only


async def test_a_server_that_cannot_be_reached_is_a_model_error(tmp_path: Path) -> None:
    with FakeProvider() as gone:
        url = gone.url
    model = anthropic("claude-test", api_key="k", base_url=url, max_retries=0)
    with pytest.raises(turnkit.ModelError, match="anthropic: could not connect"):
        await final_reply(model, [UserMessage(text="hi", turn_id="t")])


async def test_kept_thinking_goes_back_only_while_thinking_is_on(server: FakeProvider) -> None:
    kept = [
        {"type": "thinking", "thinking": "hm", "signature": "sig"},
        {"type": "text", "text": "Earlier."},
    ]
    history: list[turnkit.Message] = [
        UserMessage(text="hi", turn_id="t0"),
        turnkit.AssistantMessage(
            text="Earlier.", turn_id="t0", provider_state={"anthropic": {"content": kept}}
        ),
        UserMessage(text="again", turn_id="t1"),
    ]
    server.add(wire.message(wire.text("a")), wire.message(wire.text("b")))
    for thinking in (True, False):
        model = anthropic("claude-test", thinking=thinking, api_key="k", base_url=server.url)
        await final_reply(model, history)
    on, off = (body["messages"][1]["content"] for body in server.bodies())
    assert on == kept
    assert off == [{"type": "text", "text": "Earlier."}]
