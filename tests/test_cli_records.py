"""``turnkit fork`` (issue 38), run as a user runs it: a subprocess on a SQLite file
a runtime wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import turnkit
from turnkit import ToolMessage, UserMessage, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def turnkit_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


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

    out = turnkit_cli(
        "fork", "s1", "--at", "tool:1:call_1", "--to", "s2", "--store", str(db), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "forked s1 at message 2 into s2 (agent shop): 1 turn(s), 2 step(s); "
        f"turn {_first_turn(db)} left running: the next delivery carries it on"
    )
    as_json = turnkit_cli(
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

    bad = turnkit_cli(
        "fork", "s1", "--at", "model:9", "--to", "s4", "--store", str(db), cwd=tmp_path
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "turnkit: error: the transcript has no model step 'model:9' (no reply at 9)"
    )
    taken = turnkit_cli("fork", "s1", "--to", "s2", "--store", str(db), cwd=tmp_path)
    assert taken.returncode == 2 and "session 's2' already exists" in taken.stderr


def _first_turn(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT turn_id FROM turnkit_turns WHERE session_id = 's1'").fetchone()
    return str(row[0])
