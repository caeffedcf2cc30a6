"""``turnkit worker --ops-port``: health, readiness and metrics beside a worker.

A worker serves no HTTP of its own; this hook serves ``turnkit.server.ops_app``
(``/healthz``, ``/readyz``, ``/metrics``) on a port for the orchestrator's probes
and Prometheus, on the worker's event loop, for as long as the worker runs. Needs
``turnkit[metrics]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence

from .._runtime.worker import Worker
from ._worker import WorkerHook


def ops_port(host: str, port: int, allowed_hosts: Sequence[str] = ()) -> WorkerHook:
    """The hook serving the worker's ops app on ``host:port``, answering addresses,
    loopback names and ``allowed_hosts`` as its ``Host``."""
    try:
        import prometheus_client  # noqa: F401 - what the metrics need
        import uvicorn

        from ..server import ops_app
    except ImportError as exc:
        raise ImportError(
            f"--ops-port needs prometheus_client, Starlette and uvicorn: "
            f"pip install 'turnkit[metrics]' ({exc})"
        ) from exc

    class _BesideWorker(uvicorn.Server):
        """uvicorn leaving SIGTERM and SIGINT to the worker, which drains on them."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def start(worker: Worker) -> Callable[[], None]:
        app = ops_app(worker.runtime, worker=worker, allowed_hosts=[host, *allowed_hosts])
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        server = _BesideWorker(config)
        task = asyncio.get_running_loop().create_task(server.serve(), name="turnkit-ops-port")

        def stop() -> None:
            server.should_exit = True
            task.cancel()

        return stop

    return start
