"""The durable records (suspend checkpoint, tool step result, input answer) and the
step ids: exact stored forms, forms written by earlier versions, and bad data named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkit import Answerers, InboundEvent, InputRequest, MessageDecodeError, User
from turnkit._values.checkpoints import (
    InputAnswer,
    SuspendCheckpoint,
    ToolStepResult,
)
from turnkit._values.messages import (
    AssistantMessage,
    TriggerMessage,
    UserMessage,
    opening_from_dict,
)
from turnkit._values.policy import TurnPolicy
from turnkit._values.step_ids import (
    input_step_id,
    model_step_id,
    policy_step_id,
    relayed_input_id,
    step_kind,
    step_position,
    tool_step_id,
)
from turnkit._values.text import storable_json

REQUEST = InputRequest(
    id="ok",
    prompt="Refund?",
    turn_id="t1",
    call_id="c1",
    tool="refund",
    answerers=(Answerers.user("u1"),),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def _stored(value: dict[str, Any]) -> str:
    """The bytes a store keeps (key order included), as the engine's encoder makes them."""
    return json.dumps(value, separators=(",", ":"))


def test_a_checkpoint_keeps_its_stored_form_exactly() -> None:
    checkpoint = SuspendCheckpoint(
        request=REQUEST,
        call_id="c1",
        opening_text="refund order 7",
        event=InboundEvent(source="slack", text="refund order 7", user=User(id="u1")),
        policy=TurnPolicy(source="slack", system="Be brief.", deny_tools=frozenset({"b", "a"})),
        generation=2,
    )
    stored = checkpoint.to_dict()
    assert list(stored) == [
        "request",
        "call_id",
        "opening_text",
        "event",
        "policy",
        "generation",
        "requests",
    ]
    assert stored["requests"] == [REQUEST.to_dict()]
    assert stored["policy"] == {"source": "slack", "system": "Be brief.", "deny_tools": ["a", "b"]}
    assert SuspendCheckpoint.from_dict(json.loads(_stored(stored))) == checkpoint


def test_a_checkpoint_written_before_policies_and_generations_still_reads() -> None:
    old = {
        "request": REQUEST.to_dict(),
        "call_id": "c1",
        "opening_text": "refund order 7",
        "event": None,
    }
    checkpoint = SuspendCheckpoint.from_dict(old)
    assert checkpoint.policy is None and checkpoint.generation == 0
    assert checkpoint.request == REQUEST and checkpoint.event is None


def test_a_checkpoint_of_several_requests_answers_them_one_by_one() -> None:
    other = InputRequest(id="ok@c2", prompt="Refund too?", turn_id="t1", call_id="c2", tool="r")
    checkpoint = SuspendCheckpoint(
        request=REQUEST,
        call_id="c1",
        opening_text="x",
        event=None,
        policy=TurnPolicy(),
        requests=(REQUEST, other),
    )
    assert SuspendCheckpoint.from_dict(json.loads(_stored(checkpoint.to_dict()))) == checkpoint
    assert checkpoint.find("ok@c2") == other and checkpoint.find("nope") is None
    left = checkpoint.without("ok")
    assert (left.request, left.call_id, left.requests) == (other, "c2", (other,))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (None, "expected a JSON object with a request"),
        ({"request": REQUEST.to_dict(), "requests": {}}, "requests must be a list"),
        ({"call_id": "c1"}, "expected a JSON object with a request"),
        ({"request": {"id": "ok"}}, "input request: missing or malformed field"),
        ({"request": REQUEST.to_dict(), "generation": "2"}, "generation must be an integer"),
        ({"request": REQUEST.to_dict(), "generation": True}, "generation must be an integer"),
        ({"request": REQUEST.to_dict(), "policy": []}, "turn policy: expected a JSON object"),
    ],
)
def test_a_bad_checkpoint_is_named(data: Any, match: str) -> None:
    with pytest.raises(MessageDecodeError, match=match):
        SuspendCheckpoint.from_dict(data)


def test_a_stored_opening_reads_back_as_the_message_it_was() -> None:
    trigger = TriggerMessage(text="nightly", turn_id="t1", by="cron")
    assert opening_from_dict(trigger.to_dict(), "t1") == trigger
    user = UserMessage(text="hi", turn_id="t1")
    assert opening_from_dict(json.loads(json.dumps(user.to_dict())), "t1") == user
    # What a fork of a generation whose opening was lost stored before openings were typed.
    assert opening_from_dict({"text": ""}, "t7") == UserMessage(text="", turn_id="t7")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (AssistantMessage(text="x", turn_id="t1").to_dict(), "expected a user or trigger"),
        ({"text": 3}, "text must be a string"),
        ({"role": "user", "turn_id": "t1"}, "missing field 'text'"),
        ("hi", "expected a JSON object"),
    ],
)
def test_a_bad_stored_opening_is_named(data: Any, match: str) -> None:
    with pytest.raises(MessageDecodeError, match=match):
        opening_from_dict(data, "t1")


@given(result=json_values, error=st.none() | st.text())
def test_a_tool_step_result_round_trips_in_its_stored_form(result: Any, error: str | None) -> None:
    step = ToolStepResult(result=result, error=error)
    # Any NUL or lone surrogate reads U+FFFD: that is what any store can keep.
    assert _stored(step.to_dict()) == _stored(storable_json({"result": result, "error": error}))
    assert ToolStepResult.from_dict(json.loads(_stored(step.to_dict()))) == step


@given(value=json_values, by=st.none() | st.text())
def test_an_input_answer_round_trips_in_its_stored_form(value: Any, by: str | None) -> None:
    answer = InputAnswer(value=value, by=by)
    assert _stored(answer.to_dict()) == _stored(storable_json({"value": value, "by": by}))
    assert InputAnswer.from_dict(json.loads(_stored(answer.to_dict()))) == answer


@pytest.mark.parametrize(
    ("cls", "data", "match"),
    [
        (ToolStepResult, {"error": None}, "tool step: expected a JSON object with a result"),
        (ToolStepResult, {"result": 1, "error": 2}, "tool step: error must be a string"),
        (InputAnswer, ["yes"], "input answer: expected a JSON object with a value"),
        (InputAnswer, {"value": 1, "by": 7}, "input answer: by must be a string"),
    ],
)
def test_a_bad_step_record_is_named(cls: Any, data: Any, match: str) -> None:
    with pytest.raises(MessageDecodeError, match=match):
        cls.from_dict(data)


def test_step_ids_keep_their_stored_formats() -> None:
    assert model_step_id(3) == "model:3"
    assert tool_step_id(3, "call_1") == "tool:3:call_1"
    assert input_step_id("t1", "ok") == "input:t1:ok"
    assert policy_step_id("t1") == "policy:t1"
    assert relayed_input_id("tool:3:call_1", "ok") == "tool:3:call_1/ok"
    kinds = [step_kind(s) for s in ("model:3", "tool:3:c:x", "input:t1:ok", "policy:t1")]
    assert kinds == ["model", "tool", "input", "policy"]
    positions = [step_position(s) for s in ("model:3", "tool:12:c:1", "input:5:ok", "tool:x:c")]
    assert positions == [3, 12, None, None]
