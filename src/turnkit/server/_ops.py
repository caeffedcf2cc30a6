"""Operations endpoints: liveness, readiness and metrics, for HTTP nodes and workers.

``/healthz`` answers while the process serves requests at all; ``/readyz`` only
while the runtime is open and its store answers, so a load balancer or an
orchestrator stops sending work to a node that cannot reach the database.
``ops_app`` serves both plus ``/metrics`` (Prometheus text) on a port of their own,
which a worker runs beside its loop and an HTTP node may mount.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._errors import ConfigurationError
from .._runtime.client import RuntimeClient
from ._body_limit import BodyLimit
from ._hosts import LOOPBACK_NAMES, HostGuard, checked_names

#: The ops routes take no body; anything larger than this is refused unread.
OPS_MAX_BODY_BYTES = 1024
#: Seconds ``/readyz`` waits for the store before it answers not ready.
READY_TIMEOUT = 5.0


async def healthz(request: Request) -> Response:
    """Liveness: the process answers."""
    return JSONResponse({"status": "ok"})


def readiness(runtime: RuntimeClient) -> Any:
    """The ``/readyz`` handler of ``runtime``: 200 once it is open and its store
    answers a read, else 503 saying why."""

    async def readyz(request: Request) -> Response:
        if not runtime.is_open:
            return _not_ready("the runtime is not open")
        try:
            await asyncio.wait_for(runtime.store.session_page(limit=1), READY_TIMEOUT)
        except TimeoutError:
            return _not_ready(f"the store did not answer within {READY_TIMEOUT:g}s")
        except Exception as exc:
            return _not_ready(f"the store failed: {type(exc).__name__}")
        return JSONResponse({"status": "ready"})

    return readyz


def _not_ready(reason: str) -> Response:
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


def ops_app(
    runtime: RuntimeClient, *, worker: Any = None, allowed_hosts: Sequence[str] | None = ()
) -> Starlette:
    """``/healthz``, ``/readyz`` and ``/metrics`` of ``runtime`` as a Starlette app.

    ``worker`` (a ``turnkit`` worker, or anything with ``claimed`` and ``running``)
    adds its claims (and ``takeovers``, if it counts them) to the metrics. The app
    has no authentication: serve it on a port only the monitoring network reaches.
    It answers a ``Host`` that is an address (probes and Prometheus scrape by pod or
    host address), a loopback name, or one of ``allowed_hosts``; any other name is
    refused with 421, so a web page that rebinds its own domain to the port cannot
    read it (``None`` checks no ``Host``, for an app mounted behind another check).
    Needs ``turnkit[metrics]``.
    """
    if not isinstance(runtime, RuntimeClient):
        raise ConfigurationError(
            "ops_app needs a turnkit.Runtime or a turnkit.RuntimeClient, "
            f"got {type(runtime).__name__}"
        )
    from ._metrics import CONTENT_TYPE, WorkerStats, metrics_for

    hosts = checked_names(allowed_hosts, "allowed_hosts")
    metrics = metrics_for(runtime)
    if worker is not None:
        if not isinstance(worker, WorkerStats):
            raise ConfigurationError(
                f"ops_app's worker must have claimed and running, got {type(worker).__name__}"
            )
        metrics.worker = worker

    async def scrape(request: Request) -> Response:
        return Response(await metrics.scrape(), media_type=CONTENT_TYPE)

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readiness(runtime), methods=["GET"]),
            Route("/metrics", scrape, methods=["GET"]),
        ],
        middleware=[
            # Outermost, as in create_app: it also drains what a refusal left unread.
            Middleware(BodyLimit, max_bytes=OPS_MAX_BODY_BYTES),
            Middleware(
                HostGuard,
                hosts=None if hosts is None else [*LOOPBACK_NAMES, *hosts],
                ip_literals=True,
            ),
        ],
    )
