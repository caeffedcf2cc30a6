"""``turnkit worker``: one process of a deployment's workers, on a shared PostgreSQL.

It serves no HTTP: HTTP nodes (``create_app`` over a ``RuntimeClient``) store the turns
and workers run them. ``SIGTERM`` (or ``SIGINT``) stops it gracefully: it claims
nothing more, lets the turns under way finish for ``grace`` seconds, hands back what
is left (another worker replays it from its checkpoints) and exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from .._engine.agent import Agent
from .._runtime.retention import Retention
from .._runtime.runtime import Runtime
from .._runtime.worker import Worker
from .._seams.store import Store
from .._values.tenancy import UNCAPPED, Concurrency


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How ``turnkit worker`` runs: sessions at once, the poll, the shutdown grace."""

    concurrency: int = 32
    poll: float = 1.0
    grace: float = 30.0
    store_label: str = ""
    #: What the worker prunes while it leads the store's retention election (``None``:
    #: nothing).
    retention: Retention | None = None
    #: The agent versions whose turns it takes (``None``: every version).
    serve_versions: frozenset[str] | None = None
    #: The per-tenant caps its claims enforce (docs/tenants.md).
    tenants: Concurrency = UNCAPPED


#: The first threshold of Python's cyclic garbage collector in a worker (Python's own
#: is 700 allocations; see ``tune_collector``).
WORKER_GC_THRESHOLD = 10_000
_PYTHON_GC_THRESHOLD = 700


def tune_collector() -> None:
    """Set Python's cyclic garbage collector for a process that runs turns and
    nothing else: what start-up left alive (modules, agents, clients) is frozen out of
    every later collection, and the young generation is collected every 10,000 net
    allocations instead of 700, unless the agents' code set a threshold of its own.

    A turn allocates many short-lived objects and frees them by reference counting;
    at Python's threshold the collector ran ~50 times a second in a loaded worker,
    examining objects that were about to go anyway, and each full collection walked
    every object start-up made: ~9% of the worker's CPU (``benchmarks/scale_out.py``,
    one worker, 64 turns in flight), ~2% with this. A young collection then takes a
    few milliseconds instead of a fraction of one."""
    gc.collect()  # start-up's own garbage first: once frozen, it would stay
    gc.freeze()
    first, *rest = gc.get_threshold()
    if first == _PYTHON_GC_THRESHOLD:
        gc.set_threshold(WORKER_GC_THRESHOLD, *rest)


#: Called with the running worker once it claims turns, returning what to undo when
#: it stops: where a process adds what it serves beside the worker (a health port).
WorkerHook = Callable[[Worker], Callable[[], Awaitable[None]]]


async def serve_worker(
    agents: Sequence[Agent], store: Store, options: WorkerOptions, hooks: Sequence[WorkerHook] = ()
) -> int:
    """Run a worker until ``SIGTERM`` or ``SIGINT``; the exit status."""
    async with Runtime(
        list(agents), store=store, retention=options.retention, concurrency=options.tenants
    ) as runtime:
        worker = Worker(
            runtime,
            concurrency=options.concurrency,
            poll=options.poll,
            grace=options.grace,
            serve_versions=options.serve_versions,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _stopping, worker, signum)
        undo = [hook(worker) for hook in hooks]
        tune_collector()
        names = ", ".join(f"{a.name} (version {a.turn_version})" for a in agents)
        holder = getattr(store, "holder", None)
        who = f" as {holder}" if holder else ""
        served = options.serve_versions
        serving = f", serving versions {','.join(sorted(served))}" if served else ""
        print(f"turnkit worker: running {names} on {options.store_label}{who}{serving}", flush=True)
        try:
            await worker.run()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            for step in reversed(undo):
                await step()
        if worker.handed_back:
            _exit_leaving_threads(worker.handed_back)
    print("turnkit worker: stopped", file=sys.stderr, flush=True)
    return 0


def _stopping(worker: Worker, signum: int) -> None:
    """Stop claiming on a signal, and say so at once: the drain that follows may take
    up to the grace, and whoever sent the signal (an operator, a test) can tell a
    worker that is finishing its turns from one that did not hear."""
    name = signal.Signals(signum).name
    print(
        f"turnkit worker: {name}: claiming no more turns, finishing those under way",
        file=sys.stderr,
        flush=True,
    )
    worker.stop()


def _exit_leaving_threads(handed_back: int) -> None:
    """Exit 0 now, without waiting for the threads of turns handed back.

    A local (``def``) tool cannot be interrupted: its thread runs until the call
    returns, perhaps never, and Python waits for such threads before a process
    ends. Its turn is handed back already (another worker takes it over, and the
    fence refuses this process's late commit), and ending the process closes its
    connections, which frees its sessions at once; so the worker ends here, within
    its grace, as its docs promise.
    """
    print(
        f"turnkit worker: stopped; {handed_back} turn(s) handed back, "
        "not waiting for their local tool calls",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    logging.shutdown()
    os._exit(0)
