"""Exporting a session to its versioned JSON and importing it again (issue 38), on
every store, and the refusals of a file that is not such a session."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_fork import approval_agent

import turnkit
from turnkit import ConfigurationError, SessionFileError, export_session, import_session
from turnkit.stores import SqliteStore

NO_MESSAGES = 2**31 - 1


async def parked_session(open_runtime: Any) -> tuple[turnkit.Runtime, dict[str, int]]:
    """A session with a completed turn, then a turn parked mid-batch."""
    ran = {"lookup": 0}
    rt = await open_runtime(approval_agent([], ran))
    session = rt.session("a", "s1")
    first = await session.result(session.start("refund it"))
    assert first.request is not None
    await session.resume(first.turn_id, first.request.id, True)
    assert (await session.result(first.turn_id)).text == "refunded"
    assert (await session.result(session.start("and again"))).status == "suspended"
    return rt, ran


async def test_export_then_import_gives_the_same_session(open_runtime: Any) -> None:
    rt, ran = await parked_session(open_runtime)
    exported = json.loads(json.dumps(await export_session(rt.store, "s1")))
    assert (exported["format"], exported["version"]) == ("turnkit.session", 1)
    assert [t["record"]["status"] for t in exported["turns"]] == ["completed", "suspended"]

    made = await import_session(rt.store, exported, session_id="s1-copy")
    assert (made.messages, made.turns) == (len(exported["messages"]), 2)
    assert made.events == len(exported["events"]) and made.events > 0
    original, copied = rt.session("a", "s1"), rt.session("a", "s1-copy")
    assert await copied.messages() == await original.messages()
    assert await copied.status() == "suspended"
    for turn in exported["turns"]:
        a = await original.turn_record(turn["turn_id"])
        b = await copied.turn_record(turn["turn_id"])
        assert a is not None and b is not None
        assert (a.status, a.text, a.pending, a.finished_at) == (
            b.status,
            b.text,
            b.pending,
            b.finished_at,
        )
        steps = await rt.store.session("s1-copy").load(turn["turn_id"], from_index=NO_MESSAGES)
        assert dict(steps.steps.items()) == turn["steps"]
    assert [e.to_dict() | {"session_id": "s1"} for e in await copied.events()] == exported["events"]
    # The imported park is answered like any other; lookup's result was carried.
    request = await copied.pending()
    parked = exported["turns"][1]["turn_id"]
    assert request is not None
    await copied.resume(parked, request.id, False)
    assert (await copied.result(parked)).text == "kept"
    assert ran["lookup"] == 2


async def test_import_into_another_store_and_replace(open_runtime: Any, tmp_path: Path) -> None:
    rt, _ = await parked_session(open_runtime)
    exported = await export_session(rt.store, "s1")
    other = SqliteStore(tmp_path / "other.db")
    async with turnkit.Runtime([approval_agent([], {"lookup": 0})], store=other) as rt2:
        await import_session(other, exported)
        assert await rt2.session("a", "s1").messages() == await rt.session("a", "s1").messages()
        with pytest.raises(ConfigurationError, match="'s1' already exists"):
            await import_session(other, exported)
        # A parked session is never replaced; a finished one is archived first.
        with pytest.raises(ConfigurationError, match="suspended; it cannot be replaced"):
            await import_session(other, exported, replace=True)
        (cancelled,) = await rt2.session("a", "s1").cancel()
        assert (await rt2.session("a", "s1").result(cancelled)).status == "cancelled"
        made = await import_session(other, exported, replace=True)
        assert made.archived_generation == 0
        assert await rt2.session("a", "s1").generations() == [0]
        assert await rt2.session("a", "s1").status() == "suspended"


def broken(exported: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(exported)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


async def test_a_malformed_file_is_refused_naming_the_field(open_runtime: Any) -> None:
    rt, _ = await parked_session(open_runtime)
    exported = await export_session(rt.store, "s1")
    cases = [
        (("format",), "turnkit.sessions", r"^format: expected 'turnkit.session'"),
        (("version",), 2, r"^version: the file is version 2; this turnkit reads up to 1"),
        (("version",), "1", r"^version: expected a whole number"),
        (("session_id",), "", r"^session_id: expected a non-empty string"),
        (("messages",), KeyError, r"^messages: expected a list, got NoneType"),
        (("messages", 1, "role"), "robot", r"^messages\[1\]: "),
        (("messages", 2, "call_id"), 7, r"^messages\[2\]: .*call_id"),
        (("turns", 1, "record", "status"), "done", r"^turns\[1\]\.record\.status: expected one"),
        (("turns", 0, "record", "opening"), None, r"^turns\[0\]\.record\.opening: expected an"),
        (("turns", 0, "steps"), [], r"^turns\[0\]\.steps: expected an object"),
        (("turns", 0, "record", "created_at"), "now", r"^turns\[0\]\.record\.created_at: "),
        (("events", 0), "x", r"^events\[0\]: "),
    ]
    for path, value, message in cases:
        with pytest.raises(SessionFileError, match=message):
            await import_session(rt.store, broken(exported, path, value), session_id="bad")
    with pytest.raises(SessionFileError, match=r"^the file: expected a JSON object, got list"):
        await import_session(rt.store, [], session_id="bad")
    assert "bad" not in {i.session_id for i in await rt.sessions()}
