"""``turnkit dev`` as a person runs it: a real subprocess serving the example agent."""

from __future__ import annotations

import fnmatch
import getpass
import hashlib
import json
import logging
import re
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cli_support import console_spans, start_dev, stop, turnkit
from slack_support import SECRET, FakeSlack, mention, signed
from starlette.requests import Request
from suite_paths import ROOT

from turnkit import (
    LocalEventSink,
    MessageDeltaEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnFailedEvent,
    TurnStartedEvent,
)
from turnkit.server import loopback_only
from turnkit.server._dev_log import TurnLog


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = start_dev(cwd=tmp_path)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_dev_serves_the_bundled_example_with_its_page_and_says_which_model(
    dev: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    proc, url = dev
    with httpx.Client(base_url=url, timeout=30) as client:
        agents = client.get("/agents").json()
        assert agents["agents"] == [{"name": "ops"}]
        assert "offline demo model" in agents["notice"]
        page = client.get("/")
        assert page.status_code == 200 and "<html" in page.text
        for script in ("marked.umd.js", "purify.min.js"):
            served = client.get(f"/static/vendor/{script}")
            assert served.status_code == 200 and f'src="/static/vendor/{script}"' in page.text
            assert "javascript" in served.headers["content-type"]
        reply = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 2 blue widgets"})
        assert reply.json()["text"] == "Done: order #1 (2 x blue widgets) is packed."
    assert (tmp_path / ".turnkit" / "sessions.db").exists()
    proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop, as for any command
    assert proc.wait(15) == 130
    _, err = proc.communicate()
    assert err.strip().splitlines()[-1] == "turnkit: interrupted"
    assert "Traceback" not in err


def test_dev_stops_gracefully_on_sigterm_and_exits_0(
    dev: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    """What a service manager sends: the server stops, the runtime and its store
    close, and the exit status is 0 (it was 143, killed by the signal raised again)."""
    proc, url = dev
    with httpx.Client(base_url=url, timeout=30) as client:
        reply = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 2 blue widgets"})
        assert reply.status_code == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    _, err = proc.communicate()
    assert err.strip().splitlines()[-1] == "turnkit dev: stopped (SIGTERM)"
    assert "Traceback" not in err
    # Closed, not killed: the store's last connection checkpointed and removed its WAL.
    assert not (tmp_path / ".turnkit" / "sessions.db-wal").exists()


def test_dev_refuses_a_rebound_host_and_a_foreign_origin(
    dev: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    """DNS rebinding: a page at attacker.example whose name now points at 127.0.0.1
    reaches the port, but its requests carry its own Host and Origin."""
    _, url = dev
    port = url.rstrip("/").rsplit(":", 1)[1]
    chat = "/agents/ops/sessions/s1/chat"
    order = {"text": "order 2 blue widgets"}
    with httpx.Client(base_url=url, timeout=30) as client:
        for host in (f"attacker.example:{port}", "attacker.example", f"localhost.evil:{port}"):
            forged = {"Host": host, "Origin": f"http://{host}"}
            for method, path in [("GET", "/agents"), ("GET", "/"), ("POST", chat)]:
                reply = client.request(
                    method, path, json=order if method == "POST" else None, headers=forged
                )
                assert reply.status_code == 421, (host, path, reply.text)
                assert reply.json()["code"] == "misdirected_request"
        for origin in ("http://attacker.example", f"http://attacker.example:{port}", "null"):
            reply = client.post(chat, json=order, headers={"Origin": origin})
            assert reply.status_code == 403 and reply.json()["code"] == "cross_origin", origin
        sessions = client.get("/agents/ops/sessions").json()["sessions"]
        assert sessions == []  # nothing ran, nothing was stored
        # The page's own origin, by each loopback name, is served.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            reply = client.post(
                chat, json=order, headers={"Host": host, "Origin": f"http://{host}"}
            )
            assert reply.status_code == 200, (host, reply.text)
            assert reply.json()["text"].startswith("Done: order #"), reply.text


def test_dev_finishes_a_turn_a_killed_run_left_open(tmp_path: Path) -> None:
    fixture = str(ROOT / "tests" / "fixtures" / "slow_agent")
    release = tmp_path / "release"
    env = {"TURNKIT_TEST_RELEASE": str(release)}
    proc, url = start_dev(fixture, "--store", "s.db", cwd=tmp_path, env=env)
    with httpx.Client(base_url=url, timeout=30) as client:
        name = client.get("/agents").json()["agents"][0]["name"]
        turns = f"/agents/{name}/sessions/s1/turns"
        with client.stream("POST", turns, json={"text": "go slowly"}) as stream:
            lines = []
            for line in stream.iter_lines():
                lines.append(line)
                if line == "event: action.requested":
                    break
        turn_id = json.loads(lines[2].removeprefix("data: "))["turn_id"]
    proc.kill()  # mid-turn: the tool is waiting for the release file
    proc.wait(10)
    release.write_text("go")
    proc, url = start_dev(fixture, "--store", "s.db", cwd=tmp_path, env=env)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            events = f"/agents/{name}/sessions/s1/events"
            params = {"turn_id": turn_id}
            with client.stream(
                "GET", events, params=params, headers={"Last-Event-ID": "1"}
            ) as feed:
                seen = [line for line in feed.iter_lines() if line.startswith("event: ")]
            transcript = client.get(f"/agents/{name}/sessions/s1/transcript").json()
    finally:
        proc.kill()
        proc.wait(10)
    assert seen[-1] == "event: turn.completed"
    assert re.search(
        rf"^\d\d:\d\d:\d\d turn {turn_id} on session s1 completed \(recovered\)$",
        proc.communicate()[1],
        re.MULTILINE,
    )
    assert transcript["status"] == "idle"
    assert [m["role"] for m in transcript["messages"]][-2:] == ["tool", "assistant"]


def test_dev_logs_a_line_per_request_and_per_turn_ending(tmp_path: Path) -> None:
    proc, url = start_dev(cwd=tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/agents").status_code == 200
            done = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 2 hush-hush"})
            assert done.json()["status"] == "completed"
            parked = client.post("/agents/ops/sessions/p/chat", json={"text": "refund order 1"})
            assert parked.json()["status"] == "suspended"
            forged = "/agents/ops/sessions/s%0A12:00:00 GET %1B[2J/chat"
            assert client.post(forged, json={"text": "hi"}).status_code == 400
            assert client.get("/nowhere", params={"token": "sekret"}).status_code == 404
    finally:
        err = stop(proc)
    time_ = r"\d\d:\d\d:\d\d"
    turn = r"[0-9a-f]{32}"
    for expected in [
        rf"{time_} GET /agents 200 \d+ ms",
        rf"{time_} POST /agents/ops/sessions/s1/chat 200 \d+ ms",
        rf"{time_} turn {turn} on session s1 completed in \d+\.\d s",
        rf"{time_} turn {turn} on session p parked in \d+\.\d s",
        rf"{time_} POST /agents/ops/sessions/s\\x0a12:00:00 GET \\x1b\[2J/chat 400 \d+ ms",
        rf"{time_} GET /nowhere 404 \d+ ms",
    ]:
        assert re.search(rf"^{expected}$", err, re.MULTILINE), (expected, err)
    assert "hush-hush" not in err and "sekret" not in err and "\x1b" not in err
    assert "Traceback" not in err


def test_dev_quiet_logs_no_requests_or_turns(tmp_path: Path) -> None:
    proc, url = start_dev("--quiet", cwd=tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            reply = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 1 pen"})
            assert reply.json()["status"] == "completed"
    finally:
        err = stop(proc)
    assert err.splitlines() == [
        "turnkit dev: No model configured; using the offline demo model.",
        "turnkit: interrupted",
    ]


def test_dev_otel_prints_each_turns_spans(tmp_path: Path) -> None:
    proc, url = start_dev(
        "--quiet", "--otel", cwd=tmp_path, env={"OTEL_TRACES_EXPORTER": "console"}
    )
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            reply = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 1 pen"})
            assert reply.json()["status"] == "completed"
    finally:
        err = stop(proc)
    spans = console_spans(err)
    (turn,) = [s for s in spans if s["name"] == "invoke_agent ops"]
    assert turn["attributes"]["turnkit.session.id"] == "s1"
    assert "execute_tool create_order" in [s["name"] for s in spans]
    assert "Traceback" not in err


def test_the_turn_log_names_every_ending_and_never_an_error_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = LocalEventSink()
    turns = TurnLog()
    unwatch = turns.watch(sink)
    turns.recovering(["t4"])
    ids = {"turn_id": "t", "session_id": "s\x1b]0;x\x07"}
    with caplog.at_level(logging.INFO, logger="turnkit.dev"):
        sink.emit(TurnStartedEvent(**{**ids, "turn_id": "t1"}, text="hi", seq=1))
        sink.emit(TurnCompletedEvent(**{**ids, "turn_id": "t1"}, text="ok", seq=2))
        sink.emit(TurnFailedEvent(**{**ids, "turn_id": "t2"}, error="key sk-123 leaked"))
        sink.emit(TurnCancelledEvent(**{**ids, "turn_id": "t3"}, reason="replaced"))
        sink.emit(TurnCompletedEvent(**{**ids, "turn_id": "t4"}, text="ok", seq=3))
        sink.emit(MessageDeltaEvent(**ids, text="x"))
    unwatch()
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.dev"]
    session = "s\\x1b]0;x\\x07"
    assert lines[0].startswith(f"turn t1 on session {session} completed in ")
    assert lines[1:] == [
        f"turn t2 on session {session} failed; turnkit show '{session}' has the error",
        f"turn t3 on session {session} cancelled",
        f"turn t4 on session {session} completed (recovered)",
    ]


def test_dev_refuses_a_non_loopback_address_and_a_busy_port(tmp_path: Path) -> None:
    refused = turnkit("dev", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "turnkit: error: turnkit dev serves loopback addresses only (127.0.0.1, ::1), not "
        "'0.0.0.0'; put create_app behind your own server with real authentication instead"
    ]
    proc, url = start_dev(cwd=tmp_path)
    try:
        port = url.rsplit(":", 1)[1].strip("/")
        busy = turnkit("dev", "--port", port, "--store", "other.db", cwd=tmp_path)
        assert busy.returncode == 2
        assert (
            busy.stderr.strip()
            .splitlines()[-1]
            .startswith(f"turnkit: error: cannot listen on 127.0.0.1:{port}:")
        )
    finally:
        proc.kill()
        proc.wait(10)
    bad_port = turnkit("dev", "--port", "70000", cwd=tmp_path)
    assert bad_port.returncode == 2 and "expected a port from 0 to 65535" in bad_port.stderr
    helped = turnkit("dev", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "loopback" in helped.stdout


def _request(host: str) -> Request:
    return Request({"type": "http", "client": (host, 5000), "headers": [], "method": "GET"})


def test_loopback_only_admits_this_machine_and_nobody_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TURNKIT_USER", raising=False)
    login = getpass.getuser()
    for host in ("127.0.0.1", "127.8.9.10", "::1"):
        principal = loopback_only(_request(host))
        assert principal is not None and principal.attested
        # The local user, as turnkit run has it, also going by the names both had before.
        assert principal.names == (f"local:{login}", f"cli:{login}", f"dev:{login}")
    for host in ("10.0.0.5", "192.168.1.2", "8.8.8.8", "not-an-address"):
        assert loopback_only(_request(host)) is None
    assert loopback_only(Request({"type": "http", "headers": [], "method": "GET"})) is None


def test_dev_serves_on_postgres(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    joiner = "&" if "?" in pg_dsn else "?"
    store = f"{pg_dsn}{joiner}options=-csearch_path%3D{pg_schema}"
    proc, url = start_dev("--store", store, cwd=tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            reply = client.post("/agents/ops/sessions/s1/chat", json={"text": "order 3 bolts"})
            assert reply.json()["text"] == "Done: order #1 (3 x bolts) is packed."
            listed = client.get("/agents/ops/sessions").json()
            assert [row["session_id"] for row in listed["sessions"]] == ["s1"]
    finally:
        proc.kill()
        proc.wait(10)
    assert not (tmp_path / ".turnkit").exists()  # nothing went to a SQLite file


STATIC = ROOT / "src" / "turnkit" / "server" / "static"


def test_the_vendored_scripts_are_the_recorded_ones_and_every_static_file_ships() -> None:
    vendor = STATIC / "vendor"
    recorded = dict(
        re.findall(
            r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", (vendor / "README.md").read_text(), re.M
        )
    )
    files = {p.name for p in vendor.iterdir() if p.name != "README.md"}
    assert set(recorded) == files
    for name, digest in recorded.items():
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    # Every file beside the page is package data, so an installed turnkit serves it.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["turnkit"]
    package = ROOT / "src" / "turnkit"
    for path in STATIC.rglob("*"):
        if path.is_file():
            relative = path.relative_to(package).as_posix()
            assert any(
                fnmatch.fnmatch(relative, p) and relative.count("/") == p.count("/")
                for p in patterns
            ), relative


def test_the_page_never_writes_html_text_into_the_document() -> None:
    """The page builds every node with createElement/textContent; the Markdown it shows
    comes from DOMPurify as a fragment, never as HTML text assigned to an element."""
    script = (STATIC / "index.html").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_dev_slack_serves_the_agent_in_slack_on_its_own_port(tmp_path: Path) -> None:
    """``turnkit dev --slack``: a signed mention on the Slack port gets the agent's
    reply through the Web API (a local stand-in); each port serves only its own."""
    pytest.importorskip("slack_sdk")
    from server_support import serve_app_in_thread
    from starlette.applications import Starlette
    from starlette.routing import Route

    fake = FakeSlack()
    api = Starlette(routes=[Route("/api/{method}", fake.handle, methods=["POST"])])
    with serve_app_in_thread(api) as api_url:
        env = {
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_BOT_TOKEN": "xoxb-test",
            "SLACK_API_URL": f"{api_url}/api/",
        }
        proc, url = start_dev("--slack", "--slack-port", "0", cwd=tmp_path, env=env)
        try:
            _mention_on_the_slack_port(proc, url, fake)
        finally:
            proc.kill()
            proc.wait(10)


def _mention_on_the_slack_port(proc: subprocess.Popen[str], url: str, fake: FakeSlack) -> None:
    from eventually import eventually_blocking

    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"Slack on (http://127\.0\.0\.1:\d+)/slack/", line)
    assert found is not None, line
    assert "/slack/events" in line and "/slack/interactivity" in line
    slack_url = found.group(1)
    body = mention("order 2 blue widgets", event_id="Ev1")
    headers = {**signed(body), "Content-Type": "application/json"}
    with httpx.Client(timeout=30) as client:
        assert (
            client.post(f"{slack_url}/slack/events", content=body, headers=headers).status_code
            == 200
        )
        assert client.post(f"{url}slack/events", content=body, headers=headers).status_code == 404
        assert client.get(f"{slack_url}/agents").status_code == 404
        forged = client.post(
            f"{slack_url}/slack/events",
            content=body,
            headers={**headers, "X-Slack-Signature": "v0=00"},
        )
        assert forged.status_code == 401
    done = "Done: order #1 (2 x blue widgets) is packed."
    eventually_blocking(
        lambda: any(a.get("text", "").endswith(done) for m, a in fake.calls if m == "chat.update"),
        what="the reply drawn in Slack",
        timeout=60,
    )


def test_dev_slack_needs_its_secrets_in_the_environment(tmp_path: Path) -> None:
    result = turnkit("dev", "--slack", "--port", "0", cwd=tmp_path)
    assert result.returncode != 0
    assert "SLACK_SIGNING_SECRET and SLACK_BOT_TOKEN" in result.stderr


def test_turnkit_run_works_on_the_file_turnkit_dev_is_serving(
    dev: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    """Both default to .turnkit/sessions.db: two processes on one SQLite file, each
    session run by one of them at a time, neither failing the other's turns."""
    proc, url = dev
    with httpx.Client(base_url=url, timeout=30) as client:
        first = client.post("/agents/ops/sessions/web/chat", json={"text": "order 2 blue widgets"})
        assert first.json()["text"] == "Done: order #1 (2 x blue widgets) is packed."
        done = turnkit("run", "order 1 red pen", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "order #2 (1 x red pen)" in done.stdout
        again = client.post("/agents/ops/sessions/web/chat", json={"text": "order 3 green cups"})
        assert "order #3 (3 x green cups)" in again.json()["text"]  # one shared file
    assert proc.poll() is None  # still serving
