"""``turnkit fork``, ``export`` and ``import`` (issue 38), run as a user runs them: a
subprocess on a SQLite file a runtime wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_support import turnkit_with_input

import turnkit
from turnkit import ToolMessage, UserMessage, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def agent(ran: list[str]) -> turnkit.Agent:
    @tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        ran.append(order)
        return f"order {order}: shipped"

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call("lookup", {"order": "7"})])
        last = messages[-1]
        assert isinstance(last, ToolMessage)
        return f"it says {last.result}"

    return turnkit.Agent(name="shop", model=ScriptedModel(respond=respond), tools=[lookup])


async def test_fork_makes_a_session_the_next_delivery_carries_on(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ran: list[str] = []
    async with turnkit.Runtime([agent(ran)], store=SqliteStore(db)) as rt:
        assert await rt.session("shop", "s1").turn("where is 7?") == "it says order 7: shipped"

    out = turnkit_with_input(
        "fork", "s1", "--at", "tool:1:call_1", "--to", "s2", "--store", str(db), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "forked s1 at message 2 into s2 (agent shop): 1 turn(s), 2 step(s); "
        f"turn {_first_turn(db)} left running: the next delivery carries it on"
    )
    as_json = turnkit_with_input(
        "fork", "s1", "--at", "3", "--to", "s3", "--store", str(db), "--json", cwd=tmp_path
    )
    made = json.loads(as_json.stdout)
    assert (made["session_id"], made["at"], made["status"]) == ("s3", 3, "running")

    async with turnkit.Runtime([agent(ran)], store=SqliteStore(db)) as rt:
        results = await rt.recover()
        assert sorted(r.text or "" for r in results) == ["it says order 7: shipped"] * 2
        assert len(await rt.session("shop", "s2").messages()) == 4
        assert len(await rt.session("shop", "s1").messages()) == 4
    assert ran == ["7", "7"]  # once in s1, once in s2 (cut before the call); s3 kept it

    bad = turnkit_with_input(
        "fork", "s1", "--at", "model:9", "--to", "s4", "--store", str(db), cwd=tmp_path
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "turnkit: error: the transcript has no model step 'model:9' (no reply at 9)"
    )
    taken = turnkit_with_input("fork", "s1", "--to", "s2", "--store", str(db), cwd=tmp_path)
    assert taken.returncode == 2 and "session 's2' already exists" in taken.stderr


def _first_turn(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT turn_id FROM turnkit_turns WHERE session_id = 's1'").fetchone()
    return str(row[0])


async def test_export_to_a_file_and_import_it_into_another_store(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ran: list[str] = []
    async with turnkit.Runtime([agent(ran)], store=SqliteStore(db)) as rt:
        await rt.session("shop", "s1").turn("where is 7?")
        before = await rt.session("shop", "s1").messages()

    out = turnkit_with_input("export", "s1", "--store", str(db), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (tmp_path / "s1.json").write_text(out.stdout)
    assert json.loads(out.stdout)["session_id"] == "s1"

    other = tmp_path / "other.db"
    done = turnkit_with_input("import", "s1.json", "--store", str(other), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"imported s1 into {other}: 4 message(s), 1 turn(s), 4 step(s), 6 event(s)"
    )
    async with turnkit.Runtime([agent(ran)], store=SqliteStore(other)) as rt:
        assert await rt.session("shop", "s1").messages() == before

    again = turnkit_with_input("import", "s1.json", "--store", str(other), cwd=tmp_path)
    assert again.returncode == 2
    assert "session 's1' already exists" in again.stderr
    renamed = turnkit_with_input(
        "import", "-", "--as", "s9", "--store", str(other), cwd=tmp_path, stdin=out.stdout
    )
    assert renamed.returncode == 0 and "imported s9" in renamed.stdout

    (tmp_path / "bad.json").write_text(out.stdout.replace('"role": "tool"', '"role": "robot"'))
    bad = turnkit_with_input(
        "import", "bad.json", "--as", "s8", "--store", str(other), cwd=tmp_path
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("turnkit: error: messages[2]: ")
    (tmp_path / "cut.json").write_text(out.stdout[:50])
    cut = turnkit_with_input("import", "cut.json", "--store", str(other), cwd=tmp_path)
    assert cut.returncode == 2 and "'cut.json' is not JSON" in cut.stderr
