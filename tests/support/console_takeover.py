"""A takeover as it happens in a deployment, for the console's tests (issue 38):
two ``turnkit worker`` processes on one PostgreSQL schema; the first is SIGKILLed
in the middle of a tool call, and the second takes the turn over and finishes it.
Then a second turn is held by the surviving worker (its tool waits for a file), so
the console can show a worker holding a session. Every wait polls a condition
with a deadline."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cli_support import OFFLINE_ENV
from eventually import eventually_blocking

import turnkit
from turnkit.stores import PostgresStore

AGENT = {
    "agent.py": """
from turnkit import UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "ops"}


def _reply(messages):
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("step", {"task": last.text})])
    return f"finished: {last.result}"


def demo_model():
    return ScriptedModel(respond=_reply)
""",
    "tools/step.py": '''
import asyncio
import os
from pathlib import Path
from typing import Any, TypeVar

from turnkit import tool

HERE = Path(__file__).parent.parent


@tool
async def step(task: str) -> str:
    """Run a task: "crash" hangs the first time (the test kills that worker),
    "hold" runs until the file ``release`` appears."""
    if task == "crash" and not (HERE / "crashed").exists():
        (HERE / "crashed").write_text(str(os.getpid()))
        await asyncio.Event().wait()
    if task == "hold":
        (HERE / "holding").write_text(str(os.getpid()))
        while not (HERE / "release").exists():
            await asyncio.sleep(0.02)
    return f"{task} done"
''',
}
WORKER = [sys.executable, "-m", "turnkit.cli", "worker"]
HOLDER = re.compile(r" as (\S+)")
TIMEOUT = 60.0
T = TypeVar("T")


def agent_folder(root: Path) -> Path:
    folder = root / "ops"
    for name, text in AGENT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def wait_for(what: str, done: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    eventually_blocking(done, what=what, timeout=timeout)


@dataclass
class Deployment:
    """Workers on PostgreSQL ``dsn``'s ``schema`` running the agent in ``folder``."""

    folder: Path
    dsn: str
    schema: str
    workers: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def cli_dsn(self) -> str:
        """The DSN naming the schema, as the command line takes it."""
        return f"{self.dsn}?options=-csearch_path%3D{self.schema}"

    def start_worker(self, *extra: str) -> str:
        """Start a worker; its holder name once it runs."""
        proc = subprocess.Popen(
            [*WORKER, str(self.folder), "--store", self.cli_dsn, "--poll", "0.1", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"},
        )
        self.workers.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the worker prints it once running
        found = HOLDER.search(line)
        assert found is not None, f"the worker said {line!r}"
        return found.group(1)

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)

    def submit(self, session_id: str, text: str) -> str:
        return _run(lambda: self._submit(session_id, text))

    async def _submit(self, session_id: str, text: str) -> str:
        node = turnkit.RuntimeClient(
            turnkit.load_agent(self.folder), store=PostgresStore(self.dsn, schema=self.schema)
        )
        async with node:
            return await node.session("ops", session_id).submit(text)

    def status(self, session_id: str, turn_id: str) -> str | None:
        async def read() -> str | None:
            store = PostgresStore(self.dsn, schema=self.schema)
            async with turnkit.Runtime([], store=store):
                record = await store.session(session_id).turn(turn_id)
                return None if record is None else record.status

        return _run(read)


def _run(coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from sync code, even code inside an event loop
    (Playwright's sync API runs one): on a thread of its own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coroutine())).result(timeout=TIMEOUT)


@dataclass(frozen=True)
class TakenOver:
    first: str  # the holder of the worker killed mid-turn
    second: str  # the holder of the worker that took it over
    turn_id: str  # session "s-takeover"'s turn


def take_over(deployment: Deployment, *second_args: str) -> TakenOver:
    """Session ``s-takeover``: its tool call hangs in the first worker, which is
    SIGKILLed; a second worker (started with ``second_args``) takes the turn over."""
    first = deployment.start_worker()
    turn_id = deployment.submit("s-takeover", "crash")
    crashed = deployment.folder / "crashed"
    wait_for("the first worker runs the tool", crashed.exists)
    deployment.workers[0].kill()
    deployment.workers[0].wait(timeout=30)
    second = deployment.start_worker(*second_args)
    wait_for(
        "the second worker finishes the turn",
        lambda: deployment.status("s-takeover", turn_id) == "completed",
    )
    return TakenOver(first=first, second=second, turn_id=turn_id)


def hold(deployment: Deployment) -> str:
    """Session ``s-held``: a turn the running worker holds until ``release``."""
    turn_id = deployment.submit("s-held", "hold")
    wait_for("the worker holds s-held", (deployment.folder / "holding").exists)
    return turn_id


def release(deployment: Deployment, turn_id: str) -> None:
    (deployment.folder / "release").write_text("go")
    wait_for("the held turn finishes", lambda: deployment.status("s-held", turn_id) == "completed")
