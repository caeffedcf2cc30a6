"""The console's live view of the deployment: workers and the sessions they hold,
from the store (``WorkerView``, where it has one), and the step-latency histogram
and takeover counts from the Prometheus metrics the processes export.

The workers' figures live in each worker's memory, so the console reads them where
they are published: its own runtime's metrics (``metrics_for``, when
``turnkit[metrics]`` is installed) and the ``/metrics`` of every URL it is given
(``Console(metrics=[...])``, ``turnkit console --metrics URL``), summed.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

from .._runtime.client import RuntimeClient
from .._seams.store import Store
from .._seams.worker_view import WorkerView

#: Most running turns the workers panel lists.
HELD_LIMIT = 200
#: Seconds a scrape of one metrics URL may take before it counts as down.
SCRAPE_TIMEOUT = 2.0
#: The histogram the workers export (see ``_metrics``): time between committed steps.
STEP_HISTOGRAM = "turnkit_step_seconds"
NO_REGISTRY = (
    "this store keeps no worker registry (SQLite, memory): turns run in the process "
    "that opened it, so there are no workers or takeovers to show"
)


async def workers_now(store: Store) -> dict[str, Any]:
    """The live workers, each with the running turns whose session it holds, and
    the running turns held by a process that is no live worker (it died or
    stalled: the turn waits to be taken over). ``recorded`` is false, with why, on
    a store without a worker registry."""
    if not isinstance(store, WorkerView):
        return {"recorded": False, "why": NO_REGISTRY, "workers": [], "orphaned": []}
    live, held = await asyncio.gather(store.live_workers(), store.held_sessions(limit=HELD_LIMIT))
    by_holder: dict[str, list[dict[str, Any]]] = {w.holder: [] for w in live}
    orphaned = []
    for h in held:
        row = {
            "session_id": h.session_id,
            "turn_id": h.turn_id,
            "agent": h.agent,
            "tenant": h.tenant,
            "holder": h.holder,
            "since": h.since,
        }
        if h.holder in by_holder:
            by_holder[h.holder].append(row)
        else:
            orphaned.append(row)
    return {
        "recorded": True,
        "why": None,
        "workers": [
            {
                "holder": w.holder,
                "agents": dict(w.agents),
                "serves": None if w.serves is None else list(w.serves),
                "seen_at": w.seen_at,
                "sessions": by_holder[w.holder],
            }
            for w in live
        ],
        "orphaned": orphaned,
    }


async def step_latency(runtime: RuntimeClient, urls: Sequence[str]) -> dict[str, Any]:
    """The step-latency histogram (``turnkit_step_seconds``) summed over this
    process and every URL scraped, as counts per bucket (not cumulative) by step
    kind; the takeovers and fenced deliveries those processes counted; and each
    source, with its error if it could not be read."""
    sources: list[dict[str, Any]] = []
    families: list[Any] = []
    try:
        from ._metrics import metrics_for
    except ImportError as exc:
        sources.append({"source": "this process", "error": str(exc)})
    else:
        families += list(metrics_for(runtime).registry.collect())
        sources.append({"source": "this process", "error": None})
    scraped = await asyncio.gather(*(asyncio.to_thread(_scrape, url) for url in urls))
    for url, (found, error) in zip(urls, scraped, strict=True):
        families += found
        sources.append({"source": url, "error": error})
    return {"sources": sources, **_summed(families)}


def _scrape(url: str) -> tuple[list[Any], str | None]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
            text = response.read().decode("utf-8")
        return list(text_string_to_metric_families(text)), None
    except Exception as exc:  # a worker down or unreachable: shown, not fatal
        return [], f"{type(exc).__name__}: {exc}"


def _summed(families: Iterable[Any]) -> dict[str, Any]:
    cumulative: dict[str, dict[float, float]] = {}
    counts = {"takeovers": 0.0, "fenced": 0.0}
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == f"{STEP_HISTOGRAM}_bucket":
                bound = float(labels["le"])
                of_kind = cumulative.setdefault(labels.get("kind", "step"), {})
                of_kind[bound] = of_kind.get(bound, 0.0) + value
            elif name in ("turnkit_takeovers", "turnkit_takeovers_total"):
                counts["takeovers"] += value
            elif name in ("turnkit_fenced_deliveries", "turnkit_fenced_deliveries_total"):
                counts["fenced"] += value
    bounds = sorted({b for kind in cumulative.values() for b in kind})
    kinds = {}
    for kind, by_bound in sorted(cumulative.items()):
        running = [by_bound.get(b, 0.0) for b in bounds]
        kinds[kind] = [int(n - (running[i - 1] if i else 0)) for i, n in enumerate(running)]
    return {
        "bounds": [None if b == float("inf") else b for b in bounds],
        "kinds": kinds,
        "takeovers": int(counts["takeovers"]),
        "fenced": int(counts["fenced"]),
    }
