"""One person at one machine: ``turnkit run``, ``turnkit answer`` and the ``turnkit dev``
page are the same local user over one SQLite file, and what the first two stored under
their former names (``cli:<login>``, ``dev:<login>``) stays that person's."""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_support import (
    OFFLINE_ENV,
    start_dev,
    stop,
    turnkit,
    turnkit_with_input,
    write_agent,
)
from server_support import by_header, serving
from starlette.requests import Request

import turnkit as tk
from turnkit import InboundEvent, User
from turnkit._access.authorize import one_person
from turnkit._access.principal import loopback_as
from turnkit._assembly.loader import AgentFolder
from turnkit._channels.local_user import local_user
from turnkit.server import Principal, SessionAccess, loopback_only, owner_only
from turnkit.stores import SqliteStore

LOGIN = getpass.getuser()
ME = f"local:{LOGIN}"
SESSIONS = "/agents/deployer/sessions"


def events_of(client: httpx.Client, session: str) -> list[dict[str, Any]]:
    reply = client.get(f"{SESSIONS}/{session}/transcript", params={"events": "true"})
    assert reply.status_code == 200, reply.text
    events: list[dict[str, Any]] = reply.json()["events"]
    return events


def answered_by(client: httpx.Client, session: str) -> list[str]:
    """Who answered each question of ``session``, from its event log (as the page shows)."""
    return [e["by"] for e in events_of(client, session) if e["type"] == "input.answered"]


def approve_on_the_page(client: httpx.Client, session: str, value: bool) -> str:
    """Answer ``session``'s parked question as the page does; the stream's text."""
    pending = client.get(f"{SESSIONS}/{session}/pending")
    assert pending.status_code == 200, pending.text
    request = pending.json()["request"]
    assert request is not None, f"{session} is not parked"
    body = {"turn_id": request["turn_id"], "input_id": request["id"], "value": value}
    reply = client.post(f"{SESSIONS}/{session}/resume", json=body)
    assert reply.status_code == 200, reply.text
    return reply.text


def listed(client: httpx.Client) -> dict[str, str]:
    reply = client.get(SESSIONS)
    assert reply.status_code == 200, reply.text
    return {s["session_id"]: s["status"] for s in reply.json()["sessions"]}


def test_what_turnkit_run_parks_is_read_answered_and_continued_on_the_dev_page(
    tmp_path: Path,
) -> None:
    """The CLI parks a turn; the page lists the session, reads it, approves the
    question and sends the next message, which parks again; ``turnkit answer``
    answers that one while the page serves; both answers are the local user's."""
    agent = write_agent(tmp_path / "deployer")
    parked = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    assert parked.returncode == 3, parked.stderr
    proc, url = start_dev(str(agent), cwd=tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            assert listed(client) == {"cli:deployer": "suspended"}
            request = client.get(f"{SESSIONS}/cli:deployer/pending").json()["request"]
            assert request["prompt"] == "Deploy api?"
            assert request["answerers"] == [{"kind": "user", "user_id": ME}]
            streamed = approve_on_the_page(client, "cli:deployer", True)
            assert "finished: {'deployed': True}" in streamed
            sent = client.post(f"{SESSIONS}/cli:deployer/chat", json={"text": "web"})
            assert sent.status_code == 200, sent.text
            assert sent.json()["status"] == "suspended"  # "Deploy web?", for the terminal
            # The terminal answers what the page's turn parked, the page still serving.
            done = turnkit_with_input("answer", str(agent), "no", cwd=tmp_path, stdin="")
            assert done.returncode == 0, done.stderr
            assert "finished: {'deployed': False}" in done.stdout
            assert listed(client) == {"cli:deployer": "idle"}  # one session, no other
            assert answered_by(client, "cli:deployer") == [ME, ME]
            messages = client.get(f"{SESSIONS}/cli:deployer/transcript").json()["messages"]
            assert [m["text"] for m in messages if m["role"] == "user"] == ["api", "web"]
    finally:
        stop(proc)
    shown = turnkit("show", "cli:deployer", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # Each answer with the channel it came through: the page (http), then the terminal.
    vias = re.findall(rf"answered approve by {re.escape(ME)} via (\w+) at ", shown.stdout)
    assert vias == ["http", "cli"], shown.stdout
    assert re.search(rf"^owner +{re.escape(ME)}$", shown.stdout, re.M)


async def _store_as_before(db: Path, agent_dir: Path) -> None:
    """Sessions as the older ``turnkit run`` and dev page stored them, each parked on
    "Deploy …?": the terminal's with no owner and spoken by ``cli:<login>`` (its
    question for ``cli:<login>``), one owned by ``cli:<login>``, the page's owned and
    spoken by ``dev:<login>``, and a remote user's, owned by ``bob``."""
    agent = AgentFolder.read(agent_dir).agent()
    async with tk.Runtime([agent], store=SqliteStore(db)) as runtime:
        stored = [
            ("cli-old", f"cli:{LOGIN}", None),
            ("cli-owned", f"cli:{LOGIN}", f"cli:{LOGIN}"),
            ("dev-old", f"dev:{LOGIN}", f"dev:{LOGIN}"),
            ("bobs", "bob", "bob"),
        ]
        for session_id, speaker, owner in stored:
            session = runtime.session("deployer", session_id)
            source = "cli" if speaker.startswith("cli:") else "http"
            event = InboundEvent(
                source=source, text=session_id, user=User(id=speaker, attested=True)
            )
            turn_id = await session.submit(session_id, event=event, owner=owner)
            assert (await session.result(turn_id)).status == "suspended"
            [request] = (await session.result(turn_id)).requests
            assert [a.user_id for a in request.answerers] == [speaker]


async def test_sessions_stored_under_the_former_names_are_yours_on_the_page_and_the_cli(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path / "deployer")
    db = tmp_path / ".turnkit" / "sessions.db"
    db.parent.mkdir()
    await _store_as_before(db, agent)
    proc, url = start_dev(str(agent), cwd=tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            mine = {"cli-old": "suspended", "cli-owned": "suspended", "dev-old": "suspended"}
            assert listed(client) == mine  # bob's stays his
            for session in ("cli-old", "cli-owned"):
                prompt = client.get(f"{SESSIONS}/{session}/pending").json()["request"]["prompt"]
                assert prompt == f"Deploy {session}?"
                assert "finished: {'deployed': True}" in approve_on_the_page(client, session, True)
                # Answered under the name the question asked for: the same person's.
                assert answered_by(client, session) == [f"cli:{LOGIN}"]
                sent = client.post(f"{SESSIONS}/{session}/chat", json={"text": "db"})
                assert sent.status_code == 200 and sent.json()["status"] == "suspended"
            # The older page's question, answered at the terminal.
            done = turnkit_with_input(
                "answer", str(agent), "yes", "--session", "dev-old", cwd=tmp_path, stdin=""
            )
            assert done.returncode == 0, done.stderr
            assert answered_by(client, "dev-old") == [f"dev:{LOGIN}"]
            # A remote user's session is as missing as ever, and sending leaves no trace.
            for path in ("transcript", "pending"):
                hidden = client.get(f"{SESSIONS}/bobs/{path}")
                assert hidden.status_code == 404 and hidden.json()["code"] == "unknown_session"
            refused = client.post(f"{SESSIONS}/bobs/chat", json={"text": "hi"})
            assert refused.status_code == 404
            assert listed(client) == {**mine, "dev-old": "idle"}
    finally:
        stop(proc)


def test_turnkit_user_names_someone_else_for_the_cli_and_the_page(tmp_path: Path) -> None:
    """``TURNKIT_USER`` overrides the local user; a name chosen so has no aliases, so
    the default user's sessions are not its own."""
    agent = write_agent(tmp_path / "deployer")
    mine = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    assert mine.returncode == 3, mine.stderr
    as_ana = turnkit_as("ana", "run", str(agent), "web", "--session", "anas", cwd=tmp_path)
    assert as_ana.returncode == 3, as_ana.stderr
    proc, url = start_dev(str(agent), cwd=tmp_path, env={"TURNKIT_USER": "ana"})
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            assert listed(client) == {"anas": "suspended"}
            request = client.get(f"{SESSIONS}/anas/pending").json()["request"]
            assert request["answerers"] == [{"kind": "user", "user_id": "ana"}]
            assert "finished: {'deployed': True}" in approve_on_the_page(client, "anas", True)
            assert answered_by(client, "anas") == ["ana"]
            hidden = client.get(f"{SESSIONS}/cli:deployer/pending")
            assert hidden.status_code == 404
    finally:
        stop(proc)
    bad = turnkit_as(" ", "run", str(agent), "hi", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "turnkit: error: TURNKIT_USER must be a user id: not empty, without control "
        "characters, got ' '"
    )


def turnkit_as(user: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``turnkit`` with ``TURNKIT_USER=user``, its input already at its end."""
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1", "TURNKIT_USER": user},
    )


def test_the_local_user_is_local_login_with_its_former_names_unless_named_otherwise() -> None:
    assert local_user(env={}).names == (ME, f"cli:{LOGIN}", f"dev:{LOGIN}")
    assert local_user(env={"TURNKIT_USER": "ana"}).names == ("ana",)
    assert local_user("bo", env={"TURNKIT_USER": "ana"}).names == ("bo",)
    # Naming the default is the default, former names and all.
    assert local_user(env={"TURNKIT_USER": ME}).names == local_user(env={}).names
    for bad in ("", " ana", "ana\n", "a\x1bb"):
        with pytest.raises(tk.ConfigurationError, match="TURNKIT_USER must"):
            local_user(env={"TURNKIT_USER": bad})


def _request(host: str) -> Request:
    return Request({"type": "http", "client": (host, 5000), "headers": [], "method": "GET"})


def test_only_the_loopback_principal_goes_by_the_former_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TURNKIT_USER", "ana")
    principal = loopback_only(_request("127.0.0.1"))
    assert principal is not None and principal.names == ("ana",)
    chosen = loopback_as(local_user(env={}))(_request("::1"))
    assert chosen is not None and chosen.names == (ME, f"cli:{LOGIN}", f"dev:{LOGIN}")
    assert loopback_as(local_user(env={}))(_request("10.0.0.5")) is None
    with pytest.raises(ValueError, match="aliases"):
        Principal(id="x", aliases=("",))


def test_one_person_counts_ownerless_sessions_and_nobody_elses() -> None:
    me = Principal(id=ME, aliases=(f"cli:{LOGIN}",))
    for owner, expected in [(None, True), (ME, True), (f"cli:{LOGIN}", True), ("bob", False)]:
        access = SessionAccess(agent="a", session_id="s", owner=owner, action="read")
        assert one_person(me, access) is expected, owner
        assert owner_only(me, access) is (expected and owner is not None), owner
    new = SessionAccess(agent="a", session_id="s", owner=None, action="read", exists=False)
    assert not one_person(me, new)


async def test_a_remote_principal_named_like_a_former_name_gets_nothing_of_it(
    tmp_path: Path,
) -> None:
    """The former names are the loopback principal's aliases, not a rule about ids: a
    remote caller whose id happens to be ``dev:<login>`` sees none of ``local:<login>``'s
    or ``cli:<login>``'s sessions, nor answers their questions."""
    agent = AgentFolder.read(write_agent(tmp_path / "deployer")).agent()
    async with tk.Runtime([agent], store=SqliteStore(tmp_path / "s.db")) as runtime:
        for session_id, owner in (("new", ME), ("old", f"cli:{LOGIN}")):
            event = InboundEvent(source="cli", text="api", user=User(id=owner, attested=True))
            session = runtime.session("deployer", session_id)
            await session.result(await session.submit("api", event=event, owner=owner))
        async with serving(runtime, authenticate=by_header) as served:
            remote = {"X-User": f"dev:{LOGIN}"}
            reply = await served.client.get(SESSIONS, headers=remote)
            assert reply.json()["sessions"] == []
            for session_id in ("new", "old"):
                request = await runtime.session("deployer", session_id).pending()
                assert request is not None
                answer = {"turn_id": request.turn_id, "input_id": request.id, "value": True}
                path = served.path("deployer", session_id, "resume")
                refused = await served.client.post(path, json=answer, headers=remote)
                assert refused.status_code == 404, refused.text
