"""Running the ``turnkit`` command as a user does, offline: what the CLI tests and
the tests of other layers that drive the command share."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from suite_paths import ROOT

EXAMPLE = ROOT / "examples" / "ops"
#: Without the model settings, so a developer's API key never sends these tests online,
#: nor a TURNKIT_USER of theirs (the tests expect the default local user).
LEFT_OUT = {
    "TURNKIT_MODEL",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "TURNKIT_USER",
}
OFFLINE_ENV = {k: v for k, v in os.environ.items() if k not in LEFT_OUT}


def turnkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )


PARKING_AGENT = {
    "agent.py": """
from turnkit import ToolMessage, UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "deployer"}


def _reply(messages):
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("deploy", {"service": last.text})])
    if isinstance(last, ToolMessage):
        return f"finished: {last.result}"
    return "?"


def demo_model():
    return ScriptedModel(respond=_reply)
""",
    "tools/deploy.py": '''
from turnkit import ToolContext, tool


@tool
async def deploy(service: str, ctx: ToolContext) -> dict:
    """Deploy a service after approval."""
    ok = await ctx.request_input("approve", f"Deploy {service}?", schema={"type": "boolean"})
    return {"deployed": ok}
''',
}


def write_agent(folder: Path) -> Path:
    for name, text in PARKING_AGENT.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def turnkit_with_input(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``turnkit`` offline (no model settings), reading ``stdin`` (at its end at once by
    default, so a question it asks is never waited on)."""
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
    )


def console_spans(stderr: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter printed: one JSON object each."""
    decoder = json.JSONDecoder()
    spans, at = [], stderr.find('{\n    "name"')
    while at != -1:
        span, end = decoder.raw_decode(stderr, at)
        spans.append(span)
        at = stderr.find('{\n    "name"', end)
    return spans


def start_dev(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``turnkit dev`` on a free port, from ``cwd``: the process and the URL it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "dev", "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"no URL in {line!r}; stderr: {proc.communicate()[1]}")
    return proc, found.group(0)


def stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C the server; its stderr."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 130
    return proc.communicate()[1]
