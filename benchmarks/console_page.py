"""How fast the operator console's page loads with 100,000 sessions in a SQLite store.

Run from the repo root::

    .venv/bin/python benchmarks/console_page.py                      # 100,000 sessions
    .venv/bin/python benchmarks/console_page.py --sessions 20000 --db /tmp/c.db --runs 20
    .venv/bin/python benchmarks/console_page.py --postgres postgresql://127.0.0.1/test

With ``--postgres DSN`` the store is PostgreSQL, in the schema ``--schema``
(``turnkit_console_bench``; filled once, like ``--db``), and the live view also
reads the worker registry and each session's event writers.

The store is filled through the store seam (each session one commit: a turn opened,
its user message and answer, the turn completed; one session in a hundred parked on
a question instead), once: an existing ``--db`` is reused. Then the real ``turnkit
console`` serves it from a process of its own, and each request the page makes is
timed over HTTP from this process, ``--runs`` times: the page itself, the first page
of sessions (50, by key from ``Store.session_page``), one agent's, a page half way
down the list (an age filter), the parked sessions only (a status filter: a bounded
scan), one tenant's (1 session in 50: a page of sessions and one tenant read per
500), the live counts with the workers panel (none on SQLite), the step-latency
histogram, and one session's detail. Last, headless Chromium loads the
page ``--runs`` times, timed from navigation start until its first 50 rows are
shown (when playwright and /usr/bin/chromium are there). Medians and 95th
percentiles in milliseconds.

The bar (issue 38): the page loads in at most 300 ms with 100,000 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from turnkit import AssistantMessage, InputRequest, UserMessage
from turnkit.stores import AppendMessage, PostgresStore, SqliteStore, Store, TurnRecord, turn_rules


async def fill(store: Store, sessions: int) -> None:
    """``sessions`` sessions of agent ``ops`` (and every tenth of ``billing``), each
    turn of one of 50 tenants (``t0``…``t49``)."""
    started = time.perf_counter()
    for n in range(sessions):
        sid = f"s{n:06d}"
        tid = f"t{n:06d}"
        agent = "billing" if n % 10 == 0 else "ops"
        record = TurnRecord(
            session_id=sid,
            turn_id=tid,
            agent=agent,
            status="running",
            tenant=f"t{n % 50}",
            opening={"role": "user", "turn_id": tid, "text": f"deploy service {n}"},
        )
        writes: list[Any] = [
            turn_rules.new_turn(record),
            AppendMessage(0, UserMessage(text=f"deploy service {n}", turn_id=tid)),
        ]
        if n % 100 == 7:
            asked = InputRequest(
                id="approve",
                prompt="Deploy?",
                schema={"type": "boolean"},
                turn_id=tid,
                call_id="call_1",
                tool="deploy",
            ).to_dict()
            pending = {"request": asked, "requests": [asked]}
            writes.append(turn_rules.move(record, "suspended", pending=pending))
        else:
            writes.append(AppendMessage(1, AssistantMessage(text="deployed", turn_id=tid)))
            writes.append(turn_rules.move(record, "completed", text="deployed"))
        await store.session(sid).commit(writes)
        if n % 10_000 == 9_999:
            rate = (n + 1) / (time.perf_counter() - started)
            print(f"  filled {n + 1:,} sessions ({rate:,.0f}/s)", flush=True)


def http_get(conn: http.client.HTTPConnection, path: str) -> float:
    """One GET on a kept-alive connection, in milliseconds (``http.client`` sends a
    request in one write, so no delayed ACK inflates it)."""
    start = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status}")
    return (time.perf_counter() - start) * 1000


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"  {name:<36} median {statistics.median(samples):7.1f} ms   p95 {p95:7.1f} ms"


def browser_loads(url: str, runs: int, rows: int) -> list[float] | None:
    """Real Chromium: from navigation start to the first page of rows shown."""
    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not chromium.exists():
        return None
    loads = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(chromium), args=["--headless=new", "--no-sandbox"]
        )
        for n in range(runs + 2):
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function(
                f"document.querySelectorAll('[data-testid=session-row]').length >= {rows}"
            )
            shown = float(page.evaluate("performance.now()"))
            page.close()
            if n >= 2:  # the first two warm the browser up
                loads.append(shown)
        browser.close()
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/turnkit-console-bench-tenants.db"))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--postgres", metavar="DSN", help="use PostgreSQL at DSN")
    parser.add_argument("--schema", default="turnkit_console_bench")
    args = parser.parse_args()
    if args.postgres:
        store: Store = PostgresStore(args.postgres, schema=args.schema)
        where = f"{args.postgres}?options=-csearch_path%3D{args.schema}"
    else:
        store = SqliteStore(args.db)
        where = str(args.db)

    async def prepare() -> tuple[int, float]:
        await store.open()  # type: ignore[attr-defined]
        if not await store.session_page(limit=1):
            print(f"filling {where} with {args.sessions:,} sessions…", flush=True)
            await fill(store, args.sessions)
        stamps: list[float] = []  # newest first, as the list shows them
        after = None
        while page := await store.session_page(limit=5000, after=after):
            stamps += [info.updated_at for info in page]
            after = (page[-1].updated_at, page[-1].session_id)
        total, middle = len(stamps), stamps[len(stamps) // 2]
        await store.close()  # type: ignore[attr-defined]
        return total, middle

    total, middle = asyncio.run(prepare())
    # The real ``turnkit console``, in a process of its own, as an operator runs it.
    server = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "console", "--store", where, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", server.stdout.readline())
        if found is None:
            raise SystemExit("turnkit console printed no URL")
        port = int(found.group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        paths = {
            "GET / (the page)": "/",
            "sessions, first page (50)": "/api/sessions",
            "sessions of agent billing": "/api/sessions?agent=billing",
            "sessions, half way down (age)": f"/api/sessions?older_than={time.time() - middle:.3f}",
            "sessions, parked only": "/api/sessions?status=parked",
            "sessions of tenant t7 (1 in 50)": "/api/sessions?tenant=t7",
            "live counts and workers": "/api/live",
            "step latency (this process)": "/api/metrics",
            "one session's detail": "/api/sessions/s000007",
        }
        for path in paths.values():  # warm up
            http_get(conn, path)
        results: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.runs):
            for name, path in paths.items():
                results[name].append(http_get(conn, path))
        conn.request("GET", "/api/sessions?status=parked")
        parked = json.loads(conn.getresponse().read())
        print(f"store: {where}: {total:,} sessions")
        print(
            f"parked filter: {len(parked['sessions'])} rows after reading "
            f"{parked['scanned']:,} (more: {'yes' if parked['next'] else 'no'})"
        )
        print(f"{args.runs} runs each, over HTTP from another process:")
        for name, samples in results.items():
            print(summary(name, samples))
        loads = browser_loads(f"http://127.0.0.1:{port}/", args.runs, min(50, total))
        if loads is None:
            print("(no playwright or /usr/bin/chromium: no browser measurement)")
        else:
            print(summary("Chromium: navigation to 50 rows shown", loads))
    finally:
        server.terminate()
        server.wait(timeout=20)


if __name__ == "__main__":
    main()
