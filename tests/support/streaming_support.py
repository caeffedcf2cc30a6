"""The streaming test agent (``fixtures/streaming_agent``) run by ``turnkit worker``
processes on the test PostgreSQL server: what the tests of the event relay, takeovers
shown to a channel and the AI SDK front end share."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from cli_support import OFFLINE_ENV
from suite_paths import FIXTURES

STREAMING_AGENT = FIXTURES / "streaming_agent"


def slow_pieces() -> list[str]:
    """The answer pieces of the streaming test agent (its module's ``PIECES``)."""
    spec = importlib.util.spec_from_file_location("streaming_agent", STREAMING_AGENT / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.PIECES)


def start_streaming_worker(
    dsn: str, schema: str, hold: Path, *options: str
) -> subprocess.Popen[str]:
    """``turnkit worker`` for the streaming agent on ``schema``, with ``options``; the
    agent holds each piece until the test touches a file in ``hold``. Returns once the
    worker says it runs (blocking: call it in a thread from a loop)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnkit.cli",
            "worker",
            str(STREAMING_AGENT),
            "--store",
            f"{dsn}?options=-csearch_path%3D{schema}",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1", "TURNKIT_TEST_HOLD_DIR": str(hold)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("turnkit worker: running streaming"), line
    return proc
