"""Pure position logic: where a turn stands, read off the transcript."""

from __future__ import annotations

from turnkit import AssistantMessage, ToolCall, ToolMessage, UserMessage
from turnkit._engine.position import (
    AppendOpening,
    CallModel,
    Finished,
    RunTools,
    has_opening_message,
    next_step,
    stale_calls,
)


def user(t: str) -> UserMessage:
    return UserMessage(text="hi", turn_id=t)


def asks(t: str, *call_ids: str) -> AssistantMessage:
    return AssistantMessage(
        text="", turn_id=t, tool_calls=tuple(ToolCall(id=c, name="x") for c in call_ids)
    )


def answer(t: str, call_id: str) -> ToolMessage:
    return ToolMessage(call_id=call_id, name="x", result=1, turn_id=t)


def says(t: str, text: str) -> AssistantMessage:
    return AssistantMessage(text=text, turn_id=t)


def test_empty_transcript_needs_the_opening() -> None:
    assert next_step([], "t") == AppendOpening()
    assert not has_opening_message([], "t")


def test_after_the_opening_the_model_is_asked() -> None:
    assert next_step([user("t")], "t") == CallModel(1)
    assert next_step([user("t0"), says("t0", "ok")], "t") == AppendOpening()
    assert next_step([user("t0"), says("t0", "ok"), user("t")], "t") == CallModel(3)


def test_owed_calls_come_from_the_transcript_in_order() -> None:
    log = [user("t"), asks("t", "a", "b", "c"), answer("t", "a")]
    assert next_step(log, "t") == RunTools(
        1, (ToolCall(id="b", name="x"), ToolCall(id="c", name="x"))
    )
    log += [answer("t", "c")]
    assert next_step(log, "t") == RunTools(1, (ToolCall(id="b", name="x"),))
    log += [answer("t", "b")]
    assert next_step(log, "t") == CallModel(5)
    assert next_step([*log, says("t", "done")], "t") == Finished("done")


def test_an_earlier_turns_open_calls_are_stale_not_owed() -> None:
    log = [user("t0"), asks("t0", "a", "b"), answer("t0", "a")]
    assert next_step(log, "t1") == AppendOpening()
    assert stale_calls(log, "t1") == (1, (ToolCall(id="b", name="x"),))
    assert stale_calls(log, "t0") is None
    assert stale_calls([*log, answer("t0", "b")], "t1") is None


def test_opening_is_found_only_in_the_turns_own_tail() -> None:
    log = [user("t0"), says("t0", "x"), user("t1"), asks("t1", "a"), answer("t1", "a")]
    assert has_opening_message(log, "t1")
    assert not has_opening_message(log, "t0")
    assert not has_opening_message(log, "t2")
