"""``turnkit worker --ops-port``: health, readiness and metrics beside a worker.

A worker serves no HTTP of its own; this hook serves ``turnkit.server.ops_app``
(``/healthz``, ``/readyz``, ``/metrics``) on a port for the orchestrator's probes
and Prometheus, on the worker's event loop, for as long as the worker runs. Needs
``turnkit[metrics]``.

The worker owns SIGTERM and SIGINT (it drains on them), so the port is served with
hypercorn's ``serve(..., shutdown_trigger=...)``, which installs no signal handler
of its own and stops when the worker's hook says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from .._runtime.worker import Worker
from ._worker import WorkerHook

log = logging.getLogger("turnkit.worker")

#: How long a probe or scrape under way may take to finish once the worker stops.
GRACE = 2.0


def ops_port(host: str, port: int, allowed_hosts: Sequence[str] = ()) -> WorkerHook:
    """The hook serving the worker's ops app on ``host:port``, answering addresses,
    loopback names and ``allowed_hosts`` as its ``Host``."""
    try:
        import prometheus_client  # noqa: F401 - what the metrics need
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        from ..server import ops_app
    except ImportError as exc:
        raise ImportError(
            f"--ops-port needs prometheus_client, Starlette and hypercorn: "
            f"pip install 'turnkit[metrics]' ({exc})"
        ) from exc

    def start(worker: Worker) -> Callable[[], Awaitable[None]]:
        app = ops_app(worker.runtime, worker=worker, allowed_hosts=[host, *allowed_hosts])
        config = Config()
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.loglevel = "WARNING"
        config.accesslog = None
        config.graceful_timeout = GRACE
        stopping = asyncio.Event()
        serving = asyncio.get_running_loop().create_task(
            serve(cast(Any, app), config, shutdown_trigger=stopping.wait, mode="asgi"),
            name="turnkit-ops-port",
        )
        serving.add_done_callback(_log_failure)

        async def stop() -> None:
            stopping.set()
            try:
                await asyncio.wait_for(serving, GRACE + 1.0)
            except TimeoutError:
                pass  # wait_for cancelled it: a connection held past the grace
            except Exception:
                pass  # logged when it happened

        return stop

    return start


def _log_failure(serving: asyncio.Task[None]) -> None:
    """Say at once that the port stopped serving (it could not bind, say): the
    worker runs on without its probes, which the orchestrator will notice."""
    if not serving.cancelled() and (exc := serving.exception()) is not None:
        log.error("the ops port stopped serving: %s", exc)
