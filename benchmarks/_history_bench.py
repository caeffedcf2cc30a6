"""The history policy's cost per model step, for ``step_overhead.py --history``.

Each case is ONE session of T turns on a fresh store, each turn one no-op tool call
and an answer (two model steps), under a history policy (or none). Turn ``k``'s
``turn.completed`` is timestamped; a window's cost per model step is its time over
its model steps (summary calls are the policy's own cost, not model steps).
``first``/``last`` are the first and last W turns of the session, ``growth`` their
ratio (median of the runs' ratios): it shows whether a step costs more as the
session grows. ``policy cost`` is the case's µs per model step minus the no-policy
case's on the same store and session length: on a busy machine that difference is
mostly noise, so the policy's own work is also timed directly: every call of
``ContextWindows.prepare`` (what the engine does for the policy before a model
step: find the previous window, ask the policy, make a summary when it asks for
one), reported as the median per step over the first and the last W turns.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import turnkit
from turnkit import (
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    StopReason,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    TurnEvent,
)
from turnkit._engine.context_window import ContextWindows
from turnkit.stores import Store

POLICIES: dict[str, turnkit.HistoryPolicy | None] = {
    "none": None,
    "last-turns": turnkit.LastTurns(10),
    "token-budget": turnkit.TokenBudget(2_000),
    "summarize": turnkit.SummarizeOlder(max_tokens=2_000),
}
#: What each turn opens with (about 50 estimated tokens).
OPENING = "Please look up the status of order 12345 and tell me where it is now. " * 3


class SessionModel:
    """Zero latency: a turn's opening gets a tool call, a tool result the answer, a
    summary request a summary. Reads only the last message; counts summary calls."""

    def __init__(self) -> None:
        self.summaries = 0
        self._tool = StopReason(kind="tool_use")
        self._end = StopReason(kind="end_turn")

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            yield TextDelta(text="It is packed.")
            yield ModelDone(reply=ModelReply(text="It is packed.", stop=self._end))
        elif not tools and last.text.startswith("Summary so far"):
            self.summaries += 1
            yield ModelDone(reply=ModelReply(text="Orders were looked up.", stop=self._end))
        else:
            call = ToolCall(id=f"c{len(messages)}", name="status", input={"order": 12345})
            yield ModelDone(reply=ModelReply(text="", tool_calls=(call,), stop=self._tool))


@turnkit.tool
def status(order: int) -> dict[str, Any]:
    """The status of an order."""
    return {"order": order, "status": "packed"}


@dataclass
class HistoryCase:
    store: str
    policy: str
    turns: int
    window: int
    us_per_step: float
    first_us_per_step: float
    last_us_per_step: float | None
    growth: float | None
    summaries: float
    prepare_first_us: float
    prepare_last_us: float | None
    prepare_growth: float | None
    policy_cost_us: float | None = None


@dataclass
class SessionRun:
    stamps: list[float]  # clock at the start, then at each turn.completed
    summaries: int
    prepare_s: list[float] = field(default_factory=list)  # per model step, in order


@contextmanager
def timing_prepare(into: list[float]) -> Iterator[None]:
    """Time every ``ContextWindows.prepare`` call into ``into`` (benchmark only)."""
    original = ContextWindows.prepare
    clock = time.perf_counter

    async def timed(self: ContextWindows, *args: Any) -> Any:
        t0 = clock()
        try:
            return await original(self, *args)
        finally:
            into.append(clock() - t0)

    ContextWindows.prepare = timed  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ContextWindows.prepare = original  # type: ignore[method-assign]


async def run_session(store: Store, policy: str, turns: int) -> SessionRun:
    """One session of ``turns`` turns: the clock at its start and at each
    ``turn.completed``, how many summary calls the policy made, and the time of
    each model step's ``prepare``."""
    model = SessionModel()
    agent = turnkit.Agent(name="bench", model=model, tools=[status], history=POLICIES[policy])
    stamps: list[float] = []
    clock = time.perf_counter

    def on_event(event: TurnEvent) -> None:
        if event.type == "turn.completed":
            stamps.append(clock())

    prepared: list[float] = []
    async with turnkit.Runtime(agent, store=store) as runtime:
        session = runtime.session("bench", "history")
        unsubscribe = session.subscribe(on_event)
        gc.collect()
        stamps.append(clock())
        with timing_prepare(prepared):
            for _ in range(turns):
                result = await session.result(session.start(OPENING))
                if result.status != "completed":
                    raise RuntimeError(f"benchmark turn did not complete: {result}")
        unsubscribe()
    return SessionRun(stamps, model.summaries, prepared)


def summarize_runs(
    store: str, policy: str, turns: int, window: int, runs: list[SessionRun]
) -> HistoryCase:
    steps = 2  # model steps per turn
    head_n = min(window, turns)
    has_tail = turns >= 2 * window
    rows: list[dict[str, float | None]] = []
    for run in runs:
        st, prep = run.stamps, run.prepare_s
        head = (st[head_n] - st[0]) / (head_n * steps) * 1e6
        tail = (st[turns] - st[turns - window]) / (window * steps) * 1e6 if has_tail else None
        p_head = statistics.median(prep[: head_n * steps]) * 1e6
        p_tail = statistics.median(prep[-window * steps :]) * 1e6 if has_tail else None
        rows.append(
            {
                "all": (st[turns] - st[0]) / (turns * steps) * 1e6,
                "head": head,
                "tail": tail,
                "growth": tail / head if tail is not None else None,
                "p_head": p_head,
                "p_tail": p_tail,
                "p_growth": p_tail / p_head if p_tail is not None else None,
            }
        )

    def med(key: str) -> float:
        return statistics.median([v for r in rows if (v := r[key]) is not None])

    return HistoryCase(
        store=store,
        policy=policy,
        turns=turns,
        window=window,
        us_per_step=med("all"),
        first_us_per_step=med("head"),
        last_us_per_step=med("tail") if has_tail else None,
        growth=med("growth") if has_tail else None,
        summaries=statistics.median([r.summaries for r in runs]),
        prepare_first_us=med("p_head"),
        prepare_last_us=med("p_tail") if has_tail else None,
        prepare_growth=med("p_growth") if has_tail else None,
    )


def with_policy_costs(cases: list[HistoryCase]) -> list[HistoryCase]:
    """Each case with its cost over the no-policy case of its store and length."""
    base = {(c.store, c.turns): c.us_per_step for c in cases if c.policy == "none"}
    for c in cases:
        none = base.get((c.store, c.turns))
        c.policy_cost_us = c.us_per_step - none if none is not None else None
    return cases


def _f(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_history_table(cases: Sequence[HistoryCase], window: int) -> None:
    w = str(window)
    header = (
        f"{'store':<7} {'policy':<13} {'turns':>5} {'µs/step':>8} {'first ' + w:>9} "
        f"{'last ' + w:>8} {'growth':>7} {'vs none':>8} | {'prepare µs/step first ' + w:>24} "
        f"{'last ' + w:>8} {'growth':>7} {'summaries':>9}"
    )
    print(header)
    print("-" * len(header))
    for c in cases:
        print(
            f"{c.store:<7} {c.policy:<13} {c.turns:>5} {c.us_per_step:>8.1f} "
            f"{c.first_us_per_step:>9.1f} {_f(c.last_us_per_step):>8} "
            f"{_f(c.growth, '.2f', 'x'):>7} {_f(c.policy_cost_us, '+.1f'):>8} | "
            f"{c.prepare_first_us:>24.1f} {_f(c.prepare_last_us):>8} "
            f"{_f(c.prepare_growth, '.2f', 'x'):>7} {c.summaries:>9.0f}"
        )
