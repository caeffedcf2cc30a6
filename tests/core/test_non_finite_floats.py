"""NaN and infinity from every way in: a tool's result, the model's tool arguments and
provider state, a remembered value. JSON has none, so each becomes ``None`` where the
value is made: the live turn, the stored transcript, the logged events and what a
stream sends a browser all agree, on every store."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from conftest import StoreFactory

import turnkit
from turnkit import ToolContext, tool
from turnkit._values.text import storable_json
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

NAN, INF = math.nan, math.inf


def test_storable_json_makes_non_finite_floats_none_and_keeps_finite_values_as_they_are() -> None:
    assert storable_json(NAN) is None
    assert storable_json(-INF) is None
    assert storable_json(1.5) == 1.5
    value = {"a": [INF, 2.0, {"b": NAN}], "c": (NAN,), "NaN": "Infinity"}
    assert storable_json(value) == {"a": [None, 2.0, {"b": None}], "c": (None,), "NaN": "Infinity"}
    finite = {"a": [1.0, "NaN", "Infinity"], "b": -0.0}
    assert storable_json(finite) == finite  # words that only spell the values: kept
    plain = {"x": [1, 2.5]}
    assert storable_json(plain) is plain


async def test_non_finite_floats_become_none_live_stored_and_streamed(
    make_store: StoreFactory,
) -> None:
    @tool
    async def measure(ctx: ToolContext, readings: list[float | None]) -> dict[str, Any]:
        """Measures."""
        await ctx.remember("peak", {"peak": INF})
        return {"mean": NAN, "readings": readings, "limit": -INF, "ok": 1.5}

    model = ScriptedModel(
        [
            ScriptedReply(
                tool_calls=[tool_call("measure", {"readings": [1.0, NAN, INF]})],
                provider_state={"score": NAN},
            ),
            "done",
        ]
    )
    agent = turnkit.Agent(name="m", model=model, tools=[measure])
    live: list[turnkit.TurnEvent] = []
    expected_result = {"mean": None, "readings": [1.0, None, None], "limit": None, "ok": 1.5}
    async with turnkit.Runtime(agent, store=make_store()) as runtime:
        session = runtime.session("m", "s1")
        session.subscribe(live.append)
        assert await session.turn("go") == "done"
        # What the model was sent next is what the store holds.
        sent = model.calls[1].messages
        [call_message, result_message] = sent[-2:]
        assert isinstance(call_message, turnkit.AssistantMessage)
        assert call_message.tool_calls[0].input == {"readings": [1.0, None, None]}
        assert call_message.provider_state == {"score": None}
        assert isinstance(result_message, turnkit.ToolMessage)
        assert result_message.result == expected_result
        logged = [e.to_dict() for e in await session.events()]
    # Another process reads the same: the transcript, the events, the memo.
    async with turnkit.Runtime(agent, store=make_store()) as runtime:
        session = runtime.session("m", "s1")
        stored = await session.messages()
        assert stored[-3:-1] == list(sent[-2:])
        assert [e.to_dict() for e in await session.events()] == logged
    completed = [e for e in live if isinstance(e, turnkit.ActionCompletedEvent)]
    assert completed[0].result == expected_result
    # Every event encodes as strict JSON (what a browser's JSON.parse accepts).
    for event in live:
        json.dumps(event.to_dict(), allow_nan=False)


async def test_rows_stored_with_nan_before_the_rule_read_back_as_none(tmp_path: Path) -> None:
    """Before the rule a store wrote the bare word ``NaN``; such a row still reads,
    and what is read back holds ``None``, so a stream of it is strict JSON."""

    @tool
    async def measure() -> dict[str, Any]:
        """Measures."""
        return {"mean": 1.5}

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("measure")]), "done"])
    agent = turnkit.Agent(name="m", model=model, tools=[measure])
    db = tmp_path / "old.db"
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as runtime:
        assert await runtime.session("m", "s1").turn("go") == "done"
    with sqlite3.connect(db) as conn:  # as the old encoder wrote it
        for table in ("turnkit_messages", "turnkit_events"):
            conn.execute(f"UPDATE {table} SET body = replace(body, '1.5', 'NaN')")
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as runtime:
        session = runtime.session("m", "s1")
        [result] = [m.result for m in await session.messages() if m.role == "tool"]
        assert result == {"mean": None}
        [completed] = [e for e in await session.events() if e.type == "action.completed"]
        assert isinstance(completed, turnkit.ActionCompletedEvent)
        assert completed.result == {"mean": None}
        json.dumps([e.to_dict() for e in await session.events()], allow_nan=False)
