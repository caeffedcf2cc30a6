"""Agent versions: a turn parked under one version and resumed under another, for
each kind of change, with the documented outcome, on every store."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import pytest
from cli_support import turnkit as turnkit_cli
from pydantic import Field
from server_support import serving

import turnkit
from turnkit import (
    ToolContext,
    ToolMessage,
    TurnHeldEvent,
    TurnVersionChangedEvent,
    UserMessage,
    VersionChange,
    tool,
)
from turnkit.stores import PutTurn, SqliteStore, TurnRecord
from turnkit.testing import CrashingStore, RecordingSink, ScriptedModel, ScriptedReply, tool_call

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


#: A narrower schema for the order id: digits only.
DigitsOnly = Annotated[str, Field(pattern="^[0-9]+$")]


class NamedModel(ScriptedModel):
    """A scripted model with a model id, as a provider's adapter has one."""

    def __init__(self, model: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model


@dataclass
class Ledger:
    refunded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def respond(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": last.text})])
    if isinstance(last, ToolMessage):
        return f"done: {last.result}"
    return "?"


def make_agent(
    ledger: Ledger,
    *,
    instructions: str = "Refund orders.",
    with_refund: bool = True,
    extra_tool: bool = False,
    narrowed: bool = False,
    model: str = "model-1",
    version: str | None = None,
    on_version_change: Any = None,
) -> turnkit.Agent:
    async def ask(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        answer = await ctx.request_input("approve", f"Refund {order_id}?", schema=APPROVAL)
        if answer["approved"]:
            ledger.refunded.append(order_id)
        return {"refunded": answer["approved"]}

    if not narrowed:

        @tool
        async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
            """Refund an order once a person approves it."""
            return await ask(order_id, ctx)

    else:

        @tool
        async def refund(order_id: DigitsOnly, ctx: ToolContext) -> dict[str, Any]:
            """Refund an order once a person approves it."""
            return await ask(order_id, ctx)

    @tool
    def note(text: str) -> str:
        """Take a note."""
        ledger.notes.append(text)
        return "noted"

    tools: list[turnkit.Tool] = ([refund] if with_refund else []) + ([note] if extra_tool else [])
    return turnkit.Agent(
        name="a",
        model=NamedModel(model, respond=respond),
        instructions=instructions,
        tools=tools,
        version=version,
        on_version_change=on_version_change,
    )


async def park_under(agent: turnkit.Agent, make_store: Any, sink: RecordingSink) -> str:
    async with turnkit.Runtime(agent, store=make_store(), sink=sink) as rt:
        result = await rt.session("a", "s1").result(rt.session("a", "s1").start("o-1"))
        assert result.status == "suspended", result
        return result.turn_id


async def resume_under(
    agent: turnkit.Agent, make_store: Any, sink: RecordingSink, turn_id: str
) -> tuple[turnkit.TurnResult, TurnRecord, list[turnkit.TurnEvent]]:
    async with turnkit.Runtime(agent, store=make_store(), sink=sink) as rt:
        session = rt.session("a", "s1")
        result = await session.result(await session.resume(turn_id, "approve", {"approved": True}))
        record = await session._store.turn(turn_id)
        assert record is not None
        events = await session._store.events(turn_id=turn_id)
        return result, record, events


def version_events(events: list[turnkit.TurnEvent]) -> list[turnkit.TurnEvent]:
    return [e for e in events if e.type in ("turn.version_changed", "turn.held")]


# -- the version a turn records -------------------------------------------------------


async def test_a_turn_records_its_agents_version(make_store: Any, sink: RecordingSink) -> None:
    ledger = Ledger()
    agent = make_agent(ledger)
    turn_id = await park_under(agent, make_store, sink)
    async with turnkit.Runtime(agent, store=make_store(), sink=sink) as rt:
        record = await rt.session("a", "s1")._store.turn(turn_id)
        assert record is not None and record.version == agent.turn_version
        assert agent.turn_version.startswith("fp-")
        queued = await rt.session("a", "s2").submit("o-2")
        stored = await rt.session("a", "s2")._store.turn(queued)
        assert stored is not None and stored.version == agent.turn_version
    explicit = make_agent(ledger, version="2026-12-05")
    assert explicit.turn_version == "2026-12-05"


def test_the_fingerprint_covers_what_the_model_is_shown_and_nothing_else() -> None:
    ledger = Ledger()
    base = make_agent(ledger).turn_version
    assert make_agent(ledger).turn_version == base  # stable
    for changed in (
        make_agent(ledger, instructions="Refund orders politely."),
        make_agent(ledger, extra_tool=True),
        make_agent(ledger, with_refund=False),
        make_agent(ledger, narrowed=True),
        make_agent(ledger, model="model-2"),
        turnkit.Agent(
            name="a",
            model=NamedModel("model-1", respond=respond),
            instructions="Refund orders.",
            tools=make_agent(ledger).tools,
            history=turnkit.LastTurns(3),
        ),
    ):
        assert changed.turn_version != base


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    code = (
        "import turnkit\n"
        "from turnkit.testing import ScriptedModel\n"
        "@turnkit.tool\n"
        "def look(q: str) -> str:\n"
        "    '''Look.'''\n"
        "    return q\n"
        "a = turnkit.Agent(name='a', model=ScriptedModel([]), instructions='x', tools=[look],"
        " history=turnkit.LastTurns(4))\n"
        "print(a.turn_version)\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith("fp-")


def test_the_fingerprint_is_computed_once_per_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnkit._engine import agent as agent_module

    computed: list[str] = []
    real = agent_module.fingerprint

    def counting(agent: turnkit.Agent) -> str:
        computed.append(agent.name)
        return real(agent)

    monkeypatch.setattr(agent_module, "fingerprint", counting)
    agent = make_agent(Ledger())
    assert {agent.turn_version for _ in range(5)} == {agent.turn_version}
    assert computed == ["a"]


def test_a_bad_version_or_hook_is_refused_at_construction() -> None:
    for bad in ("", "a,b", "x" * 201, "tab\there", 3):
        with pytest.raises(turnkit.ConfigurationError, match="version"):
            make_agent(Ledger(), version=bad)
    with pytest.raises(turnkit.ConfigurationError, match="on_version_change"):
        make_agent(Ledger(), on_version_change="continue")


# -- park under A, resume under B ---------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"instructions": "Refund orders, and say thanks."},
        {"extra_tool": True},
        {"model": "model-2"},
    ],
    ids=["instructions", "tool-added", "model"],
)
async def test_a_compatible_change_continues_the_turn(
    make_store: Any, sink: RecordingSink, change: dict[str, Any]
) -> None:
    ledger = Ledger()
    old = make_agent(ledger)
    turn_id = await park_under(old, make_store, sink)
    new = make_agent(ledger, **change)
    assert new.turn_version != old.turn_version
    result, record, events = await resume_under(new, make_store, sink, turn_id)
    assert result.status == "completed" and result.text == "done: {'refunded': True}"
    assert ledger.refunded == ["o-1"]
    assert record.version == new.turn_version and record.held_by is None
    [changed] = version_events(events)
    assert isinstance(changed, TurnVersionChangedEvent)
    assert (changed.from_version, changed.to_version) == (old.turn_version, new.turn_version)
    assert changed.action == "continued"
    model = new.model
    assert isinstance(model, ScriptedModel)
    [call] = model.calls
    # The turn keeps the prompt it opened with; the next step offers the new tool set.
    assert call.system == "Refund orders."
    assert sorted(t.name for t in call.tools) == sorted(s.name for s in new.tool_specs)


@pytest.mark.parametrize(
    "change",
    [{"with_refund": False}, {"narrowed": True}],
    ids=["tool-removed", "schema-narrowed"],
)
async def test_an_incompatible_change_holds_the_turn_parked(
    make_store: Any, sink: RecordingSink, change: dict[str, Any]
) -> None:
    ledger = Ledger()
    old = make_agent(ledger)
    turn_id = await park_under(old, make_store, sink)
    new = make_agent(ledger, **change)
    result, record, events = await resume_under(new, make_store, sink, turn_id)
    assert result.status == "suspended" and result.request is None
    assert ledger.refunded == []
    assert record.status == "suspended" and record.held_by == new.turn_version
    assert record.version == old.turn_version
    what = "is gone" if "with_refund" in change else "no longer accepts the arguments"
    assert what in (record.error or "") and "'refund'" in (record.error or "")
    [held] = version_events(events)
    assert isinstance(held, TurnHeldEvent) and held.by_version == new.turn_version
    assert len(held.problems) == 1 and what in held.problems[0]
    async with turnkit.Runtime(new, store=make_store(), sink=sink) as rt:
        session = rt.session("a", "s1")
        with pytest.raises(turnkit.SessionSuspendedError, match="held by agent version"):
            await session.turn("another")
        with pytest.raises(turnkit.ResumeConflictError, match="held by agent version"):
            await session.resume(turn_id, "approve", {"approved": True})
        with pytest.raises(turnkit.TurnHeldError, match=what):
            await session.turn("o-1", turn_id=turn_id)  # following the held turn
        # The refusing version does not try again on recovery: nothing changes.
        await rt.recover()
        assert await session._store.turn(turn_id) == record
    # Back on the version it was recorded under (a rollback, or an old worker left
    # to drain), the held turn runs on from where it was, its answer kept.
    async with turnkit.Runtime(old, store=make_store(), sink=sink) as rt:
        [recovered] = await rt.recover()
        assert recovered.status == "completed" and ledger.refunded == ["o-1"]
        after = await rt.session("a", "s1")._store.turn(turn_id)
        assert after is not None and after.version == old.turn_version
        assert after.held_by is None and after.status == "completed"


async def test_a_migration_rewrites_the_owed_call(make_store: Any, sink: RecordingSink) -> None:
    ledger = Ledger()
    old = make_agent(ledger)
    turn_id = await park_under(old, make_store, sink)
    seen: list[VersionChange] = []

    def migrate(change: VersionChange) -> Any:
        seen.append(change)
        [owed] = change.owed
        return change.rewrite(owed.id, name="refund", input={"order_id": "1"})

    new = make_agent(ledger, narrowed=True, on_version_change=migrate)
    result, record, events = await resume_under(new, make_store, sink, turn_id)
    assert result.status == "completed" and ledger.refunded == ["1"], (result, ledger)
    [change] = seen
    assert not change.compatible and "no longer accepts" in change.problems[0]
    assert (change.from_version, change.to_version) == (old.turn_version, new.turn_version)
    [migrated] = version_events(events)
    assert isinstance(migrated, TurnVersionChangedEvent) and migrated.action == "migrated"
    assert migrated.rewritten == (change.owed[0].id,)
    assert record.version == new.turn_version


async def test_a_hook_may_refuse_a_compatible_change_or_continue_an_incompatible_one(
    make_store: Any, sink: RecordingSink
) -> None:
    ledger = Ledger()
    turn_id = await park_under(make_agent(ledger), make_store, sink)

    async def refuse(change: VersionChange) -> str:
        return "refuse"

    _, record, _ = await resume_under(
        make_agent(ledger, model="model-2", on_version_change=refuse), make_store, sink, turn_id
    )
    assert record.status == "suspended" and record.held_by is not None
    # A later version that accepts it takes the held turn on when it recovers.
    newest = make_agent(ledger, extra_tool=True, on_version_change=lambda c: "continue")
    async with turnkit.Runtime(newest, store=make_store(), sink=sink) as rt:
        [result] = await rt.recover()
        assert result.status == "completed" and ledger.refunded == ["o-1"]


async def test_a_hook_that_answers_nonsense_fails_loudly(
    make_store: Any, sink: RecordingSink
) -> None:
    ledger = Ledger()
    turn_id = await park_under(make_agent(ledger), make_store, sink)
    new = make_agent(ledger, model="model-2", on_version_change=lambda c: "maybe")
    async with turnkit.Runtime(new, store=make_store(), sink=sink) as rt:
        session = rt.session("a", "s1")
        tid = await session.resume(turn_id, "approve", {"approved": True})
        with pytest.raises(turnkit.ConfigurationError, match="'maybe'"):
            await session.result(tid)
        record = await session._store.turn(tid)
        assert record is not None and record.status == "running"  # left for a fixed deploy


async def test_a_turn_recorded_without_a_version_runs_on_unchecked(
    make_store: Any, sink: RecordingSink
) -> None:
    """Turns stored before versions were recorded continue under any version."""
    ledger = Ledger()
    old = make_agent(ledger)
    store = make_store()
    async with turnkit.Runtime(old, store=store, sink=sink) as rt:
        session = rt.session("a", "s1")
        result = await session.result(session.start("o-1"))
        record = await session._store.turn(result.turn_id)
        assert record is not None
        # As an older turnkit left it: no version column value.
        await session._store.commit([PutTurn(replace(record, version=None), "suspended")])
    new = make_agent(ledger, model="model-9")
    result, record, events = await resume_under(new, make_store, sink, result.turn_id)
    assert result.status == "completed" and version_events(events) == []
    assert record.version is None


# -- where a turn's version shows ------------------------------------------------------


async def held_sqlite(tmp_path: Path, sink: RecordingSink) -> tuple[Path, str, turnkit.Agent]:
    """A SQLite file with one turn held: parked by one version, refused by another."""
    db = tmp_path / "shop.db"
    ledger = Ledger()
    old = make_agent(ledger)
    async with turnkit.Runtime(old, store=SqliteStore(db), sink=sink) as rt:
        session = rt.session("a", "s1")
        parked = await session.result(session.start("o-1", owner="alice"))
    new = make_agent(ledger, with_refund=False)
    await resume_under(new, lambda: SqliteStore(db), sink, parked.turn_id)
    return db, parked.turn_id, new


async def test_turnkit_show_prints_each_turns_version_and_who_holds_it(
    tmp_path: Path, sink: RecordingSink
) -> None:
    db, turn_id, new = await held_sqlite(tmp_path, sink)
    old_version = make_agent(Ledger()).turn_version
    text = turnkit_cli("show", "s1", "--store", str(db), cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"{turn_id}  suspended (held)" in text.stdout
    assert f"version: {old_version}" in text.stdout
    assert f"held by version: {new.turn_version}" in text.stdout
    as_json = turnkit_cli("show", "s1", "--store", str(db), "--json", cwd=tmp_path)
    [turn] = [t for t in json.loads(as_json.stdout)["turns"] if t["turn_id"] == turn_id]
    assert (turn["version"], turn["held_by"]) == (old_version, new.turn_version)


async def test_the_http_transcript_names_the_version_of_each_open_turn(
    tmp_path: Path, sink: RecordingSink
) -> None:
    db, turn_id, new = await held_sqlite(tmp_path, sink)
    async with (
        turnkit.Runtime(new, store=SqliteStore(db), sink=sink) as rt,
        serving(rt) as served,
    ):
        reply = await served.client.get(
            served.path("a", "s1", "transcript"), headers={"X-User": "alice"}
        )
    assert reply.status_code == 200, reply.text
    [turn] = reply.json()["turns"]
    assert turn["turn_id"] == turn_id and turn["status"] == "suspended"
    assert turn["version"] == make_agent(Ledger()).turn_version
    assert turn["held_by"] == new.turn_version and "'refund'" in turn["error"]


# -- recovery under another version ----------------------------------------------------


class Died(Exception):
    """Stands for the process dying right after a commit."""


def lookup_agent(*, keep_lookup: bool, extra_tool: bool = False) -> turnkit.Agent:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    @tool
    def note(text: str) -> str:
        """Take a note."""
        return "noted"

    def reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("lookup", {"q": last.text})])
        return f"answer: {getattr(last, 'result', '?')}"

    tools = ([lookup] if keep_lookup else []) + ([note] if extra_tool else [])
    return turnkit.Agent(name="a", model=ScriptedModel(respond=reply), tools=tools)


@pytest.mark.parametrize("keep_lookup", [True, False], ids=["tool-added", "tool-removed"])
async def test_a_turn_left_running_is_recovered_by_the_new_versions_rule(
    make_store: Any, sink: RecordingSink, keep_lookup: bool
) -> None:
    def die() -> None:
        raise Died()

    # The model step that asks for ``lookup`` commits (the opening is commit 1), then
    # the process is gone: the turn is left running, its call owed.
    crashing = CrashingStore(make_store(), crash_at=2, when="after", on_crash=die)
    old = lookup_agent(keep_lookup=True)
    async with turnkit.Runtime(old, store=crashing, sink=sink) as rt:
        session = rt.session("a", "s1")
        turn_id = session.start("x")
        with pytest.raises(Died):
            await session.result(turn_id)
    new = lookup_agent(keep_lookup=keep_lookup, extra_tool=True)
    async with turnkit.Runtime(new, store=make_store(), sink=sink) as rt:
        [result] = await rt.recover()
        record = await rt.session("a", "s1")._store.turn(turn_id)
        events = await rt.session("a", "s1")._store.events(turn_id=turn_id)
    assert record is not None
    if keep_lookup:
        assert result.status == "completed" and result.text == "answer: found x"
        assert record.version == new.turn_version
        [changed] = version_events(events)
        assert isinstance(changed, TurnVersionChangedEvent) and changed.action == "continued"
    else:
        assert result.status == "suspended" and record.held_by == new.turn_version
        assert record.version == old.turn_version
        [held] = version_events(events)
        assert isinstance(held, TurnHeldEvent)
        assert held.problems == ("tool 'lookup' (call call_1, owed) is gone",)
