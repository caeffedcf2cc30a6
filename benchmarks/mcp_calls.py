"""MCP tool calls per second: a connection per call versus one shared connection.

Run from the repo root::

    .venv/bin/python benchmarks/mcp_calls.py                 # stdio and HTTP, 5 runs
    .venv/bin/python benchmarks/mcp_calls.py --runs 9 --calls 500

The server is this file run with ``--serve stdio`` or ``--serve http --port N`` (an
``MCPServer`` from the SDK with one ``add`` tool), in a process of its own. Each run
makes a fresh ``mcp_tools`` source and times ``McpTools.call`` directly (no turn,
no store), so the figures are the MCP client's cost alone:

- ``per call``: no runtime holds the source open, so every call opens its own
  connection and closes it (a stdio server is started per call), which is how every
  call went before connections were shared; ``--per-call-calls`` calls a run;
- ``shared, one by one``: the source held open (as a ``Runtime`` does), one call
  after another on the one connection, after a first call that opens it;
- ``shared, N at once``: the same, ``--concurrency`` calls in flight at a time.

The figures are calls per second, the median and the best of ``--runs`` runs, and
the time of the first call of a held source (it opens the connection).
``--cases per-call`` uses nothing newer than ``McpTools.call``, so it also runs
against a checkout from before connections were shared (``PYTHONPATH=that/src``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from turnkit.mcp import McpTools, http, mcp_tools, stdio

HERE = Path(__file__).resolve()


def serve(kind: str, port: int) -> None:
    from mcp.server import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    if kind == "stdio":
        server.run()
        return
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


def start_http() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, str(HERE), "--serve", "http", "--port", str(port)]
    process = subprocess.Popen(command)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the HTTP server did not start")


async def timed(calls: int, concurrency: int, tools: McpTools) -> float:
    """Calls per second of ``calls`` calls, ``concurrency`` in flight at a time."""
    limit = asyncio.Semaphore(concurrency)

    async def one(n: int) -> None:
        async with limit:
            assert await tools.call("add", {"a": n, "b": 1}, f"k{n}") == {"result": n + 1}

    started = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(calls)))
    return calls / (time.perf_counter() - started)


async def per_call(make: Callable[[], McpTools], calls: int) -> float:
    return await timed(calls, 1, make())


async def shared(
    make: Callable[[], McpTools], calls: int, concurrency: int, first: list[float]
) -> float:
    tools = make()
    await tools.open()
    try:
        started = time.perf_counter()
        await tools.call("add", {"a": 0, "b": 0}, "warm")
        first.append(time.perf_counter() - started)
        return await timed(calls, concurrency, tools)
    finally:
        await tools.close()


def report(label: str, rates: list[float]) -> None:
    print(
        f"  {label:<24} median {statistics.median(rates):8.1f} calls/s"
        f"   best {max(rates):8.1f}   ({len(rates)} runs)"
    )


async def bench(kind: str, make: Callable[[], McpTools], args: argparse.Namespace) -> None:
    print(f"{kind}:")
    cases: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("per call", lambda: per_call(make, args.per_call_calls)),
        ("shared, one by one", lambda: shared(make, args.calls, 1, first)),
        (
            f"shared, {args.concurrency} at once",
            lambda: shared(make, args.calls, args.concurrency, first),
        ),
    ]
    first: list[float] = []
    for label, run in cases:
        if label.split(",")[0].replace(" ", "-") in args.cases:
            report(label, [await run() for _ in range(args.runs)])
    if first:
        print(
            f"  first call of a held source (opens it): median "
            f"{statistics.median(first) * 1000:.0f} ms, best {min(first) * 1000:.0f} ms"
        )


async def main(args: argparse.Namespace) -> None:
    env = {"PATH": os.environ.get("PATH", "")}
    if "stdio" in args.transports:
        server = stdio(sys.executable, str(HERE), "--serve", "stdio", env=env)
        await bench("stdio", lambda: mcp_tools(server, name="bench"), args)
    if "http" in args.transports:
        process, url = start_http()
        try:
            await bench("Streamable HTTP", lambda: mcp_tools(http(url), name="bench"), args)
        finally:
            process.kill()
            process.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls a shared run")
    parser.add_argument("--per-call-calls", type=int, default=5, help="calls a per-call run")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--transports", nargs="+", default=["stdio", "http"])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["per-call", "shared"],
        help="per-call alone also runs against turnkit before connections were shared",
    )
    arguments = parser.parse_args()
    if arguments.serve:
        serve(arguments.serve, arguments.port)
    else:
        asyncio.run(main(arguments))
