"""The local deployment example (examples/deploy) runs: an HTTP node and three
workers from its Procfile on the test PostgreSQL, turns posted over HTTP, a feed
on the HTTP node showing a worker's text as it grows, each lookup noted once."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "examples" / "deploy" / "run_local.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_the_local_deployment_runs_turns_on_its_workers(pg_dsn: str, pg_schema: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(RUNNER),
            "--dsn",
            pg_dsn,
            "--schema",
            pg_schema,
            "--port",
            str(free_port()),
            "--sessions",
            "2",
            "--turns",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "runner | the HTTP node is ready" in out
    assert len(re.findall(r"worker_\d \| turnkit worker: running orders", out)) == 3
    feed = [line.split("|", 1)[1].strip() for line in out.splitlines() if "s0 feed |" in line]
    # The last turn of s0 began after the feed was listening: its answer came word
    # by word, before its end.
    last_start = len(feed) - 1 - feed[::-1].index("[turn.started]")
    assert feed[-1] == "[turn.completed]"
    assert feed[last_start + 1 : last_start + 3] == ["Order", "A01"]
    lookups = [tuple(map(int, m)) for m in re.findall(r"(\d+) turns \((\d+) lookups\)", out)]
    assert sum(turns for turns, _ in lookups) == 4
    assert all(turns == noted for turns, noted in lookups)  # each lookup once
    assert "runner | stopped" in out
