"""Schedules across processes on PostgreSQL: any number of processes run the same
schedule, one elected process fires it, and another takes over when it dies."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

import pytest
from suite_paths import CHILDREN

from turnkit.stores import PostgresStore

CHILD = CHILDREN / "schedule_child.py"


class Child:
    """A scheduler process whose output lines are read on a thread of their own."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), dsn, schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.delivered: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        line = self.lines.get(timeout=timeout)
        assert line.startswith(prefix), line
        if line.startswith("delivered"):
            self.delivered.append(line.split()[1])
        return line

    def quiet(self) -> bool:
        return self.lines.empty()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        while not self.lines.empty():
            self.expect("delivered")  # anything it said before it died


@pytest.mark.slow
async def test_one_elected_process_fires_and_another_takes_over_when_it_dies(
    pg_dsn: str, pg_schema: str
) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.open()  # the schema exists before the children race to create it
    await store.close()
    first = Child(pg_dsn, pg_schema)
    second: Child | None = None
    try:
        first.expect("started")
        first.expect("delivered")
        second = Child(pg_dsn, pg_schema)
        second.expect("started")
        first.expect("delivered")
        assert second.quiet()  # it waits while the first leads
        first.kill()
        for _ in range(2):
            second.expect("delivered", timeout=60)
    finally:
        for child in (first, second):
            if child is not None and child.process.poll() is None:
                child.kill()
    assert len(first.delivered) >= 2 and len(second.delivered) >= 2
    every = first.delivered + second.delivered
    assert len(set(every)) == len(every)  # no slot fired (rendered) twice
