"""A model step keeps its reply in the form a replay reads back: the shortcut that
skips the JSON round trip for a reply made only of decoded JSON must answer exactly
as the round trip does, for every value a model could put in a call's input or its
provider state."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import from_json, to_json

import turnkit
from turnkit._engine.model_call import _decoded_json, stored_form


class _Text(str):
    """A str subclass: encodes as text, reads back as a plain str."""


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.builds(_Text, st.text(max_size=4)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.dictionaries(st.integers(0, 9), inner, max_size=2),
    ),
    max_leaves=12,
)


def _round_trip(reply: turnkit.ModelReply) -> turnkit.ModelReply:
    """What a replay reads back: the reply's stored JSON, decoded."""
    return turnkit.ModelReply.from_dict(from_json(to_json(reply.to_dict())))


def _same(a: Any, b: Any) -> bool:
    """Equal as the step's check compares (``==``: a str subclass equals its text),
    with NaN equal to NaN and the same kind of container at every level."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict | list | tuple) or isinstance(b, dict | list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(inputs=st.dictionaries(st.text(max_size=4), _values, max_size=4), state=_values)
def test_the_kept_reply_is_what_a_replay_reads_back(inputs: dict[str, Any], state: Any) -> None:
    # (copies: what is drawn must stay as drawn for hypothesis to replay it)
    call = turnkit.ToolCall(id="c1", name="t", input=copy.deepcopy(inputs))
    state = copy.deepcopy(state)
    provider_state = state if isinstance(state, dict) else {"s": state}
    reply = turnkit.ModelReply(text="ok", tool_calls=(call,), provider_state=provider_state)
    try:
        kept, record = stored_form(reply)
    except Exception:
        with pytest.raises(Exception):  # noqa: B017 (either way: refused by both)
            _round_trip(reply)
        return
    replayed = _round_trip(kept)
    assert _same(kept.to_dict(), replayed.to_dict())
    assert _same(record, kept.to_dict())


def test_decoded_json_knows_what_reads_back_equal() -> None:
    decoded = from_json(b'{"a": [1, 2.5, "x", true, null, {"b": -0.0}], "c": 12345678901234567890}')
    assert _decoded_json(decoded) and _decoded_json("text") and _decoded_json(None)
    for value in (
        {"a": (1, 2)},
        {1: "int key"},
        [math.inf],
        [math.nan],
        {"a": _Text("sub")},
        [object()],
    ):
        assert not _decoded_json(value), value


def test_decoded_json_leaves_deep_values_to_the_round_trip() -> None:
    deep: Any = "leaf"
    for _ in range(63):
        deep = [deep]
    assert _decoded_json(deep)  # 64 levels
    assert not _decoded_json([deep])  # 65: not known, the round trip decides


def test_a_reply_with_a_value_json_changes_is_rebuilt_as_it_reads_back() -> None:
    call = turnkit.ToolCall(id="c1", name="t", input={"pair": (1, 2), "n": math.inf})
    assert call.input["n"] is None  # (JSON has no infinity: None from the start)
    kept, record = stored_form(turnkit.ModelReply(text="ok", tool_calls=(call,)))
    assert kept.tool_calls[0].input == {"pair": [1, 2], "n": None}
    assert record["tool_calls"][0]["input"]["pair"] == [1, 2]
