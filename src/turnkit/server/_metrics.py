"""A runtime's metrics in Prometheus text format, through ``prometheus_client``.

Each runtime gets a registry of its own (never the process-wide default, so two
runtimes in one process, or a test's, never mix their figures). Step latencies and
turn endings are counted from the runtime's event sink as they happen; the store's
queue depth is read when the metrics are scraped; a worker's claims and takeovers
are read from the worker. Needs ``turnkit[metrics]``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from .._runtime.client import RuntimeClient
from .._runtime.runtime import Runtime
from .._seams.queue import WorkerRegistry
from .._seams.store import UsageLedger
from .._values.events import TERMINAL_EVENT_TYPES, TurnEvent

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnkit's metrics need prometheus_client: pip install 'turnkit[metrics]'"
    ) from exc

#: The content type of the text the scrape returns.
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Seconds a scrape waits for the store's counts before it reports the store down.
STORE_TIMEOUT = 5.0
#: Turns whose last step time is kept at most (turns that ended are dropped at once).
_TRACKED_TURNS = 10_000
#: Step latency buckets, in seconds: from a fast local tool to a long model reply.
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: The logged event that ends each kind of step.
_STEP_ENDS = {"message.completed": "model", "action.completed": "tool"}


@runtime_checkable
class TurnCounting(Protocol):
    """A store that counts its unfinished turns by status (every turnkit store)."""

    async def turn_counts(self) -> dict[str, int]: ...


@runtime_checkable
class WorkerStats(Protocol):
    """What a worker tells about itself: turns claimed, and sessions delivering now.
    A worker that also counts ``takeovers`` (claims of a turn another process left
    running) has them reported too."""

    @property
    def claimed(self) -> int: ...

    @property
    def running(self) -> int: ...


class TurnkitMetrics:
    """The metrics of one runtime; ``metrics_for(runtime)`` makes (or finds) them."""

    def __init__(self, runtime: RuntimeClient) -> None:
        # Weakly: the runtime (through its sink) holds these metrics, not the reverse.
        self._runtime = weakref.ref(runtime)
        self.registry = CollectorRegistry()
        self.worker: WorkerStats | None = None
        reg = self.registry
        self.turns = Gauge(
            "turnkit_turns",
            "Unfinished turns in the store, by status (queued is the queue depth)",
            ["status"],
            registry=reg,
        )
        self.unserved = Gauge(
            "turnkit_turns_unserved",
            "Unfinished turns of an agent version no live worker serves (a deploy that "
            "retired the last worker of a version its turns still wait on), by agent and "
            "version; read from the store's worker registry (PostgreSQL)",
            ["agent", "version"],
            registry=reg,
        )
        self.tenant_tokens = Gauge(
            "turnkit_tenant_tokens",
            "Tokens each tenant's model calls used, from the store's usage ledger (kept "
            "while the runtime has a Budget), by tenant and direction (input or output)",
            ["tenant", "direction"],
            registry=reg,
        )
        self.tenant_cost = Gauge(
            "turnkit_tenant_cost",
            "What each tenant's model calls cost by the Budget's prices, from the ledger",
            ["tenant"],
            registry=reg,
        )
        self.tenant_calls = Gauge(
            "turnkit_tenant_model_calls",
            "Model calls each tenant made, from the usage ledger",
            ["tenant"],
            registry=reg,
        )
        self.store_up = Gauge(
            "turnkit_store_up",
            "Whether the store answered the last scrape (1) or not (0)",
            registry=reg,
        )
        self.deliveries = Gauge(
            "turnkit_deliveries_running",
            "Sessions with a delivery running in this process",
            registry=reg,
        )
        self.steps = Histogram(
            "turnkit_step_seconds",
            "Time from one committed step of a turn to the next, by kind (model or tool)",
            ["kind"],
            buckets=_STEP_BUCKETS,
            registry=reg,
        )
        self.ended = Counter(
            "turnkit_turns_ended",
            "Turns this process ended, by how they ended",
            ["status"],
            registry=reg,
        )
        self.relay_lag = Histogram(
            "turnkit_relay_lag_seconds",
            "Delay of a batch of live events from NOTIFY to its arrival here",
            buckets=_LAG_BUCKETS,
            registry=reg,
        )
        reg.register(_ReadAtScrape(self))
        self._last_step: OrderedDict[str, float] = OrderedDict()
        self._unsubscribe = runtime.sink.subscribe(self._seen)
        relay = runtime.relay
        if relay is not None and hasattr(relay, "on_lag"):
            relay.on_lag = self.relay_lag.observe

    def _seen(self, event: TurnEvent) -> None:
        if event.seq is None:
            return  # live-only: no step ended
        now = time.monotonic()
        turn = event.turn_id
        kind = _STEP_ENDS.get(event.type)
        if kind is not None:
            before = self._last_step.get(turn)
            if before is not None:
                self.steps.labels(kind).observe(now - before)
        if event.type in TERMINAL_EVENT_TYPES:
            self.ended.labels(event.type.removeprefix("turn.")).inc()
            self._last_step.pop(turn, None)
            return
        if event.type == "input.requested":
            self._last_step.pop(turn, None)  # a person's answer is no step
            return
        self._last_step[turn] = now
        self._last_step.move_to_end(turn)
        while len(self._last_step) > _TRACKED_TURNS:
            self._last_step.popitem(last=False)

    async def refresh(self) -> None:
        """Read what the store knows (its queue depth); a store that does not answer
        within ``STORE_TIMEOUT`` is reported down."""
        runtime = self._runtime()
        if runtime is None:
            return
        store = runtime.store
        self.deliveries.set(runtime.running_sessions if isinstance(runtime, Runtime) else 0)
        if not isinstance(store, TurnCounting):
            return
        try:
            counts = await asyncio.wait_for(store.turn_counts(), STORE_TIMEOUT)
        except Exception:
            self.store_up.set(0)
            return
        self.store_up.set(1)
        for status, count in counts.items():
            self.turns.labels(status).set(count)
        if isinstance(store, WorkerRegistry):
            try:
                unserved = await asyncio.wait_for(store.unserved_turns(), STORE_TIMEOUT)
            except Exception:
                self.store_up.set(0)
                return
            self.unserved.clear()  # a version served again drops out
            for agent, version, count in unserved:
                self.unserved.labels(agent, version).set(count)
        budget = runtime.budget if isinstance(runtime, Runtime) else None
        if budget is not None and isinstance(store, UsageLedger):
            try:
                spent = await asyncio.wait_for(store.usage_by_tenant(), STORE_TIMEOUT)
            except Exception:
                self.store_up.set(0)
                return
            for tenant, spend in spent.items():
                self.tenant_tokens.labels(tenant, "input").set(spend.input_tokens)
                self.tenant_tokens.labels(tenant, "output").set(spend.output_tokens)
                self.tenant_cost.labels(tenant).set(spend.cost)
                self.tenant_calls.labels(tenant).set(spend.calls)

    async def scrape(self) -> bytes:
        """The metrics as Prometheus text, read fresh."""
        await self.refresh()
        return generate_latest(self.registry)


class _ReadAtScrape:
    """What is read from other objects at each scrape: the worker's counters and the
    relay's drops."""

    def __init__(self, metrics: TurnkitMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        worker = self._metrics.worker
        if worker is not None:
            yield CounterMetricFamily(
                "turnkit_claims", "Turns this worker claimed", value=worker.claimed
            )
            takeovers = getattr(worker, "takeovers", None)
            if isinstance(takeovers, int):
                yield CounterMetricFamily(
                    "turnkit_takeovers",
                    "Claims of a turn another process left running (it died or hung)",
                    value=takeovers,
                )
            yield GaugeMetricFamily(
                "turnkit_worker_running", "Sessions this worker delivers now", value=worker.running
            )
        runtime = self._metrics._runtime()
        if runtime is not None:
            yield CounterMetricFamily(
                "turnkit_fenced_deliveries",
                "Deliveries stopped because another process took their turn over "
                "(their late commit was refused)",
                # (a client delivers nothing to be fenced)
                value=runtime.fenced_deliveries if isinstance(runtime, Runtime) else 0,
            )
        relay: Any = runtime.relay if runtime is not None else None
        dropped = getattr(relay, "dropped", None)
        if isinstance(dropped, int):
            yield CounterMetricFamily(
                "turnkit_relay_dropped",
                "Live events the relay dropped because its buffer was full",
                value=dropped,
            )
        rejected = getattr(relay, "rejected", None)
        if isinstance(rejected, Mapping):
            family = CounterMetricFamily(
                "turnkit_relay_rejected",
                "Notifications the relay's listener dropped: forged (not signed with the "
                "relay key), malformed, or stale",
                labels=["reason"],
            )
            for reason in ("forged", "malformed", "stale"):
                family.add_metric([reason], rejected.get(reason, 0))
            yield family


_BY_RUNTIME: weakref.WeakKeyDictionary[RuntimeClient, TurnkitMetrics] = weakref.WeakKeyDictionary()


def metrics_for(runtime: RuntimeClient) -> TurnkitMetrics:
    """The runtime's metrics, made on first use and shared by every app that serves them."""
    found = _BY_RUNTIME.get(runtime)
    if found is None:
        found = _BY_RUNTIME[runtime] = TurnkitMetrics(runtime)
    return found
