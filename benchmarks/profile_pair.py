"""Where a model+tool step pair spends its CPU: one long turn under cProfile.

Run from the repo root::

    .venv/bin/python benchmarks/profile_pair.py                      # memory, def tool
    .venv/bin/python benchmarks/profile_pair.py --store sqlite --tool async --pairs 2000
    .venv/bin/python benchmarks/profile_pair.py --sort cumulative --top 40
    .venv/bin/python benchmarks/profile_pair.py --store sqlite --codec aes   # sealed

The turn is ``step_overhead.py``'s (a zero-latency model calling a no-op tool once
per model step), on a fresh store, after one warm-up turn. The table lists the
functions with the most time of their own (``--sort tottime``, the default), with
callees (``cumulative``) or the most calls (``calls``), in µs per pair, so the
engine's share can be read beside the store's and the driver's. cProfile slows
everything by a similar factor; read the table for proportions, and
``step_overhead.py`` for absolute costs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import step_overhead
from step_overhead import StoreKind, ToolKind, Where, _run_turn


def profile(store: StoreKind, tool: ToolKind, pairs: int, where: Where) -> pstats.Stats:
    """Profile one turn of ``pairs`` pairs (after an unprofiled warm-up turn)."""
    asyncio.run(_run_turn(store, tool, min(pairs, 100), where))
    profiler = cProfile.Profile()

    async def measured() -> None:
        profiler.enable()
        try:
            await _run_turn(store, tool, pairs, where)
        finally:
            profiler.disable()

    asyncio.run(measured())
    return pstats.Stats(profiler)


def _where(name: tuple[str, int, str]) -> str:
    path, line, func = name
    if path == "~":
        return func  # a builtin
    parts = Path(path).parts
    short = "/".join(parts[parts.index("turnkit") :]) if "turnkit" in parts else Path(path).name
    return f"{short}:{line}({func})"


def table(stats: pstats.Stats, pairs: int, sort: str, top: int) -> str:
    """The ``top`` functions by ``sort``, in µs per pair."""
    rows = stats.stats  # type: ignore[attr-defined]
    key = {"calls": 1, "tottime": 2, "cumulative": 3}[sort]
    ordered = sorted(rows.items(), key=lambda item: item[1][key], reverse=True)[:top]
    total = sum(v[2] for v in rows.values())
    calls = sum(v[1] for v in rows.values())
    lines = [
        f"total {total / pairs * 1e6:.1f} µs/pair under the profiler, "
        f"{calls / pairs:.0f} function calls/pair (the load-independent measure)",
        f"{'own µs/pair':>12} {'cum µs/pair':>12} {'calls/pair':>11}  function",
    ]
    for name, (_, ncalls, tottime, cumtime, _) in ordered:
        lines.append(
            f"{tottime / pairs * 1e6:>12.2f} {cumtime / pairs * 1e6:>12.2f} "
            f"{ncalls / pairs:>11.1f}  {_where(name)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", choices=["memory", "sqlite", "postgres"], default="memory")
    p.add_argument("--tool", choices=["def", "async"], default="def")
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--sort", choices=["tottime", "cumulative", "calls"], default="tottime")
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--codec",
        choices=["none", "aes"],
        default="none",
        help="aes: every payload sealed with EnvelopeCodec, as step_overhead.py --codec aes",
    )
    p.add_argument("--dsn", default=step_overhead._floor.DEFAULT_DSN)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="turnkit-profile-") as d:
        where = Where(tmp=Path(d), dsn=args.dsn, codec=args.codec)
        stats = profile(args.store, args.tool, args.pairs, where)
    sealed = ", sealed (EnvelopeCodec)" if args.codec == "aes" else ""
    what = f"{args.store} store{sealed}, {args.tool} tool, {args.pairs} pairs"
    print(f"{what}, sorted by {args.sort}")
    print(table(stats, args.pairs, args.sort, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
