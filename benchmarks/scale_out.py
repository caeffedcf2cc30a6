"""Scale-out on one PostgreSQL: ``turnkit worker`` processes running the turns a
submitting node stores, their throughput, latency and behaviour under chaos.

Run from the repo root::

    .venv/bin/python benchmarks/scale_out.py                    # everything, ~5 minutes
    .venv/bin/python benchmarks/scale_out.py --workers 1 2 --runs 1 --no-chaos
    .venv/bin/python benchmarks/scale_out.py --only chaos --chaos-seconds 60
    .venv/bin/python benchmarks/scale_out.py --json results.json

The agent (``benchmarks/scale_out_agent``) runs a zero-latency scripted model: each
turn is a model step calling ``record`` (a local tool writing one row through
``ctx.store``, in the tool step's transaction), the tool step, and a final model
step streaming three deltas. So a turn commits: its submission, its opening, and
three steps.

**Throughput and latency.** For 1, 2 and 4 workers (each ``turnkit worker`` with
``--concurrency 64 --pool-size 4``), this process submits turns the way an HTTP node does
(``RuntimeClient``, ``session.submit``) on ``--sessions`` sessions, one
turn at a time per session (the next as soon as the previous one completed: a
closed loop), for ``--seconds`` after a warm-up. Turns per second count completions;
latency is from the turn's stored ``created_at`` (its submission) to its
``finished_at`` (its completion), both stamped from this machine's clock. With 64
sessions in flight the workers are saturated and latency is mostly waiting in the
queue (Little's law: sessions / throughput), and a session's next turn is
submitted the moment its last one completes. The light-load figures
(``--light-sessions``, 2 turns in flight, each on a new session, for half as long)
show the latency of a turn that waits for nothing.
Figures are medians of ``--runs`` runs. This process learns which turns ended by
reading their rows every ``--check-every`` seconds (one statement for all turns in
flight; ~1 ms of CPU a read, half of it PostgreSQL's): a cost of the harness that the
floor does not pay, so kept low (at 5 ms, as before, it took 13% of the two cores).
Beside each figure: the CPU a turn took in the timed window, by process kind (the
workers, this process, PostgreSQL's processes; from ``/proc``, Linux only).

**Chaos.** ``--chaos-workers`` workers take the same closed loop for
``--chaos-seconds``; every 2 to ``--kill-every`` seconds (random) a random worker is
SIGKILLed and a new one started in its place. Then submission stops and every turn
is awaited (``--drain`` seconds at most). Reported: turns lost (submitted and not
completed), steps committed twice (a turn with more than its two
``message.completed`` or one ``action.completed`` events), local side effects twice
(a turn with more than one ``record`` row), turns taken over (a gap of more than a
second between two logged events of a turn) and the longest takeover (the longest
such gap: from the last commit before the kill to the first after it).

**Per turn** (``--only per-turn``). One worker connects through the tests' counting
proxy (``tests/support/round_trips.py``), which counts its round trips, the
transactions that end and the statements the server completes on its connections;
each is reported per completed turn,
with ``--light-sessions`` and then ``--sessions`` turns in flight (under load a group
commit and a claim carry several turns). The floor's turn is five of each.

**Floor.** psycopg alone commits the same five transactions per turn (submission,
opening, model step, tool step with its row, final step; the rows turnkit writes,
each transaction one pipelined round trip) from ``--floor-threads`` threads, one
turn at a time per thread, on a fresh schema: what this machine's PostgreSQL
charges for those commits, with no claiming, no locks and no turnkit. The machine
has two cores shared by PostgreSQL, the workers and this process, so more workers
cannot add CPU; read the 1, 2 and 4 worker figures against the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import _floor
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from round_trips import RoundTrips  # the tests' counting proxy

import turnkit
from turnkit.stores import PostgresStore

AGENT_DIR = Path(__file__).with_name("scale_out_agent")
AGENT = "bench"
#: Environment of the workers: no model key may turn the scripted agent into a real one.
_MODEL_VARIABLES = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "TURNKIT_MODEL", "OPENAI_BASE_URL")


# -- the cluster ------------------------------------------------------------------------


@dataclass
class Cluster:
    """Workers (subprocesses) on a fresh schema; this process submits."""

    dsn: str
    schema: str
    concurrency: int
    poll: float = 0.5
    pool_size: int = 4
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: int = 0
    #: The ``src`` directory whose turnkit the workers import (``None``: this one's).
    source: str | None = None
    #: More ``turnkit worker`` arguments.
    worker_args: list[str] = field(default_factory=list)
    #: Where the workers connect, if not to ``dsn`` (a counting proxy's DSN).
    worker_via: str | None = None
    #: Seconds between the closed loop's checks for ended turns.
    check_every: float = 0.02

    @property
    def worker_dsn(self) -> str:
        dsn = self.worker_via or self.dsn
        sep = "&" if "?" in dsn else "?"
        return f"{dsn}{sep}options=-csearch_path%3D{self.schema}"

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in _MODEL_VARIABLES}
        # The workers import the turnkit this process imported.
        source = self.source or str(Path(turnkit.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnkit.cli",
                "worker",
                str(AGENT_DIR),
                "--store",
                self.worker_dsn,
                "--concurrency",
                str(self.concurrency),
                "--poll",
                str(self.poll),
                "--pool-size",
                str(self.pool_size),
                *self.worker_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("turnkit worker: running"):
            proc.kill()
            raise SystemExit(f"a worker did not start: {line!r}")
        self.workers.append(proc)
        self.started += 1
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.workers.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.workers):
            proc.send_signal(signal.SIGTERM)
        for proc in list(self.workers):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"')
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []


@contextmanager
def cluster(
    dsn: str,
    concurrency: int,
    poll: float,
    pool_size: int,
    check_every: float = 0.02,
    source: str | None = None,
) -> Iterator[Cluster]:
    """A fresh schema and its ``Cluster`` (``source``: see ``Cluster.source``)."""
    schema = _floor.fresh_schema("scale")
    made = Cluster(
        dsn, schema, concurrency, poll, pool_size, source=source, check_every=check_every
    )
    try:
        asyncio.run(_migrate(dsn, schema))
        made.sql(
            "CREATE TABLE bench_effects (session_id text NOT NULL, turn_id text NOT NULL, "
            "pid integer NOT NULL)"
        )
        yield made
    finally:
        made.stop_all()
        _floor.drop_schema(dsn, schema)


def cluster_for(args: argparse.Namespace) -> AbstractContextManager[Cluster]:
    """``cluster`` as the command line sets it up."""
    return cluster(
        args.dsn,
        args.concurrency,
        args.poll,
        args.pool_size,
        args.check_every,
        args.worker_source,
    )


async def _migrate(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema)
    await store.open()
    await store.close()


# -- the closed loop ----------------------------------------------------------------------


def submitting_agent() -> turnkit.Agent:
    """The agent as the submitting node knows it (it never runs a model)."""
    from turnkit.testing import ScriptedModel

    return turnkit.Agent(name=AGENT, model=ScriptedModel([]))


@dataclass
class Loop:
    """Submitted turns and how they ended."""

    submitted: dict[str, str] = field(default_factory=dict)  # turn id -> session id
    completed: int = 0
    counted: int = 0  # completions inside the timed window
    #: CPU seconds by process kind (``cpu_seconds``) when the timed window opened and closed.
    cpu_from: dict[str, float] = field(default_factory=dict)
    cpu_to: dict[str, float] = field(default_factory=dict)


async def closed_loop(
    made: Cluster,
    sessions: int,
    seconds: float,
    warmup: float,
    on_tick: Any = None,
    prefix: str = "s",
    fresh: bool = False,
) -> tuple[Loop, float]:
    """Keep one turn in flight on each of ``sessions`` sessions for ``warmup +
    seconds`` (with ``fresh``, each next turn on a new session instead); returns the
    loop and the timed window's length."""
    store = PostgresStore(made.dsn, schema=made.schema, max_size=4)
    loop = Loop()
    runtime = turnkit.RuntimeClient(submitting_agent(), store=store)
    async with runtime:
        names = [f"{prefix}{i:04d}" for i in range(sessions)]
        in_flight: dict[str, str] = {}  # session -> turn id
        counter = 0

        async def submit(session_id: str) -> None:
            nonlocal counter
            counter += 1
            if fresh:
                session_id = f"{prefix}{counter:06d}"
            turn_id = await runtime.session(AGENT, session_id).submit(f"turn {counter}")
            in_flight[session_id] = turn_id
            loop.submitted[turn_id] = session_id

        await asyncio.gather(*(submit(s) for s in names))
        start = time.monotonic()
        timed_from = start + warmup
        end = timed_from + seconds
        workers = [p.pid for p in made.workers]
        with psycopg.connect(made.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{made.schema}"')
            if not warmup:
                loop.cpu_from = cpu_seconds(workers)
            while time.monotonic() < end:
                if on_tick is not None:
                    on_tick()
                done = _finished(conn, in_flight)
                now = time.monotonic()
                if now >= timed_from and not loop.cpu_from:
                    loop.cpu_from = cpu_seconds(workers)
                for session_id in done:
                    del in_flight[session_id]
                    loop.completed += 1
                    if now >= timed_from:
                        loop.counted += 1
                await asyncio.gather(*(submit(s) for s in done))
                await asyncio.sleep(made.check_every)
            loop.cpu_to = cpu_seconds(workers)
    return loop, seconds


def cpu_seconds(workers: Sequence[int]) -> dict[str, float]:
    """CPU seconds used so far by the workers, by this process (the submitting node,
    or the floor's threads) and by every PostgreSQL process on this machine (its
    backends and its WAL writer alike): read from Linux's ``/proc``, so empty
    elsewhere, and PostgreSQL's share only if the server runs here. Backends that
    exit between two readings take their share with them."""
    proc = Path("/proc")
    if not proc.is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")

    def used(pid: int | str) -> float:
        try:
            fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime + stime

    postgres = 0.0
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm == "postgres":
                postgres += used(entry.name)
    return {
        "workers": sum(used(pid) for pid in workers),
        "this process": used(os.getpid()),
        "postgres": postgres,
    }


def cpu_per_turn(
    cpu_from: dict[str, float], cpu_to: dict[str, float], turns: int
) -> dict[str, float]:
    """Milliseconds of CPU a turn by process kind, between two ``cpu_seconds``."""
    if not turns:
        return {}
    return {k: (cpu_to[k] - cpu_from[k]) * 1000 / turns for k in cpu_to if k in cpu_from}


def _finished(conn: psycopg.Connection[Any], in_flight: dict[str, str]) -> list[str]:
    """The sessions whose turn in flight has ended."""
    if not in_flight:
        return []
    sessions = list(in_flight)
    # Planned anew each time (never prepared: psycopg prepares a query it sees five
    # times, and the plan it keeps was made when the table was small) and each turn
    # looked up by key (LATERAL ... LIMIT, which the planner cannot turn into a
    # join): otherwise it read every turn on each poll (3 ms at 4,000 turns, 6 ms at
    # 128 sessions, 50 times a second, on the cores the measured worker needs).
    rows = conn.execute(
        "SELECT u.s FROM unnest(%s::text[], %s::text[]) AS u(s, t) "
        "CROSS JOIN LATERAL (SELECT x.status FROM turnkit_turns x "
        "WHERE x.session_id = u.s AND x.turn_id = u.t LIMIT 1) x "
        "WHERE x.status NOT IN ('queued', 'running')",
        (sessions, [in_flight[s] for s in sessions]),
        prepare=False,
    ).fetchall()
    return [str(r[0]) for r in rows]


def latencies(made: Cluster, turn_ids: Sequence[str]) -> list[float]:
    rows = made.sql(
        "SELECT finished_at - created_at FROM turnkit_turns "
        "WHERE turn_id = ANY(%s) AND status = 'completed'",
        list(turn_ids),
    )
    return sorted(float(r[0]) for r in rows)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


# -- throughput --------------------------------------------------------------------------


@dataclass
class ThroughputRun:
    workers: int
    turns_per_second: float
    p50_ms: float
    p99_ms: float
    completed: int
    light_p50_ms: float
    light_p99_ms: float
    #: Milliseconds of CPU a turn in the timed window, by process kind.
    cpu_ms: dict[str, float] = field(default_factory=dict)


def throughput_run(args: argparse.Namespace, workers: int) -> ThroughputRun:
    """Saturated (``--sessions`` in flight), then lightly loaded (``--light-sessions``)."""
    with cluster_for(args) as made:
        for _ in range(workers):
            made.start_worker()
        loop, seconds = asyncio.run(closed_loop(made, args.sessions, args.seconds, args.warmup))
        lat = latencies(made, list(loop.submitted))
        light, _ = asyncio.run(
            closed_loop(
                made, args.light_sessions, args.seconds / 2, 0.0, prefix="light", fresh=True
            )
        )
        light_lat = latencies(made, list(light.submitted))
        return ThroughputRun(
            workers=workers,
            turns_per_second=loop.counted / seconds,
            p50_ms=percentile(lat, 0.50) * 1000,
            p99_ms=percentile(lat, 0.99) * 1000,
            completed=loop.completed,
            light_p50_ms=percentile(light_lat, 0.50) * 1000,
            light_p99_ms=percentile(light_lat, 0.99) * 1000,
            cpu_ms=cpu_per_turn(loop.cpu_from, loop.cpu_to, loop.counted),
        )


# -- chaos ---------------------------------------------------------------------------------


@dataclass
class ChaosRun:
    kills: int
    submitted: int
    lost: int
    steps_twice: int
    effects_twice: int
    effects_missing: int
    taken_over: int
    longest_takeover_s: float
    turns_per_second: float


def chaos_run(args: argparse.Namespace) -> ChaosRun:
    rng = random.Random(args.seed)
    with cluster_for(args) as made:
        for _ in range(args.chaos_workers):
            made.start_worker()
        kills = 0
        kill_times: list[float] = []
        next_kill = time.monotonic() + rng.uniform(2, args.kill_every)

        def maybe_kill() -> None:
            nonlocal kills, next_kill
            if time.monotonic() < next_kill or not made.workers:
                return
            kill_times.append(time.time())
            made.kill(rng.choice(made.workers))
            kills += 1
            # Restarted on a thread: a new worker's start-up must not stall the loop.
            threading.Thread(target=made.start_worker, daemon=True).start()
            next_kill = time.monotonic() + rng.uniform(2, args.kill_every)

        loop, seconds = asyncio.run(
            closed_loop(made, args.chaos_sessions, args.chaos_seconds, 0.0, maybe_kill)
        )
        ids = list(loop.submitted)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            open_turns = made.sql(
                "SELECT count(*) FROM turnkit_turns WHERE turn_id = ANY(%s) "
                "AND status IN ('queued', 'running')",
                ids,
            )[0][0]
            if not open_turns:
                break
            time.sleep(0.2)
        return ChaosRun(
            kills=kills,
            submitted=len(ids),
            lost=len(ids)
            - _count(
                made,
                "SELECT count(*) FROM turnkit_turns WHERE turn_id = ANY(%s) "
                "AND status = 'completed'",
                ids,
            ),
            steps_twice=_count(made, _STEPS_TWICE, ids),
            effects_twice=_count(
                made,
                "SELECT count(*) FROM (SELECT turn_id FROM bench_effects WHERE turn_id = ANY(%s) "
                "GROUP BY turn_id HAVING count(*) > 1) t",
                ids,
            ),
            effects_missing=_count(
                made,
                "SELECT count(*) FROM turnkit_turns t WHERE t.turn_id = ANY(%s) "
                "AND t.status = 'completed' AND NOT EXISTS "
                "(SELECT 1 FROM bench_effects e WHERE e.turn_id = t.turn_id)",
                ids,
            ),
            **_takeovers(made, ids, kill_times),
            turns_per_second=loop.completed / seconds,
        )


#: Turns with a step committed more than once: more message.completed events than
#: the turn's two model steps, or more action.completed than its one tool step.
_STEPS_TWICE = """
SELECT count(*) FROM (
    SELECT turn_id FROM turnkit_events WHERE turn_id = ANY(%s)
    GROUP BY turn_id
    HAVING count(*) FILTER (WHERE body::json->>'type' = 'message.completed') > 2
        OR count(*) FILTER (WHERE body::json->>'type' = 'action.completed') > 1
) t
"""


def _count(made: Cluster, query: str, ids: list[str]) -> int:
    return int(made.sql(query, ids)[0][0])


def _takeovers(made: Cluster, ids: list[str], kills: Sequence[float]) -> dict[str, Any]:
    """Turns a kill interrupted, and the longest takeover.

    A turn was interrupted by a kill at ``k`` if two of its consecutive logged events
    straddle ``k`` and lie further apart than 99% of the gaps that straddle no kill
    (a turn on a worker that survived goes on as usual). Its takeover took from
    ``k`` to its first event after it.
    """
    rows = made.sql(
        "SELECT turn_id, (body::json->>'at')::float8 FROM turnkit_events "
        "WHERE turn_id = ANY(%s) ORDER BY session_id, turn_id, seq",
        ids,
    )
    straddling: list[tuple[float, float]] = []  # (gap, takeover)
    usual: list[float] = []
    for (turn, at), (next_turn, next_at) in itertools.pairwise(rows):
        if turn != next_turn:
            continue
        killed = [k for k in kills if at <= k < next_at]
        if killed:
            straddling.append((next_at - at, next_at - killed[-1]))
        else:
            usual.append(next_at - at)
    bar = percentile(sorted(usual), 0.99) if usual else 0.0
    over = [takeover for gap, takeover in straddling if gap > bar]
    return {"taken_over": len(over), "longest_takeover_s": max(over, default=0.0)}


# -- what a turn costs the database -----------------------------------------------------


@dataclass
class PerTurn:
    in_flight: int
    turns: int
    round_trips: float
    transactions: float
    statements: float


@contextmanager
def counting_proxy(dsn: str) -> Iterator[tuple[RoundTrips, str]]:
    """The tests' counting proxy in front of ``dsn``'s server, on a thread of its own
    (the workers are other processes), and the DSN that goes through it."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = RoundTrips(str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="counting-proxy", daemon=True)
    thread.start()
    try:
        port = asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(timeout=30)
        user = quote(str(info["user"])) + "@" if info.get("user") else ""
        database = quote(str(info.get("dbname", "")))
        yield proxy, f"postgresql://{user}127.0.0.1:{port}/{database}?sslmode=disable"
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def per_turn_run(args: argparse.Namespace) -> list[PerTurn]:
    """One worker connected through the counting proxy: its round trips and the
    transactions it ends, per turn completed (claims, locks, loads, commits,
    notifications: all of it), lightly loaded (``--light-sessions`` turns in flight)
    and then with ``--sessions`` in flight, where a claim takes several turns at once.
    (The proxy's own CPU is this process's: read the counts, not the speed.)"""
    out: list[PerTurn] = []
    with (
        counting_proxy(args.dsn) as (proxy, via),
        cluster_for(args) as made,
    ):
        made.worker_via = via
        made.start_worker()
        asyncio.run(closed_loop(made, args.light_sessions, 2.0, 0.0, prefix="warm", fresh=True))
        for n, prefix in ((args.light_sessions, "light"), (args.sessions, "busy")):
            trips, transactions, statements = proxy.count, proxy.transactions, proxy.statements
            loop, _ = asyncio.run(closed_loop(made, n, args.seconds / 2, 0.0, prefix=prefix))
            done = max(1, loop.completed)
            out.append(
                PerTurn(
                    in_flight=n,
                    turns=loop.completed,
                    round_trips=(proxy.count - trips) / done,
                    transactions=(proxy.transactions - transactions) / done,
                    statements=(proxy.statements - statements) / done,
                )
            )
    return out


# -- the floor -----------------------------------------------------------------------------


@dataclass
class FloorRun:
    turns_per_second: float
    #: Milliseconds of CPU a turn, by process kind (the floor's threads are this process).
    cpu_ms: dict[str, float]


def floor_run(args: argparse.Namespace) -> FloorRun:
    """Turns per second psycopg alone commits, five transactions per turn."""
    with _floor.floor_pool(args.dsn, size=args.floor_threads) as pool:
        with pool.connection() as conn:
            conn.execute(
                "CREATE TABLE bench_effects (session_id text NOT NULL, turn_id text NOT NULL, "
                "pid integer NOT NULL)"
            )
        stop = time.monotonic() + args.seconds
        counts = [0] * args.floor_threads

        def worker(n: int) -> None:
            with pool.connection() as conn:
                while time.monotonic() < stop:
                    session = f"f{n}-{uuid.uuid4().hex[:8]}"
                    for rows in turn_commits(session, uuid.uuid4().hex):
                        _floor.commit_pipelined(conn, rows)
                    counts[n] += 1

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.floor_threads)]
        began = time.monotonic()
        cpu_from = cpu_seconds([])
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu_to = cpu_seconds([])
        turns = sum(counts)
        return FloorRun(turns / (time.monotonic() - began), cpu_per_turn(cpu_from, cpu_to, turns))


def turn_commits(session: str, turn_id: str) -> list[list[_floor.Row]]:
    """A turn's five transactions, in the shape and sizes turnkit writes them."""
    now = time.time()
    opening = json.dumps({"type": "user", "text": "turn 1", "turn_id": turn_id})
    started = json.dumps(
        {
            "type": "turn.started",
            "turn_id": turn_id,
            "session_id": session,
            "seq": 1,
            "at": now,
            "text": "turn 1",
        }
    )
    model, tool = _floor.pair_rows(1, turn_id, session)
    final_model, _ = _floor.pair_rows(2, turn_id, session)
    upsert_session = (
        "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
        "VALUES (%s, 'bench', 'new', %s, %s) "
        "ON CONFLICT (session_id) DO UPDATE SET updated_at = %s",
        (session, now, now, now),
    )
    set_turn = (
        "UPDATE turnkit_turns SET status = %s, finished_at = %s "
        "WHERE session_id = %s AND turn_id = %s"
    )
    set_session = "UPDATE turnkit_sessions SET status = %s, updated_at = %s WHERE session_id = %s"
    return [
        [
            upsert_session,
            (
                "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, "
                "created_at) VALUES (%s, %s, 'bench', 'queued', %s, %s)",
                (session, turn_id, opening, now),
            ),
        ],
        [
            (set_turn, ("running", None, session, turn_id)),
            (set_session, ("running", now, session)),
            *_floor.pyformat(
                [
                    (_floor.SQL_MSG, (session, 0, turn_id, opening)),
                    (_floor.SQL_EVENT, (session, 1, turn_id, started)),
                ]
            ),
        ],
        _floor.pyformat(model),
        [
            *_floor.pyformat(tool),
            (
                "INSERT INTO bench_effects (session_id, turn_id, pid) VALUES (%s, %s, 0)",
                (session, turn_id),
            ),
        ],
        [
            *_floor.pyformat(final_model[:3]),
            (set_turn, ("completed", now, session, turn_id)),
            (set_session, ("idle", now, session)),
        ],
    ]


# -- reporting ----------------------------------------------------------------------------


def median_of(runs: Sequence[Any], name: str) -> float:
    return statistics.median(getattr(r, name) for r in runs)


def describe_cpu(runs: Sequence[ThroughputRun | FloorRun]) -> str:
    """Each process kind's median CPU a turn over ``runs``, and their sum's."""
    kinds = [k for k in runs[0].cpu_ms if all(k in r.cpu_ms for r in runs)]
    if not kinds:
        return "not measured here (no /proc)"
    parts = [f"{k} {statistics.median(r.cpu_ms[k] for r in runs):.2f}" for k in kinds]
    total = statistics.median(sum(r.cpu_ms[k] for k in kinds) for r in runs)
    return ", ".join(parts) + f"; all {total:.2f}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--dsn", default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", _floor.DEFAULT_DSN)
    )
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--runs", type=int, default=3, help="runs per case; figures are medians")
    p.add_argument("--sessions", type=int, default=64, help="sessions in the closed loop")
    p.add_argument(
        "--light-sessions", type=int, default=2, help="sessions of the light-load latency run"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="timed window of a run")
    p.add_argument("--warmup", type=float, default=3.0, help="untimed seconds before it")
    p.add_argument("--concurrency", type=int, default=64, help="each worker's --concurrency")
    p.add_argument("--poll", type=float, default=0.5, help="each worker's --poll")
    p.add_argument(
        "--check-every",
        type=float,
        default=0.02,
        help="seconds between the closed loop's reads of which turns ended (each read "
        "costs this process and PostgreSQL ~1 ms of CPU, which the floor does not pay)",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        default=4,
        help="each worker's --pool-size (4 workers at 10 can exhaust 100 connections)",
    )
    p.add_argument("--chaos-workers", type=int, default=3)
    p.add_argument("--chaos-sessions", type=int, default=48)
    p.add_argument("--chaos-seconds", type=float, default=60.0)
    p.add_argument("--kill-every", type=float, default=4.0, help="most seconds between kills")
    p.add_argument("--drain", type=float, default=120.0, help="most seconds to await the rest")
    p.add_argument("--floor-threads", type=int, default=8)
    p.add_argument(
        "--worker-source",
        metavar="DIR",
        help="the src directory whose turnkit the workers run (default: this one's): "
        "a checkout of another commit, to compare two versions in one window",
    )
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--only", choices=["throughput", "per-turn", "chaos", "floor"])
    p.add_argument("--no-chaos", action="store_true")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(_floor.describe(_floor.server_info(args.dsn)))
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    results: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items() if k != "dsn"}}
    if args.only in (None, "floor"):
        floors = [floor_run(args) for _ in range(args.runs)]
        results["floor_turns_per_second"] = median_of(floors, "turns_per_second")
        results["floor_runs"] = [asdict(f) for f in floors]
        print(
            f"\nfloor (psycopg alone, {args.floor_threads} threads): "
            f"{results['floor_turns_per_second']:.1f} turns/s (runs: "
            f"{', '.join(f'{f.turns_per_second:.1f}' for f in floors)})"
        )
        print(f"  CPU ms a turn: {describe_cpu(floors)}")
    if args.only in (None, "throughput"):
        print(
            f"\n{'workers':>7} {'turns/s':>9} {'p50 ms':>9} {'p99 ms':>9} "
            f"{'light p50':>10} {'light p99':>10}   runs (turns/s)"
        )
        table = []
        for workers in args.workers:
            runs = [throughput_run(args, workers) for _ in range(args.runs)]
            row = {
                "workers": workers,
                "turns_per_second": median_of(runs, "turns_per_second"),
                "p50_ms": median_of(runs, "p50_ms"),
                "p99_ms": median_of(runs, "p99_ms"),
                "light_p50_ms": median_of(runs, "light_p50_ms"),
                "light_p99_ms": median_of(runs, "light_p99_ms"),
                "runs": [asdict(r) for r in runs],
            }
            table.append(row)
            each = ", ".join(f"{r.turns_per_second:.1f}" for r in runs)
            print(
                f"{workers:>7} {row['turns_per_second']:>9.1f} {row['p50_ms']:>9.1f} "
                f"{row['p99_ms']:>9.1f} {row['light_p50_ms']:>10.1f} "
                f"{row['light_p99_ms']:>10.1f}   {each}"
            )
            print(f"{'':>7} CPU ms a turn: {describe_cpu(runs)}")
        results["throughput"] = table
        floor = results.get("floor_turns_per_second")
        if floor:
            best = max(r["turns_per_second"] for r in table)
            print(f"best: {best:.1f} turns/s = {best / floor:.0%} of the psycopg floor")
    if args.only in (None, "per-turn"):
        per_turn = per_turn_run(args)
        results["per_turn"] = [asdict(p) for p in per_turn]
        floor = turn_commits("s", "t")
        worker_part = sum(len(rows) + 2 for rows in floor[1:])  # BEGIN and COMMIT count
        print("\none worker through a counting proxy (the floor's turn: 5 round trips and")
        print("5 transactions, 4 of each the worker's part of it; its statements, BEGIN and")
        whole = sum(len(rows) + 2 for rows in floor)
        print(f"COMMIT included: {whole}, {worker_part} the worker's):")
        for p in per_turn:
            print(
                f"  {p.in_flight:>3} turns in flight: {p.round_trips:.1f} round trips, "
                f"{p.transactions:.1f} transactions and {p.statements:.1f} statements a turn "
                f"({p.turns} turns)"
            )
    if args.only in (None, "chaos") and not args.no_chaos:
        chaos = chaos_run(args)
        results["chaos"] = asdict(chaos)
        print(
            f"\nchaos ({args.chaos_workers} workers, {args.chaos_seconds:g}s, {chaos.kills} kills):"
            f" {chaos.submitted} turns, lost {chaos.lost}, steps committed twice "
            f"{chaos.steps_twice}, side effects twice {chaos.effects_twice} (missing "
            f"{chaos.effects_missing}), taken over {chaos.taken_over}, longest takeover "
            f"{chaos.longest_takeover_s:.2f}s, {chaos.turns_per_second:.1f} turns/s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
