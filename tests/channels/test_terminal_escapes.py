"""Stored text never drives the reader's terminal: control sequences that came in a
message, a model's reply, a tool's name or result, a question or an error are shown
escaped by ``turnkit show``/``sessions``/``run`` and the terminal channel, while
``--json`` keeps every value exact."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import OFFLINE_ENV

import turnkit
from turnkit import Agent, Answerers, ToolContext, ToolMessage, UserMessage, mount_agent, tool
from turnkit._channels.printable import printable, printable_json
from turnkit.cli._open import open_store
from turnkit.stores import Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

OSC_TITLE = "\x1b]0;pwned\x07"
OSC_CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: write "rm -rf ~" to the clipboard
CSI_CLEAR = "\x1b[2J"
CSI_HOME = "\x1b[1;1H"
C1_CSI = "\u009b2J"  # the one-character CSI
BIDI = "\u202eevil\u202c"
HOSTILE = f"a{OSC_TITLE}b{OSC_CLIPBOARD}c{CSI_CLEAR}d{CSI_HOME}e{C1_CSI}f{BIDI}g\rh"

#: What no human-readable output may contain raw (CRLF is fine).
RAW_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")


def assert_inert(text: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw {found.group()!r} at {found.start()}: {text!r}"


def assert_shows_escaped(text: str) -> None:
    assert "\\x1b]0;pwned\\x07" in text  # the title sequence, visible
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in text
    assert "\\x1b[2J" in text and "\\x1b[1;1H" in text
    assert "\\u009b2J" in text and "\\u202eevil\\u202c" in text


# -- the function --------------------------------------------------------------------


def test_printable_escapes_what_a_terminal_acts_on_and_keeps_the_rest() -> None:
    assert printable(HOSTILE) == (
        "a\\x1b]0;pwned\\x07b\\x1b]52;c;cm0gLXJmIH4=\\x07c\\x1b[2Jd\\x1b[1;1He"
        "\\u009b2Jf\\u202eevil\\u202cg\\x0dh"
    )
    kept = "tabs\tnewlines\nCRLF\r\nunicode ✓ → ← ✗ … émoji 🙂 \u2028 back\\slash"
    assert printable(kept) == kept
    assert printable("\x00\x7f\x80\x9f\u2066\u2069") == "\\x00\\x7f\\u0080\\u009f\\u2066\\u2069"
    assert printable(printable(HOSTILE)) == printable(HOSTILE)


def test_printable_json_is_the_same_value_and_inert() -> None:
    value = {"text": HOSTILE, "del": "\x7f", HOSTILE: [HOSTILE]}
    encoded = printable_json(json.dumps(value, ensure_ascii=False, indent=2))
    assert json.loads(encoded) == value
    assert_inert(encoded)


# -- a store full of hostile text ------------------------------------------------------

HOSTILE_SESSION = f"s{OSC_TITLE}{CSI_CLEAR}"


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q} {HOSTILE}"


@tool
async def approve(ctx: ToolContext) -> str:
    """Ask before acting."""
    await ctx.request_input("ok", f"Allow {HOSTILE}?", answerers=Answerers.user("cli:ana"))
    return "allowed"


@tool
async def explode() -> str:
    """Fail the turn."""
    raise turnkit.FatalToolError(f"boom {HOSTILE}")


def _reply(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        wanted = {"park": "approve", "fail": "explode"}.get(last.text.split()[0], "lookup")
        calls = [tool_call(wanted, {"q": HOSTILE} if wanted == "lookup" else {})]
        if wanted == "lookup":
            calls.append(tool_call(f"evil{CSI_HOME}", {}))  # a tool nobody has
        return ScriptedReply(text=f"Sure {HOSTILE}", tool_calls=calls)
    if isinstance(last, ToolMessage):
        return f"Done {HOSTILE}\nsecond line {CSI_CLEAR}"
    return "?"


def hostile_agent() -> Agent:
    return Agent(
        name="ops",
        model=ScriptedModel(respond=_reply),
        tools=[lookup, approve, explode],
    )


async def fill(store: Store) -> None:
    async with turnkit.Runtime(hostile_agent(), store=store) as runtime:
        await runtime.session("ops", "talk").turn(f"look {HOSTILE}")
        await runtime.session("ops", HOSTILE_SESSION).turn("look")
        parked = runtime.session("ops", "parked")
        with pytest.raises(turnkit.TurnSuspendedError):
            await parked.turn("park")
        with pytest.raises(turnkit.TurnFailedError):
            await runtime.session("ops", "failed").turn("fail")
        gone = runtime.session("ops", "gone")
        await gone.turn(f"look {HOSTILE}")
        await gone.reset()


def cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    """``turnkit ARGS`` as bytes, decoded without newline translation, so a carriage
    return that reached the terminal would still be seen."""
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        capture_output=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture(params=["sqlite", "postgres"])
def hostile_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A ``--store`` spec holding the hostile sessions."""
    if request.param == "sqlite":
        spec = str(tmp_path / "hostile.db")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        spec = f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}"
    asyncio.run(fill(open_store(spec)))
    yield spec


def test_show_and_sessions_print_stored_escapes_visibly(hostile_store: str, tmp_path: Path) -> None:
    store = ("--store", hostile_store)
    outputs = []
    for args in (
        ("sessions",),
        ("show", "talk"),
        ("show", HOSTILE_SESSION),
        ("show", "parked"),
        ("show", "failed"),
        ("show", "gone#g0"),
    ):
        status, out, err = cli(*args, *store, cwd=tmp_path)
        assert status == 0, err
        assert err == ""
        assert_inert(out)
        outputs.append(out)
    listed, talk, named, parked, failed, archived = outputs
    assert "s\\x1b]0;pwned\\x07\\x1b[2J" in listed
    # The columns stay aligned: the escaped id is as wide as its column.
    header, *rows = listed.splitlines()
    assert {row.index("ops") for row in rows} == {header.index("AGENT")}
    assert_shows_escaped(talk)  # opening, reply, tool input and result, answer
    assert '✗ evil\\x1b[1;1H: {"error": "unknown tool: evil\\u001b[1;1H"}' in talk
    assert "s\\x1b]0;pwned\\x07\\x1b[2J" in named
    assert_shows_escaped(parked)  # the question
    assert re.search(r"asks +Allow a\\x1b\]0;pwned\\x07", parked)
    assert "failed the turn: FatalToolError: boom a\\x1b]0;pwned\\x07" in failed
    assert_shows_escaped(archived)


def test_show_json_keeps_every_value_exact(hostile_store: str, tmp_path: Path) -> None:
    status, out, err = cli("show", "talk", "--json", "--store", hostile_store, cwd=tmp_path)
    assert status == 0, err
    assert_inert(out)
    shown = json.loads(out)
    assert shown["messages"][0]["text"] == f"look {HOSTILE}"
    assert shown["messages"][1]["text"] == f"Sure {HOSTILE}"
    assert shown["messages"][1]["tool_calls"][1]["name"] == f"evil{CSI_HOME}"
    status, out, err = cli("sessions", "--json", "--store", hostile_store, cwd=tmp_path)
    assert status == 0, err
    assert_inert(out)
    assert HOSTILE_SESSION in {s["session_id"] for s in json.loads(out)}


def test_an_error_line_naming_hostile_text_is_escaped(tmp_path: Path) -> None:
    asyncio.run(fill(open_store(str(tmp_path / "hostile.db"))))
    status, out, err = cli(
        "show", f"ghost{OSC_CLIPBOARD}", "--store", str(tmp_path / "hostile.db"), cwd=tmp_path
    )
    assert status == 2 and out == ""
    assert_inert(err)
    assert "session 'ghost\\x1b]52;c;cm0gLXJmIH4=\\x07' does not exist" in err


# -- turnkit run and the terminal channel ----------------------------------------------


async def test_the_terminal_channel_shows_replies_tools_and_questions_escaped(
    open_runtime: Any,
) -> None:
    agent = hostile_agent()
    ctx = mount_agent(agent, await open_runtime(agent))
    out = io.StringIO(newline="")
    prompts: list[str] = []

    def ask(prompt: str) -> str:
        prompts.append(prompt)
        raise EOFError  # leave the question unanswered

    terminal = turnkit.TerminalChannel(out=out, ask=ask, user="cli:ana")
    done = await terminal.converse(ctx, "look", session="t1")
    assert done.status == "completed"
    with pytest.raises(EOFError):
        await terminal.converse(ctx, "park", session="t2")
    failed = await terminal.converse(ctx, "fail", session="t3")
    assert failed.status == "failed"
    shown = out.getvalue()
    assert_inert(shown)
    assert_inert("".join(prompts))
    assert_shows_escaped(shown)  # the streamed reply, the tool input and result
    assert "✗ evil\\x1b[1;1H: unknown tool: evil\\x1b[1;1H" in shown
    assert "Allow a" not in shown  # the question is asked at the prompt, not printed too
    assert prompts[0].startswith("  ? Allow a\\x1b]0;pwned\\x07")
    assert "turn failed: " in shown and "boom a\\x1b]0;pwned\\x07" in shown


def test_a_streamed_crlf_split_between_deltas_stays_a_line_break() -> None:
    out = io.StringIO(newline="")
    renderer = turnkit.TerminalChannel(out=out)
    events = [
        turnkit.MessageDeltaEvent(turn_id="t", session_id="s", text=text)
        for text in ("one\r", "\ntwo\r", "three\r")
    ]
    events.append(turnkit.TurnCompletedEvent(turn_id="t", session_id="s", text=""))

    async def stream() -> Any:
        for event in events:
            yield event

    asyncio.run(renderer.deliver(None, stream()))
    assert out.getvalue() == "one\r\ntwo\\x0dthree\\x0d\n"


def hostile_folder(folder: Path, tool_body: str, *, on_import: str = "") -> Path:
    """An agent folder whose reply is hostile and whose one tool runs ``tool_body``."""
    (folder / "tools").mkdir(parents=True)
    (folder / "agent.py").write_text(
        "from turnkit.testing import ScriptedModel, ScriptedReply, tool_call\n"
        f"HOSTILE = {HOSTILE!r}\n"
        f"{on_import}\n"
        "agent = {'name': 'deployer'}\n"
        "def demo_model():\n"
        "    return ScriptedModel([\n"
        "        ScriptedReply(text='Sure ' + HOSTILE, tool_calls=[tool_call('act', {})]),\n"
        "        'never',\n"
        "    ])\n"
    )
    (folder / "tools" / "act.py").write_text(
        "import turnkit\n"
        f"HOSTILE = {HOSTILE!r}\n"
        "@turnkit.tool\n"
        "async def act(ctx: turnkit.ToolContext) -> str:\n"
        '    """Act."""\n'
        f"    {tool_body}\n"
    )
    return folder


def run_folder(folder: Path, cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", str(folder), "go"],
        cwd=cwd,
        input=b"",
        capture_output=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_turnkit_run_prints_a_hostile_turn_escaped(tmp_path: Path) -> None:
    ask = "return await ctx.request_input('ok', 'Allow ' + HOSTILE + '?')"
    status, out, err = run_folder(hostile_folder(tmp_path / "agent", ask), tmp_path)
    assert status == 3, err
    assert_inert(out)
    assert_inert(err)
    assert_shows_escaped(out)  # the streamed reply, the question and the prompt
    assert out.count("Allow a\\x1b]0;pwned\\x07") == 1  # asked once, at the prompt


def test_turnkit_error_lines_are_escaped(tmp_path: Path) -> None:
    fail = "raise turnkit.FatalToolError('boom ' + HOSTILE)"
    status, out, err = run_folder(hostile_folder(tmp_path / "fails", fail), tmp_path)
    assert status == 1
    assert_inert(out)
    assert_inert(err)
    assert "turnkit: turn failed: " in err and "boom a\\x1b]0;pwned\\x07" in err
    broken = hostile_folder(tmp_path / "broken", "return ''", on_import="raise OSError(HOSTILE)")
    status, out, err = run_folder(broken, tmp_path)
    assert status == 2 and err.startswith("turnkit: error: ")
    assert_inert(err)
    assert "a\\x1b]0;pwned\\x07" in err


def test_a_failed_delivery_shows_as_a_timeline_line_escaped() -> None:
    out = io.StringIO(newline="")
    events: list[turnkit.TurnEvent] = [
        turnkit.MessageDeltaEvent(turn_id="t", session_id="s", text="partly"),
        turnkit.DeliveryFailedEvent(
            turn_id="t",
            session_id="s",
            channel="slack",
            target="C1",
            method="chat.update",
            error=f"token_revoked{OSC_CLIPBOARD}",
        ),
        turnkit.TurnCompletedEvent(turn_id="t", session_id="s", text="partly"),
    ]

    async def stream() -> Any:
        for event in events:
            yield event

    asyncio.run(turnkit.TerminalChannel(out=out).deliver(None, stream()))
    shown = out.getvalue()
    assert_inert(shown)
    assert shown == (
        "partly\n  ✗ slack reply to C1 failed (chat.update): "
        "token_revoked\\x1b]52;c;cm0gLXJmIH4=\\x07\n"
    )
