"""Messages, replies and events round-trip through JSON exactly, and bad JSON is named."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import turnkit
from turnkit import (
    AssistantMessage,
    MessageDecodeError,
    ModelReply,
    StopReason,
    ToolCall,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    event_from_dict,
    message_from_dict,
)
from turnkit._values.messages import STOP_KINDS

json_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=4)
ids = st.text(min_size=1, max_size=20)
stops = st.none() | st.builds(
    StopReason, kind=st.sampled_from(sorted(STOP_KINDS)), raw=st.none() | st.text(max_size=10)
)
calls = st.builds(
    ToolCall, id=ids, name=ids, input=json_objects, provider_state=st.none() | json_objects
)
messages = st.one_of(
    st.builds(UserMessage, text=st.text(), turn_id=ids),
    st.builds(TriggerMessage, text=st.text(), turn_id=ids, by=ids),
    st.builds(
        AssistantMessage,
        text=st.text(),
        turn_id=ids,
        tool_calls=st.lists(calls, max_size=3).map(tuple),
        stop=stops,
        provider_state=st.none() | json_objects,
    ),
    st.builds(
        ToolMessage, call_id=ids, name=ids, result=json_values, turn_id=ids, is_error=st.booleans()
    ),
)


@given(messages)
def test_every_message_round_trips_through_json(message: turnkit.Message) -> None:
    wire = json.loads(json.dumps(message.to_dict()))
    assert message_from_dict(wire) == message


@given(
    st.builds(
        ModelReply,
        text=st.text(),
        tool_calls=st.lists(calls, max_size=3).map(tuple),
        stop=stops,
        provider_state=st.none() | json_objects,
    )
)
def test_model_replies_round_trip(reply: ModelReply) -> None:
    assert ModelReply.from_dict(json.loads(json.dumps(reply.to_dict()))) == reply


def test_events_round_trip() -> None:
    msg = AssistantMessage(text="hi", turn_id="t", tool_calls=(ToolCall(id="c", name="n"),))
    events: list[turnkit.TurnEvent] = [
        turnkit.TurnStartedEvent(turn_id="t", session_id="s", text="go", seq=1),
        turnkit.MessageCompletedEvent(turn_id="t", session_id="s", message=msg, seq=2),
        turnkit.ActionRequestedEvent(turn_id="t", session_id="s", call=msg.tool_calls[0], seq=3),
        turnkit.ActionCompletedEvent(
            turn_id="t", session_id="s", call_id="c", name="n", result={"error": "x"}, error="x"
        ),
        turnkit.TurnCompletedEvent(turn_id="t", session_id="s", text="done"),
        turnkit.TurnFailedEvent(turn_id="t", session_id="s", error="boom"),
        turnkit.MessageDeltaEvent(turn_id="t", session_id="s", text="h"),
        turnkit.ReasoningDeltaEvent(turn_id="t", session_id="s", text="r"),
        turnkit.InputAnsweredEvent(
            turn_id="t", session_id="s", input_id="i", call_id="c", by="U1", value={"ok": 1}
        ),
        turnkit.InputAnsweredEvent(
            turn_id="t", session_id="s", input_id="i", call_id="c", by=None, value=None, seq=9
        ),
        turnkit.DeliveryFailedEvent(
            turn_id="t",
            session_id="s",
            channel="slack",
            target="C1",
            method="chat.update",
            error="token_revoked",
        ),
        turnkit.DeliveryFailedEvent(
            turn_id="t", session_id="s", channel="x", target="#y", method=None, error="E: e"
        ),
    ]
    for event in events:
        wire = json.loads(json.dumps(event.to_dict()))
        assert wire["type"] == event.type
        back = event_from_dict(wire)
        assert back == event and back.at == event.at


def test_events_carry_the_time_they_happened_and_old_ones_decode_without() -> None:
    before = time.time()
    event = turnkit.TurnStartedEvent(turn_id="t", session_id="s", text="go", seq=1)
    assert event.at is not None and before <= event.at <= time.time()
    wire = event.to_dict()
    assert wire["at"] == event.at
    # An event logged before events carried a time still decodes; its time is unknown.
    del wire["at"]
    old = event_from_dict(wire)
    assert old.at is None and old == event  # the time takes no part in equality


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ([], "message: expected a JSON object, got list"),
        ({"turn_id": "t"}, "message: missing field 'role'"),
        ({"role": "robot", "turn_id": "t"}, "unknown role 'robot'"),
        ({"role": "user", "text": "x"}, "user message: missing field 'turn_id'"),
        ({"role": "user", "turn_id": "t", "text": 3}, "field 'text' must be str, got int"),
        (
            {"role": "tool", "turn_id": "t", "call_id": "c", "name": "n", "is_error": False},
            "tool message: missing field 'result'",
        ),
        (
            {"role": "assistant", "turn_id": "t", "text": "", "tool_calls": [{"id": "c"}]},
            "tool call: missing field 'name'",
        ),
        (
            {
                "role": "assistant",
                "turn_id": "t",
                "text": "",
                "tool_calls": [],
                "stop": {"kind": "sleepy"},
            },
            "stop reason: unknown kind 'sleepy'",
        ),
    ],
)
def test_malformed_messages_name_what_is_wrong(data: Any, error: str) -> None:
    with pytest.raises(MessageDecodeError, match=error.replace("(", r"\(").replace(")", r"\)")):
        message_from_dict(data)


def test_an_unknown_event_type_is_read_whole_and_written_back_as_it_came() -> None:
    logged = {"type": "turn.exploded", "turn_id": "t", "session_id": "s", "seq": 4, "x": [1]}
    event = event_from_dict(logged)
    assert isinstance(event, turnkit.UnknownEvent)
    assert (event.name, event.type, event.seq) == ("turn.exploded", "unknown", 4)
    assert event.to_dict() == logged
    with pytest.raises(MessageDecodeError, match=r"turn_id and session_id must be strings"):
        event_from_dict({"type": "turn.exploded"})
    with pytest.raises(MessageDecodeError, match=r"type must be a non-empty string"):
        event_from_dict({"type": 3, "turn_id": "t", "session_id": "s"})


def test_a_field_a_newer_version_added_to_a_known_event_is_left_out() -> None:
    event = event_from_dict(
        {"type": "turn.failed", "turn_id": "t", "session_id": "s", "error": "x", "new": 1}
    )
    assert isinstance(event, turnkit.TurnFailedEvent) and event.error == "x"


def test_stop_reason_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown stop kind"):
        StopReason(kind="nap")  # type: ignore[arg-type]
    assert StopReason(kind="refusal").abnormal and not StopReason(kind="end_turn").abnormal
