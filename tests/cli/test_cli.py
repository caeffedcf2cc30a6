"""The ``turnkit`` command, run as a user runs it: a real subprocess on a real SQLite file."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from cli_support import (
    EXAMPLE,
    OFFLINE_ENV,
    console_spans,
    turnkit,
    turnkit_with_input,
    write_agent,
)
from suite_paths import FIXTURES, ROOT

from turnkit import ConfigurationError
from turnkit.cli._logging import log_to_stderr


def test_run_streams_a_turn_of_the_example_agent(tmp_path: Path) -> None:
    done = turnkit("run", str(EXAMPLE), "order 2 blue widgets", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no model configured; using the offline demo model" in done.stderr
    out = done.stdout
    assert "→ create_order" in out and "→ lookup_order" in out
    assert "Done: order #1 (2 x blue widgets) is packed." in out
    db = tmp_path / ".turnkit" / "sessions.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT item, quantity FROM orders").fetchall() == [("blue widgets", 2)]
    again = turnkit("run", str(EXAMPLE), "order 1 red pen", "--session", "other", cwd=tmp_path)
    assert again.returncode == 0 and "order #2 (1 x red pen)" in again.stdout


def test_tool_errors_show_in_the_timeline(tmp_path: Path) -> None:
    done = turnkit("run", str(EXAMPLE), "order 0 ghosts", "--store", "x.db", cwd=tmp_path)
    assert done.returncode == 0
    assert "✗ create_order: ValueError: quantity must be at least 1" in done.stdout


def test_errors_are_one_line_without_a_traceback(tmp_path: Path) -> None:
    done = turnkit("run", str(tmp_path / "nowhere"), "hi", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"turnkit: error: agent folder {str(tmp_path / 'nowhere')!r} does not exist"
    ]


def test_help_lists_the_run_command(tmp_path: Path) -> None:
    done = turnkit("run", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--session" in done.stdout and "--store" in done.stdout


def test_a_parked_turn_asks_at_the_prompt(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "deployer")
    done = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="maybe\ny\n")
    assert done.returncode == 0, done.stderr
    assert "? Deploy api?" in done.stdout
    assert "! answer yes or no" in done.stdout
    assert '← deploy: {"deployed": true}' in done.stdout
    assert "finished: {'deployed': True}" in done.stdout


def test_an_unanswered_park_waits_for_the_next_run(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "deployer")
    first = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    assert first.returncode == 3
    assert "the turn waits for one on the next run" in first.stderr
    second = turnkit_with_input("run", str(agent), "web", cwd=tmp_path, stdin="n\ny\n")
    assert second.returncode == 0, second.stderr
    out = second.stdout
    assert "waiting on turn" in out
    assert out.index("finished: {'deployed': False}") < out.index("Deploy web?")
    assert "finished: {'deployed': True}" in out


def test_answer_answers_the_park_and_starts_no_new_turn(tmp_path: Path) -> None:
    """``turnkit answer`` resumes the parked turn, given the answer or at the prompt,
    and says nothing new to the agent (issue 37 item 7)."""
    agent = write_agent(tmp_path / "deployer")
    parked = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    assert parked.returncode == 3
    given = turnkit_with_input("answer", str(agent), "yes", cwd=tmp_path, stdin="")
    assert given.returncode == 0, given.stderr
    assert "finished: {'deployed': True}" in given.stdout
    assert "Deploy api?" not in given.stdout  # answered as given, not asked
    shown = turnkit_with_input("show", "cli:deployer", "--json", cwd=tmp_path, stdin="")
    users = [m for m in json.loads(shown.stdout)["messages"] if m["role"] == "user"]
    assert [m["text"] for m in users] == ["api"]  # no second turn
    nothing = turnkit_with_input("answer", str(agent), cwd=tmp_path, stdin="")
    assert nothing.returncode == 2
    assert "session 'cli:deployer' is not waiting for an answer" in nothing.stderr
    again = turnkit_with_input("run", str(agent), "web", cwd=tmp_path, stdin="")
    assert again.returncode == 3
    asked = turnkit_with_input("answer", str(agent), cwd=tmp_path, stdin="maybe\nn\n")
    assert asked.returncode == 0, asked.stderr
    assert "? Deploy web?" in asked.stdout and "! answer yes or no" in asked.stdout
    assert "finished: {'deployed': False}" in asked.stdout


def test_answer_refuses_a_bad_answer_and_stray_words(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "deployer")
    turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    bad = turnkit_with_input("answer", str(agent), "perhaps", cwd=tmp_path, stdin="")
    assert bad.returncode == 2 and "answer yes or no" in bad.stderr
    stray = turnkit_with_input("answer", "nowhere", "yes", cwd=tmp_path, stdin="")
    assert stray.returncode == 2 and "'nowhere' is not a folder" in stray.stderr


def test_ctrl_c_at_the_prompt_exits_at_once_and_keeps_the_park(tmp_path: Path) -> None:
    import signal

    agent = write_agent(tmp_path / "deployer")
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "run", str(agent), "api"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,  # left open: the prompt blocks in input()
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "? Deploy api? (yes/no) > " not in seen:  # the prompt ends no line
            chunk = os.read(proc.stdout.fileno(), 4096).decode()
            assert chunk, "the run ended before asking"
            seen += chunk
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a hang here is the bug
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    again = turnkit_with_input("run", str(agent), "web", cwd=tmp_path, stdin="y\nn\n")
    assert "waiting on turn" in again.stdout


def test_text_alone_runs_the_bundled_example(tmp_path: Path) -> None:
    done = turnkit("run", "order 2 blue widgets", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Done: order #1 (2 x blue widgets) is packed." in done.stdout
    sessions = turnkit("sessions", "--json", cwd=tmp_path)
    assert [(s["session_id"], s["agent"]) for s in json.loads(sessions.stdout)] == [
        ("cli:ops", "ops")
    ]


def test_each_agent_has_its_own_default_session(tmp_path: Path) -> None:
    mine = tmp_path / "myagent"
    mine.mkdir()
    (mine / "instructions.md").write_text("Be brief.\n")
    assert turnkit("run", str(EXAMPLE), "order 1 pen", cwd=tmp_path).returncode == 0
    done = turnkit("run", str(mine), "hello", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "You said: hello" in done.stdout
    sessions = turnkit("sessions", "--json", cwd=tmp_path)
    owners = {s["session_id"]: s["agent"] for s in json.loads(sessions.stdout)}
    assert owners == {"cli:ops": "ops", "cli:myagent": "myagent"}


def test_a_session_of_another_agent_is_one_line_and_stores_nothing(tmp_path: Path) -> None:
    mine = tmp_path / "myagent"
    mine.mkdir()
    (mine / "instructions.md").write_text("Be brief.\n")
    assert (
        turnkit("run", str(EXAMPLE), "order 1 pen", "--session", "s", cwd=tmp_path).returncode == 0
    )
    done = turnkit("run", str(mine), "hello", "--session", "s", cwd=tmp_path)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "offline demo" not in line]
    assert errors == [
        "turnkit: error: session 's' belongs to agent 'ops', not 'myagent'; name another "
        "with --session, or leave it out for 'cli:myagent'"
    ]
    assert done.stdout == ""
    shown = json.loads(turnkit("show", "s", "--json", cwd=tmp_path).stdout)
    assert shown["agent"] == "ops" and len(shown["turns"]) == 1


def test_a_folder_without_an_agent_and_a_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    empty = turnkit("run", "empty", "hi", cwd=tmp_path)
    assert empty.returncode == 2 and empty.stdout == ""
    assert empty.stderr.splitlines() == [
        "turnkit: error: 'empty' holds no agent: an agent folder has an agent.py, an "
        "instructions.md or a tools/ folder of tool modules (see docs/agent-folders.md)"
    ]
    a_file = turnkit("run", "notes.txt", "hi", cwd=tmp_path)
    assert a_file.returncode == 2
    assert "agent folder 'notes.txt' is not a folder" in a_file.stderr
    assert not (tmp_path / ".turnkit").exists()  # refused before any store was made


def test_run_arguments_that_cannot_mean_a_turn_are_refused(tmp_path: Path) -> None:
    (tmp_path / "myagent").mkdir()
    for args, says in [
        (["myagent"], "'myagent' is a folder; say what to tell its agent"),
        ([str(EXAMPLE), ""], "the text must not be empty"),
        ([str(EXAMPLE), "  \n"], "the text must not be empty"),
        ([""], "the text must not be empty"),
        (
            ["order", "2", "widgets"],
            "turnkit run takes [AGENT_DIR] TEXT, got 3 words; quote the text",
        ),
    ]:
        done = turnkit("run", *args, cwd=tmp_path)
        assert done.returncode == 2, args
        assert done.stderr.startswith(f"turnkit: error: {says}") and done.stderr.count("\n") == 1
    assert not (tmp_path / ".turnkit").exists()


def test_version_comes_from_the_package_metadata(tmp_path: Path) -> None:
    done = turnkit("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout == f"turnkit {metadata.version('turnkit')}\n"


def test_the_question_is_asked_once_and_piped_answers_end_their_line(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "deployer")
    done = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Deploy api?") == 1
    assert "  ? Deploy api? (yes/no) > \n  ← deploy:" in done.stdout


def test_the_end_of_input_at_the_prompt_ends_its_line(tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "deployer")
    done = turnkit_with_input("run", str(agent), "api", cwd=tmp_path, stdin="")
    assert done.returncode == 3
    assert done.stdout.endswith("  ? Deploy api? (yes/no) > \n")


def test_library_warnings_print_as_one_line_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKIT_DEBUG", raising=False)
    undo = log_to_stderr(tracebacks=False)
    try:
        try:
            raise ConfigurationError("session 'cli' belongs to agent 'ops'\x1b[2J")
        except ConfigurationError:
            logging.getLogger("turnkit.runtime").exception("turn t1 on session %s crashed", "s")
    finally:
        undo()
    assert capsys.readouterr().err == (
        "turnkit: turn t1 on session s crashed: ConfigurationError: session 'cli' belongs "
        "to agent 'ops'\\x1b[2J\n"
    )


def test_two_questions_of_one_step_are_asked_one_after_the_other(tmp_path: Path) -> None:
    forms = ROOT / "tests" / "fixtures" / "form_agent"
    first = turnkit_with_input("run", str(forms), "both please", cwd=tmp_path, stdin="")
    assert first.returncode == 3, first.stderr  # no answers yet: both wait
    shown = turnkit("show", "cli:forms", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "parked input 1 of 2" in out and "parked input 2 of 2" in out
    assert out.index("Whose order is it?") < out.index("Approve, with a note?")
    answers = 'Bo\n{"approved": true}\n'
    second = turnkit_with_input("run", str(forms), "next", cwd=tmp_path, stdin=answers)
    # Both answered, the parked turn finished; "next" then asks again, unanswered.
    assert second.returncode == 3, second.stderr
    out = second.stdout
    assert 'Got "Bo" and {"approved": true}.' in out
    assert out.index("Whose order is it?") < out.index("Approve, with a note?")


# -- --otel --------------------------------------------------------------------------


def test_run_with_otel_prints_the_turns_spans(tmp_path: Path) -> None:
    env = {k: v for k, v in OFFLINE_ENV.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", str(EXAMPLE), "order 2 widgets", "--otel"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "Done: order #1 (2 x widgets) is packed." in done.stdout
    assert '"name"' not in done.stdout  # the spans go to stderr, the turn to stdout
    spans = console_spans(done.stderr)
    names = [span["name"] for span in spans]
    (turn,) = [s for s in spans if s["name"].startswith("invoke_agent ")]
    assert "execute_tool create_order" in names and "execute_tool lookup_order" in names
    assert any(name.startswith("chat") for name in names)
    assert turn["attributes"]["turnkit.session.id"] == "cli:ops"
    assert turn["attributes"]["turnkit.turn.status"] == "completed"
    assert turn["resource"]["attributes"]["service.name"] == "turnkit"
    # Every step is in the turn's trace, under its span.
    steps = [s for s in spans if s is not turn]
    assert {s["context"]["trace_id"] for s in steps} == {turn["context"]["trace_id"]}
    assert {s["parent_id"] for s in steps} == {turn["context"]["span_id"]}
    # Without the flag nothing is traced.
    plain = turnkit("run", str(EXAMPLE), "order 1 red pen", cwd=tmp_path)
    assert plain.returncode == 0 and console_spans(plain.stderr) == []


#: Makes the modules TURNKIT_TEST_HIDE names unimportable, as if not installed.
HIDE = """
import os, sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        for hidden in os.environ["TURNKIT_TEST_HIDE"].split(","):
            if name == hidden or name.startswith(hidden + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


@pytest.mark.parametrize(
    ("hide", "env", "says"),
    [
        (
            "opentelemetry.sdk",
            {},
            "needs the OpenTelemetry SDK to record spans: pip install opentelemetry-sdk",
        ),
        ("opentelemetry", {}, "needs OpenTelemetry: pip install 'turnkit[otel]' opentelemetry-sdk"),
        (
            "opentelemetry.exporter",
            {"OTEL_TRACES_EXPORTER": "otlp"},
            "pip install opentelemetry-exporter-otlp-proto-http",
        ),
        (
            "opentelemetry.exporter",
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "pip install opentelemetry-exporter-otlp-proto-grpc",
        ),
        ("nothing", {"OTEL_TRACES_EXPORTER": "zipkin"}, "knows console, otlp and none, not zipkin"),
    ],
)
def test_otel_without_what_it_needs_is_one_line_naming_it(
    tmp_path: Path, hide: str, env: dict[str, str], says: str
) -> None:
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    clean = {k: v for k, v in OFFLINE_ENV.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", str(EXAMPLE), "hi", "--otel"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env, "PYTHONPATH": str(tmp_path), "TURNKIT_TEST_HIDE": hide},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("turnkit: error: turnkit run --otel") or "OTEL_" in done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / ".turnkit").exists()  # refused before the store opened


@pytest.mark.slow
def test_the_ctrl_c_tests_pass_when_the_suite_starts_with_sigint_ignored() -> None:
    """Issue 37 item 4: run as a background job (SIGINT ignored), the children the
    tests start inherited the ignored signal and Ctrl-C never reached them;
    conftest restores the default first."""
    import os
    import signal
    import subprocess
    import sys

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            str(Path(__file__)),
            "-k",
            "ctrl_c_at_the_prompt",
        ],
        preexec_fn=ignore_sigint,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in done.stdout


def test_wake_ends_a_parked_turns_wait_and_runs_it_on(tmp_path: Path) -> None:
    """``turnkit run`` parks a turn on a wait the model asked for (an hour); ``turnkit
    wake`` ends it now, as the local user, and the turn runs to its end."""
    timer_agent = FIXTURES / "timer_agent"
    parked = turnkit_with_input("run", str(timer_agent), "wait 60", cwd=tmp_path)
    assert parked.returncode == 3, parked.stderr  # parked: waiting
    assert "waiting on the clock until" in parked.stderr and "turnkit wake" in parked.stderr
    woken = turnkit("wake", str(timer_agent), cwd=tmp_path)
    assert woken.returncode == 0, woken.stderr
    assert "completed" in woken.stdout and "Woken early." in woken.stdout
    again = turnkit("wake", str(timer_agent), cwd=tmp_path)
    assert again.returncode != 0 and "not waiting on the clock" in again.stderr
    shown = turnkit("show", "cli:later", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Woken early." in shown.stdout
