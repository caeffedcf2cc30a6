"""``turnkit sessions`` and ``turnkit show``, run as a user runs them: real subprocesses
on stores built by ``turnkit run`` itself (plus a reset done through the Python API),
on SQLite files and, when a server is configured, on PostgreSQL."""

from __future__ import annotations

import asyncio
import getpass
import io
import json
import os
import pty
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cli_support import EXAMPLE, OFFLINE_ENV, turnkit, turnkit_with_input, write_agent

import turnkit as tk
from turnkit import Proactive
from turnkit.cli._open import dsn_schema, is_postgres_dsn, open_store, redact_dsn
from turnkit.cli._progress import Progress
from turnkit.cli._render import render_session
from turnkit.cli._show import SessionView, read_session, session_json
from turnkit.stores import MemoryStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

UTC_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


async def shown(store: MemoryStore) -> SessionView:
    """What ``turnkit show s1`` reads from a store in this process."""
    return await read_session(store, "s1", Progress(io.StringIO()), where="memory")


async def _reset_a_session(store: Store) -> None:
    """A session with archived generation 0 and a live generation 1."""
    agent = tk.Agent(name="echo", model=ScriptedModel(respond=lambda m: f"{len(m)} seen"))
    async with tk.Runtime(agent, store=store) as runtime:
        session = runtime.session("echo", "r")
        await session.turn("hello")
        await session.reset()
        await session.turn("hello again")


def build_sessions(cwd: Path, spec: str) -> None:
    """The sessions every test reads: completed (``shop``, SQLite only: the example's
    orders table is SQLite's), a tool error (``bad``), parked (``p``), reset (``r``)."""
    store = ("--store", spec)
    if not is_postgres_dsn(spec):
        done = turnkit(
            "run", str(EXAMPLE), "order 2 blue widgets", "--session", "shop", *store, cwd=cwd
        )
        assert done.returncode == 0, done.stderr
    bad = turnkit("run", str(EXAMPLE), "order 0 ghosts", "--session", "bad", *store, cwd=cwd)
    assert bad.returncode == 0, bad.stderr
    agent = write_agent(cwd / "deployer")
    parked = turnkit_with_input(
        "run", str(agent), "api", "--session", "p", *store, cwd=cwd, stdin=""
    )
    assert parked.returncode == 3, parked.stderr
    path = spec if is_postgres_dsn(spec) else str(cwd / spec)
    asyncio.run(_reset_a_session(open_store(path)))


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose ``shop.db`` holds the sessions of ``build_sessions``."""
    folder = tmp_path_factory.mktemp("shop")
    build_sessions(folder, "shop.db")
    return folder


def turnkit_all(*commands: Sequence[str], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run several read-only ``turnkit`` commands at once (the suite stays fast)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "turnkit.cli", *command],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
        )
        for command in commands
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def show(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return turnkit("show", *args, "--store", "shop.db", cwd=folder)


def shows(folder: Path, *targets: str) -> list[subprocess.CompletedProcess[str]]:
    """``turnkit show`` of each target (``"p --json"`` splits into arguments), at once."""
    return turnkit_all(*(("show", *t.split(), "--store", "shop.db") for t in targets), cwd=folder)


def sessions(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return turnkit("sessions", *args, "--store", "shop.db", cwd=folder)


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``turnkit: error:`` line of a failed command (and no traceback)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("turnkit: error: ")
    return lines[0]


# -- sessions ----------------------------------------------------------------------


def test_sessions_is_a_table_newest_first(shop: Path) -> None:
    done = sessions(shop)
    assert done.returncode == 0 and done.stderr == ""
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["SESSION", "AGENT", "STATUS", "UPDATED"]
    assert [r.split()[0] for r in rows] == ["r", "p", "bad", "shop"]
    assert rows[1].split()[1:3] == ["deployer", "suspended"]
    assert rows[0].split()[1:3] == ["echo", "idle"]
    assert all(re.search(UTC_TIME + "$", r) for r in rows)
    columns = {r.index(r.split()[1]) for r in [header, *rows]}
    assert len(columns) == 1, "the AGENT column is aligned"


def test_sessions_filters_by_agent_limits_and_prints_json(shop: Path) -> None:
    ops, newest, listed, nobody, nobody_json = turnkit_all(
        *(
            ("sessions", *args, "--store", "shop.db")
            for args in (
                ("--agent", "ops"),
                ("--limit", "1"),
                ("--json",),
                ("--agent", "nobody"),
                ("--agent", "nobody", "--json"),
            )
        ),
        cwd=shop,
    )
    assert [line.split()[0] for line in ops.stdout.splitlines()] == ["SESSION", "bad", "shop"]
    assert [line.split()[0] for line in newest.stdout.splitlines()] == ["SESSION", "r"]
    rows = json.loads(listed.stdout)
    assert [s["session_id"] for s in rows] == ["r", "p", "bad", "shop"]
    assert rows[1] == {
        "session_id": "p",
        "agent": "deployer",
        "status": "suspended",
        "updated_at": rows[1]["updated_at"],
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rows[1]["updated_at"])
    assert nobody.stdout.strip() == "no sessions"
    assert json.loads(nobody_json.stdout) == []


# -- show --------------------------------------------------------------------------


def test_show_prints_the_transcript_turns_and_steps(shop: Path) -> None:
    done, as_json = shows(shop, "shop", "shop --json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    out = done.stdout
    turn_id = json.loads(as_json.stdout)["turns"][0]["turn_id"]
    assert re.search(r"^session +shop$", out, re.M) and re.search(r"^status +idle$", out, re.M)
    assert re.search(r"^agent +ops$", out, re.M) and re.search(r"^store +shop\.db$", out, re.M)
    assert f"── turn {turn_id} (completed)" in out
    assert "[0] user       order 2 blue widgets" in out
    assert '→ create_order {"item": "blue widgets", "quantity": 2}  (call call_1)' in out
    assert '← create_order: {"order_id": 1, "item": "blue widgets", "quantity": 2}' in out
    assert "[5] assistant  Done: order #1 (2 x blue widgets) is packed." in out
    assert re.search(rf"^  {turn_id}  completed  {UTC_TIME} → \d\d:\d\d:\d\d UTC$", out, re.M)
    assert "    answer: Done: order #1 (2 x blue widgets) is packed." in out
    assert re.search(
        r"model:1 +reply \"Placing an order for 2 x blue widgets.\" → create_order", out
    )
    assert re.search(r"tool:1:call_1 +result \{\"order_id\": 1", out)
    assert re.search(rf"policy:{turn_id} +source cli, tools denied: none", out)
    assert "parked input" not in out and "archived generations" not in out


def test_show_marks_tool_errors(shop: Path) -> None:
    text, as_json = shows(shop, "bad", "bad --json")
    out = text.stdout
    assert '✗ create_order: {"error": "ValueError: quantity must be at least 1"}' in out
    assert re.search(r"tool:1:call_1 +✗ ValueError: quantity must be at least 1", out)
    messages = json.loads(as_json.stdout)["messages"]
    assert [m["is_error"] for m in messages if m["role"] == "tool"] == [True]


def test_show_a_parked_session_says_what_it_waits_for_and_how_to_answer(shop: Path) -> None:
    text, as_json = shows(shop, "p", "p --json")
    out = text.stdout
    assert re.search(r"^status +suspended$", out, re.M)
    parked = out[out.index("parked input") :]
    assert re.search(r"asks +Deploy api\?", parked)
    assert re.search(r"schema +\{\"type\": \"boolean\"\}", parked)
    assert re.search(r"answerers +user local:\S+", parked)  # whoever ran turnkit run
    assert re.search(r"input id +approve", parked) and "deploy (call call_1)" in parked
    hint = "turnkit answer <deployer agent folder> --session p --store shop.db"
    assert f"{hint}  (or on the turnkit dev page)" in parked
    assert ".resume(" in parked
    data = json.loads(as_json.stdout)
    assert data["status"] == "suspended"
    assert data["parked"]["prompt"] == "Deploy api?"
    assert data["parked"]["schema"] == {"type": "boolean"}
    assert data["turns"][0]["status"] == "suspended"
    assert data["parked"]["turn_id"] == data["turns"][0]["turn_id"]


def test_show_a_reset_session_and_its_archived_generation(shop: Path) -> None:
    live, archived, archived_json, live_json = shows(shop, "r", "r#g0", "r#g0 --json", "r --json")
    out = live.stdout
    assert re.search(r"^generation +1$", out, re.M)
    assert "[0] user       hello again" in out and "hello\n" not in out
    assert "archived generations (1)\n  g0  turnkit show 'r#g0' --store shop.db" in out
    assert archived.returncode == 0, archived.stderr
    assert re.search(r"^generation +0 \(archived\)$", archived.stdout, re.M)
    assert "[0] user       hello\n" in archived.stdout
    assert "[1] assistant  1 seen" in archived.stdout
    data = json.loads(archived_json.stdout)
    assert data["generation"] == 0 and data["archived"] is True
    assert [m["text"] for m in data["messages"]] == ["hello", "1 seen"]
    assert json.loads(live_json.stdout)["generations"] == [0]
    assert json.loads(live_json.stdout)["owner"] is None  # opened from code
    assert re.search(r"^owner +none$", live.stdout, re.M)


def test_show_json_holds_every_message_turn_and_step(shop: Path) -> None:
    data = json.loads(show(shop, "shop", "--json").stdout)
    assert data["session_id"] == "shop" and data["agent"] == "ops" and data["parked"] is None
    assert data["owner"] == f"local:{getpass.getuser()}"  # turnkit run opened it
    assert [m["role"] for m in data["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m["index"] for m in data["messages"]] == list(range(6))
    (turn,) = data["turns"]
    assert {m["turn_id"] for m in data["messages"]} == {turn["turn_id"]}
    assert turn["status"] == "completed" and turn["text"].startswith("Done: order #1")
    assert sorted(turn["steps"]) == sorted(
        [
            "model:1",
            "tool:1:call_1",
            "model:3",
            "tool:3:call_1",
            "model:5",
            f"policy:{turn['turn_id']}",
        ]
    )
    assert turn["steps"]["tool:1:call_1"]["result"]["order_id"] == 1
    assert turn["steps"]["model:5"]["text"] == "Done: order #1 (2 x blue widgets) is packed."


# -- errors ------------------------------------------------------------------------


def test_a_missing_session_or_generation_is_one_line(shop: Path) -> None:
    lines = [one_error(d) for d in shows(shop, "nope", "nope#g0", "r#g3", "shop#g0")]
    assert lines == [
        "turnkit: error: session 'nope' does not exist in shop.db",
        "turnkit: error: session 'nope' does not exist in shop.db",
        "turnkit: error: session 'r' has no archived generation 3 (archived generations: g0)",
        "turnkit: error: session 'shop' has no archived generation 0 (archived generations: none)",
    ]


def test_a_missing_store_file_is_named_and_not_created(tmp_path: Path) -> None:
    typo, show_typo, default, nested = turnkit_all(
        ("sessions", "--store", "typo.db"),
        ("show", "x", "--store", "typo.db"),
        ("sessions",),
        ("show", "x", "--store", "no/such/folder.db"),
        cwd=tmp_path,
    )
    expected = "turnkit: error: store 'typo.db' does not exist (no sessions were ever stored there)"
    assert one_error(typo) == one_error(show_typo) == expected
    assert "'.turnkit/sessions.db' does not exist" in one_error(default)
    assert "'no/such/folder.db' does not exist" in one_error(nested)
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_store_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.db").write_bytes(b"not a database " * 300)
    listed, shown, run = turnkit_all(
        ("sessions", "--store", "bad.db"),
        ("show", "x", "--store", "bad.db"),
        ("run", str(EXAMPLE), "hi", "--store", "bad.db"),
        cwd=tmp_path,
    )
    expected = "turnkit: error: cannot open the SQLite file 'bad.db': file is not a database"
    assert one_error(listed) == one_error(shown) == one_error(run) == expected


def test_a_sqlite_file_without_turnkit_tables_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    with sqlite3.connect(tmp_path / "app.db") as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER)")
    empty, app = turnkit_all(
        ("sessions", "--store", "empty.db"), ("show", "x", "--store", "app.db"), cwd=tmp_path
    )
    assert one_error(empty) == (
        "turnkit: error: 'empty.db' is not a turnkit store (it has no turnkit tables)"
    )
    assert "'app.db' is not a turnkit store" in one_error(app)
    assert (tmp_path / "empty.db").read_bytes() == b""
    with sqlite3.connect(tmp_path / "app.db") as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [("accounts",)]


def test_a_dsn_that_cannot_connect_is_one_line_without_its_password(tmp_path: Path) -> None:
    dsn = "postgresql://ann:s3cret@127.0.0.1:1/turnkit"
    keywords = "host=127.0.0.1 port=1 dbname=x password=s3cret"
    listed, shown, run, by_keywords, invalid = turnkit_all(
        ("sessions", "--store", dsn),
        ("show", "x", "--store", dsn),
        ("run", str(EXAMPLE), "hi", "--store", dsn),
        ("sessions", "--store", keywords),
        ("sessions", "--store", "postgresql://ann:s3cret@[::1"),
        cwd=tmp_path,
    )
    redacted = "'postgresql://ann:***@127.0.0.1:1/turnkit'"
    for done in (listed, shown):
        assert one_error(done).startswith(
            f"turnkit: error: cannot connect to PostgreSQL at {redacted}: "
        )
    assert one_error(run).startswith(
        f"turnkit: error: cannot open the PostgreSQL database {redacted}: "
    )
    assert "password=***" in one_error(by_keywords)
    assert one_error(invalid) == (
        "turnkit: error: --store 'postgresql://ann:***@[::1' is not a valid DSN"
    )
    assert not any(
        "s3cret" in d.stderr + d.stdout for d in (listed, shown, run, by_keywords, invalid)
    )


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    done = turnkit("sessions", "--limit", "0", cwd=tmp_path)
    assert done.returncode == 2 and "--limit: expected at least 1, got 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_command_has_help(tmp_path: Path) -> None:
    top, run, listed, shown = turnkit_all(
        ("--help",), ("run", "--help"), ("sessions", "--help"), ("show", "--help"), cwd=tmp_path
    )
    assert all(name in top.stdout for name in ("run", "sessions", "show"))
    for done in (top, run, listed, shown):
        assert done.returncode == 0 and done.stdout.startswith("usage: turnkit")
    for done in (run, listed, shown):
        assert "--store" in done.stdout and "PostgreSQL DSN" in done.stdout
    assert "--session" in run.stdout
    assert "--agent" in listed.stdout and "--limit" in listed.stdout and "--json" in listed.stdout
    assert "SESSION#gN" in shown.stdout and "--json" in shown.stdout


# -- progress ----------------------------------------------------------------------


def _stderr_on_a_terminal(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``turnkit`` with stderr on a pseudo-terminal; its exit, stdout, stderr."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnkit.cli", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
        )
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(follower)
    return proc.returncode, out, _drain(leader)


def _drain(fd: int) -> str:
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the terminal's other end is closed
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def test_progress_shows_on_a_terminal_and_is_erased(shop: Path) -> None:
    status, out, err = _stderr_on_a_terminal("show", "shop", "--store", "shop.db", cwd=shop)
    assert status == 0 and "transcript (6 messages)" in out
    assert "reading session shop…" in err
    assert err.endswith("\r\x1b[K"), "the progress line is erased before the output"
    status, _, err = _stderr_on_a_terminal("show", "nope", "--store", "shop.db", cwd=shop)
    assert "…\r\x1b[Kturnkit: error: " in err, "the progress line is erased before the error"
    assert status == 2 and err.endswith(
        "turnkit: error: session 'nope' does not exist in shop.db\r\n"
    )


def test_no_progress_when_stderr_is_not_a_terminal(shop: Path) -> None:
    shown, listed = turnkit_all(
        ("show", "shop", "--store", "shop.db"), ("sessions", "--store", "shop.db"), cwd=shop
    )
    assert shown.stderr == "" and listed.stderr == "" and shown.stdout and listed.stdout


# -- PostgreSQL --------------------------------------------------------------------


@pytest.fixture
def pg_spec(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    """The test server's DSN, naming the test's schema the way a user would."""
    joiner = "&" if "?" in pg_dsn else "?"
    yield f"{pg_dsn}{joiner}options=-csearch_path%3D{pg_schema}"


def test_sessions_and_show_on_postgres(pg_spec: str, pg_schema: str, tmp_path: Path) -> None:
    build_sessions(tmp_path, pg_spec)
    other = pg_spec.replace(pg_schema, f"{pg_schema}_none")
    listed, parked, bad, archived, missing, no_tables = turnkit_all(
        ("sessions", "--store", pg_spec, "--json"),
        ("show", "p", "--store", pg_spec),
        ("show", "bad", "--store", pg_spec),
        ("show", "r#g0", "--store", pg_spec, "--json"),
        ("show", "nope", "--store", pg_spec),
        ("sessions", "--store", other),
        cwd=tmp_path,
    )
    assert listed.returncode == 0, listed.stderr
    assert [s["session_id"] for s in json.loads(listed.stdout)] == ["r", "p", "bad"]
    out = parked.stdout
    assert re.search(r"asks +Deploy api\?", out) and re.search(r"^status +suspended$", out, re.M)
    assert '✗ create_order: {"error": "ValueError: quantity must be at least 1"}' in bad.stdout
    # The process that last ran the session (a worker, after a takeover): host:pid:id.
    host = re.escape(socket.gethostname())
    assert re.search(rf"^writer +{host}:\d+:[0-9a-f]{{8}} \(since \S+ \S+ UTC\)$", bad.stdout, re.M)
    generation: dict[str, Any] = json.loads(archived.stdout)
    assert [m["text"] for m in generation["messages"]] == ["hello", "1 seen"]
    assert one_error(missing).startswith("turnkit: error: session 'nope' does not exist in ")
    assert "s3cret" not in missing.stderr
    assert one_error(no_tables).startswith(
        f"turnkit: error: no turnkit tables in schema '{pg_schema}_none' of "
    )


# -- rendering, in process ---------------------------------------------------------


async def test_show_renders_triggers_failures_cancellations_and_long_values() -> None:
    """What the subprocess tests do not reach: a proactive opening, multi-line text, a
    long result cut to one line, a failed turn and a cancelled one."""
    started = asyncio.Event()

    @tk.tool
    def fetch(n: int) -> str:
        """Return a long text."""
        return "x" * 1000

    @tk.tool
    def explode() -> str:
        """Fail the turn."""
        raise tk.FatalToolError("disk on fire")

    @tk.tool
    async def crawl(site: str) -> str:
        """Wait to be cancelled."""
        started.set()
        await asyncio.wait_for(asyncio.Event().wait(), 30)  # until the cancel stops it
        return site

    script = [
        ScriptedReply(text="line one\nline two", tool_calls=[tool_call("fetch", {"n": 1})]),
        "done",
        ScriptedReply(tool_calls=[tool_call("explode", {})]),
        ScriptedReply(
            tool_calls=[tool_call("crawl", {"site": "a"}), tool_call("crawl", {"site": "b"})]
        ),
    ]
    agent = tk.Agent(name="a", model=ScriptedModel(script), tools=[fetch, explode, crawl])
    store = MemoryStore()
    async with tk.Runtime(agent, store=store) as runtime:
        session = runtime.session("a", "s1")
        await session.turn("nightly", trigger=Proactive(by="cron:daily"))
        with pytest.raises(tk.TurnFailedError):
            await session.turn("boom")
        turn_id = session.start("crawl")
        await started.wait()
        await session.cancel()
        await session.result(turn_id)
        view = await shown(store)
    out = render_session(view, store="memory", store_flag="")
    assert "[ 0] trigger    (by cron:daily) nightly" in out
    pad = " " * len("  [ 1] assistant  ")
    assert f"[ 1] assistant  line one\n{pad}line two\n{pad}→ fetch" in out
    assert "← fetch: " + "x" * 199 + "…" in out and "x" * 200 not in out
    failed, cancelled = view.turns[1], view.turns[2]
    assert failed.record is not None and failed.record.status == "failed"
    assert f"  {failed.turn_id}  failed  " in out
    assert "    ✗ error: tool 'explode' failed the turn: FatalToolError: disk on fire" in out
    assert '[ 6] tool       ✗ explode: {"error": "not run: ' in out
    assert cancelled.record is not None and cancelled.record.status == "cancelled"
    assert f"── turn {cancelled.turn_id} (cancelled)" in out
    assert "    cancel reason: requested" in out
    assert '✗ crawl: {"cancelled": true, "reason": "requested"}' in out
    data = session_json(view, "memory")
    assert [t["status"] for t in data["turns"]] == ["completed", "failed", "cancelled"]
    assert json.loads(json.dumps(data)) == data


async def test_show_says_who_answered_each_question_and_when() -> None:
    @tk.tool
    async def deploy(service: str, ctx: tk.ToolContext) -> str:
        """Deploy once someone agrees."""
        yes = await ctx.request_input("approve", f"Deploy {service}?", schema={"type": "boolean"})
        return "deployed" if yes else "kept"

    script = [ScriptedReply(tool_calls=[tool_call("deploy", {"service": "api"})]), "ok"]
    agent = tk.Agent(name="a", model=ScriptedModel(script), tools=[deploy])
    store = MemoryStore()
    async with tk.Runtime(agent, store=store) as runtime:
        session = runtime.session("a", "s1")
        parked = await session.result(session.start("deploy api"))
        await session.result(await session.resume(parked.turn_id, "approve", True, by="ana"))
        view = await shown(store)
    out = render_session(view, store="memory", store_flag="")
    assert re.search(rf"^    answered approve by ana at {UTC_TIME}: true$", out, re.MULTILINE), out
    [turn] = session_json(view, "memory")["turns"]
    [answer] = turn["answers"]
    assert answer["by"] == "ana" and answer["value"] is True and answer["input_id"] == "approve"
    assert isinstance(answer["seq"], int) and answer["at"].endswith("Z")
    assert answer["call_id"] == view.turns[0].answers[0].call_id
    assert (answer["tool"], answer["kind"], answer["source"]) == ("deploy", "input", None)


async def test_show_says_what_was_decided_by_whom_and_through_what() -> None:
    booked: list[dict[str, Any]] = []

    def book(data: dict[str, Any], actx: tk.ActionContext) -> str:
        booked.append(data)
        return "booked"

    action = tk.define_action(
        name="book",
        description="Book a room.",
        input_schema={"type": "object", "properties": {"room": {"type": "string"}}},
        run=book,
        approval=tk.Approval(allowed=("approve", "edit")),
    )
    script = [ScriptedReply(tool_calls=[tool_call("book", {"room": "A"})]), "ok"]
    agent = tk.Agent(name="a", model=ScriptedModel(script), tools=[action])
    store = MemoryStore()
    async with tk.Runtime(agent, store=store) as runtime:
        session = runtime.session("a", "s1")
        parked = await session.result(session.start("book"))
        request = parked.request
        assert request is not None
        view = await shown(store)
        out = render_session(view, store="memory", store_flag="")
        assert re.search(r'^  proposed +\{"room": "A"\}$', out, re.MULTILINE), out
        assert re.search(r"^  decisions +approve, edit$", out, re.MULTILINE), out
        edit = tk.Decision.edit({"room": "B"})
        await session.result(
            await session.resume(parked.turn_id, request.id, edit, by="ana", source="slack")
        )
        view = await shown(store)
    out = render_session(view, store="memory", store_flag="")
    line = rf"^    decided {re.escape(request.id)} by ana via slack at {UTC_TIME}: "
    assert re.search(line + r'approved with edits \{"room": "B"\}$', out, re.MULTILINE), out
    [answer] = session_json(view, "memory")["turns"][0]["answers"]
    assert (answer["kind"], answer["source"], answer["value"]) == (
        "decision",
        "slack",
        {"decision": "edit", "arguments": {"room": "B"}},
    )
    assert booked == [{"room": "B"}]


async def test_show_gives_a_questions_deadline_and_a_waits_end() -> None:
    @tk.tool
    async def deploy(service: str, ctx: tk.ToolContext) -> str:
        """Deploy once someone agrees, or by itself in two hours; then wait a day."""
        yes = await ctx.request_input(
            "approve",
            f"Deploy {service}?",
            schema={"type": "boolean"},
            expires_in=2 * 3600,
            on_expiry=True,
            remind_every=1800,
        )
        await ctx.sleep(86_400 + 3600)
        return "deployed" if yes else "kept"

    script = [ScriptedReply(tool_calls=[tool_call("deploy", {"service": "api"})]), "ok"]
    agent = tk.Agent(name="a", model=ScriptedModel(script), tools=[deploy])
    store = MemoryStore()
    async with tk.Runtime(agent, store=store) as runtime:
        session = runtime.session("a", "s1")
        parked = await session.result(session.start("deploy api"))
        asked = parked.request
        assert asked is not None and asked.expires_at is not None and asked.remind_at is not None
        view = await shown(store)
        out = render_session(view, store="memory", store_flag="", now=asked.expires_at - 5400)
        due = rf"^  answer by +{UTC_TIME} \(in 1 h 30 min\)$"
        assert re.search(due, out, re.MULTILINE), out
        assert re.search(r"^  then +answered true \(by deadline\)$", out, re.MULTILINE), out
        assert re.search(rf"^  reminders +every 30 min, next {UTC_TIME}$", out, re.MULTILINE), out
        late = render_session(view, store="memory", store_flag="", now=asked.expires_at + 120)
        assert re.search(r"^  answer by .*\(passed 2 min ago\)$", late, re.MULTILINE), late
        # The deadline answers; the tool then sleeps, and show gives the wait's end.
        await runtime.timers.fire_due(store, now=asked.expires_at + 1)
        slept = await session.result(parked.turn_id)
        timer = slept.request
        assert timer is not None and timer.kind == "timer" and timer.expires_at is not None
        view = await shown(store)
        out = render_session(view, store="memory", store_flag="", now=timer.expires_at - 90_000)
        assert "waiting on the clock" in out and "parked input" not in out
        assert re.search(rf"^  until +{UTC_TIME} \(in 1 d 1 h\)$", out, re.MULTILINE), out
        wake = rf"^  to wake +await runtime.session\('a', 's1'\).wake\('{parked.turn_id}'\)$"
        assert re.search(wake, out, re.MULTILINE), out
        assert "POST /agents/a/sessions/s1/wake" in out
        [request] = session_json(view, "memory")["parked_requests"]
        assert request["kind"] == "timer" and request["expires_at"] == timer.expires_at


@pytest.mark.parametrize(
    ("dsn", "schema"),
    [
        ("postgresql://db/prod", "public"),
        ("postgresql://db/prod?options=-csearch_path%3Dsupport", "support"),
        ("postgresql://db/prod?options=-c%20search_path%3Dsupport,public", "support"),
        ("host=db dbname=prod options='-c search_path=support'", "support"),
        ("host=db dbname=prod options='-c statement_timeout=5s'", "public"),
    ],
)
def test_a_dsn_names_its_schema_through_search_path(dsn: str, schema: str) -> None:
    assert dsn_schema(dsn) == schema
    store = open_store(dsn)
    assert getattr(store, "schema", None) == schema


def test_redact_dsn_hides_passwords_in_every_form() -> None:
    assert redact_dsn("postgresql://ann:s3cret@db/x") == "postgresql://ann:***@db/x"
    assert redact_dsn("postgresql://db/x?user=ann&password=s3cret") == (
        "postgresql://db/x?user=ann&password=***"
    )
    assert redact_dsn("host=db password=s3cret dbname=x") == "host=db password=*** dbname=x"
    assert redact_dsn("host=db password='s 3cret' dbname=x") == "host=db password=*** dbname=x"


def test_the_example_agent_runs_on_postgres(pg_spec: str, tmp_path: Path) -> None:
    done = turnkit("run", str(EXAMPLE), "order 2 blue widgets", "--store", pg_spec, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Done: order #1 (2 x blue widgets) is packed." in done.stdout
    again = turnkit("run", str(EXAMPLE), "order 1 red pen", "--store", pg_spec, cwd=tmp_path)
    assert "order #2 (1 x red pen)" in again.stdout
