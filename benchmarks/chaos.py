"""Chaos: workers killed and paused at random while clients retry every request.

Run from the repo root (PostgreSQL at ``$TURNKIT_BENCH_POSTGRES_DSN`` or the local
server)::

    .venv/bin/python benchmarks/chaos.py                   # 3 workers, 60 s
    .venv/bin/python benchmarks/chaos.py --seconds 20 --sessions 16

Three workers (``scale_out.py``'s agent: a model step, a local tool writing one
row in the step's transaction, a model step) run turns for ``--seconds``; every 1
to ``--every`` seconds a random worker is sent ``SIGKILL`` (and restarted) or
``SIGSTOP`` (and ``SIGCONT`` 1 to ``--pause`` seconds later). Two HTTP nodes
(``create_app`` over a ``RuntimeClient``, each in a process of its own,
the second with its clock ``--skew`` seconds behind) take ``POST …/turns`` in
``--burst``-turn bursts per session, alternating node by node, and every request
is sent again, with the same turn id, to the other node, as a client that timed
out would retry. Then it waits for every turn and counts:

- ``lost``: acknowledged turns that did not complete;
- ``duplicated``: turns with a step committed twice, or a local tool's row twice;
- ``requests refused``: a first request or a retry not answered 200;
- ``out of order``: sessions whose turns ran in another order than acknowledged;
- the worst takeover, from a kill to the interrupted turn's next commit.

Words shown twice are checked by ``tests/channels/test_takeover_text.py`` (each delta names
its delivery attempt), not here: these turns stream no text.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import httpx
from scale_out import (
    _STEPS_TWICE,
    AGENT,
    Cluster,
    _count,
    _takeovers,
    cluster,
)


class Chaos:
    """Kills and pauses workers of ``made`` at random, restarting the killed."""

    def __init__(self, made: Cluster, rng: random.Random, every: float, pause: float) -> None:
        self.made, self.rng, self.every, self.pause = made, rng, every, pause
        self.kills: list[float] = []
        self.pauses = 0
        self.next = time.monotonic() + rng.uniform(1, every)

    def tick(self) -> None:
        if time.monotonic() < self.next or not self.made.workers:
            return
        self.next = time.monotonic() + self.rng.uniform(1, self.every)
        victim = self.rng.choice(self.made.workers)
        if self.rng.random() < 0.5:
            self.kills.append(time.time())
            self.made.kill(victim)
            threading.Thread(target=self.made.start_worker, daemon=True).start()
            return
        self.pauses += 1
        victim.send_signal(signal.SIGSTOP)
        threading.Timer(self.rng.uniform(1, self.pause), _resume, args=(victim,)).start()


def _resume(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)


async def submit_bursts(
    made: Cluster, urls: list[str], sessions: int, burst: int, seconds: float, chaos: Chaos
) -> tuple[dict[str, list[str]], int]:
    """Bursts of turns per session over HTTP, alternating nodes, each request sent
    again to the other node; the turn ids per session in acknowledgement order, and
    how many requests were not answered 200."""
    acked: dict[str, list[str]] = {f"c{i:03d}": [] for i in range(sessions)}
    refused = 0
    async with httpx.AsyncClient(timeout=60, headers={"X-User": "bench"}) as client:
        end = time.monotonic() + seconds

        async def post(url: str, session_id: str, turn_id: str) -> bool:
            path = f"{url}/agents/{AGENT}/sessions/{session_id}/turns"
            body = {"text": "go", "turn_id": turn_id}
            # Answered once the store holds the turn; the stream is not read.
            async with client.stream("POST", path, json=body) as reply:
                return reply.status_code == 200

        async def session_loop(session_id: str) -> None:
            nonlocal refused
            n = 0
            while time.monotonic() < end:
                burst_ids = []
                for k in range(burst):
                    turn_id = f"{session_id}-{n}"
                    n += 1
                    first = await post(urls[k % 2], session_id, turn_id)
                    again = await post(urls[(k + 1) % 2], session_id, turn_id)
                    refused += (not first) + (not again)
                    acked[session_id].append(turn_id)
                    burst_ids.append(turn_id)
                while not await _ended(made, burst_ids) and time.monotonic() < end + 120:
                    await asyncio.sleep(0.05)

        async def ticking() -> None:
            while time.monotonic() < end:
                chaos.tick()
                await asyncio.sleep(0.05)

        await asyncio.gather(ticking(), *(session_loop(s) for s in acked))
    return acked, refused


def start_node(made: Cluster, skew: float) -> tuple[subprocess.Popen[str], str]:
    """An HTTP node in a process of its own, its clock ``skew`` seconds behind."""
    node = Path(__file__).with_name("_chaos_node.py")
    proc = subprocess.Popen(
        [sys.executable, str(node), made.dsn, made.schema, str(skew)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


async def _ended(made: Cluster, ids: list[str]) -> bool:
    rows = await asyncio.to_thread(
        made.sql,
        "SELECT count(*) FROM turnkit_turns WHERE turn_id = ANY(%s) "
        "AND status NOT IN ('queued', 'running')",
        ids,
    )
    return int(rows[0][0]) == len(ids)


def out_of_order(made: Cluster, acked: dict[str, list[str]]) -> int:
    """Sessions whose transcript opened their turns in another order than acked."""
    bad = 0
    for session_id, ids in acked.items():
        rows = made.sql(
            "SELECT turn_id FROM turnkit_messages WHERE session_id = %s "
            "AND body::json->>'role' = 'user' ORDER BY idx",
            session_id,
        )
        ran = [r[0] for r in rows]
        bad += ran != [t for t in ids if t in set(ran)]
    return bad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", "postgresql://127.0.0.1:5432/test"),
    )
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--burst", type=int, default=3, help="turns submitted at once per session")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--every", type=float, default=4.0, help="most seconds between two faults")
    p.add_argument("--pause", type=float, default=8.0, help="most seconds a SIGSTOP lasts")
    p.add_argument("--skew", type=float, default=2.0, help="seconds the second node is behind")
    p.add_argument("--seed", type=int, default=28)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with cluster(args.dsn, concurrency=32, poll=0.5, pool_size=4) as made:
        for _ in range(args.workers):
            made.start_worker()
        chaos = Chaos(made, rng, args.every, args.pause)
        started = time.monotonic()
        nodes = [start_node(made, 0.0), start_node(made, args.skew)]
        try:
            urls = [url for _, url in nodes]
            acked, refused = asyncio.run(
                submit_bursts(made, urls, args.sessions, args.burst, args.seconds, chaos)
            )
        finally:
            for proc, _ in nodes:
                proc.terminate()
                proc.wait(30)
        took = time.monotonic() - started
        for proc in list(made.workers):
            _resume(proc)
        ids = [t for turns in acked.values() for t in turns]
        done = _count(
            made,
            "SELECT count(*) FROM turnkit_turns WHERE turn_id = ANY(%s) AND status = 'completed'",
            ids,
        )
        effects_twice = _count(
            made,
            "SELECT count(*) FROM (SELECT turn_id FROM bench_effects WHERE turn_id = ANY(%s) "
            "GROUP BY turn_id HAVING count(*) > 1) t",
            ids,
        )
        takeovers = _takeovers(made, ids, chaos.kills)
        print(
            f"chaos: {args.workers} workers, {took:.0f} s, {len(chaos.kills)} SIGKILL, "
            f"{chaos.pauses} SIGSTOP; {len(ids)} turns acknowledged (each sent twice)\n"
            f"  lost {len(ids) - done}\n"
            f"  duplicated {_count(made, _STEPS_TWICE, ids) + effects_twice}\n"
            f"  requests refused {refused} (each sent twice; one node {args.skew:g} s behind)\n"
            f"  out of order {out_of_order(made, acked)} of {len(acked)} sessions\n"
            f"  taken over after a kill {takeovers['taken_over']}, worst takeover "
            f"{takeovers['longest_takeover_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
