"""Child process for ``test_tracing.py`` (not a test module: pytest does not collect it).

Usage::

    python tracing_child.py STORE crash|park SPANS

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. The process traces with the
OpenTelemetry SDK, exporting each span as it ends, one JSON object a line, to the
file ``SPANS``. ``crash`` starts turn ``t-1``, whose first tool call SIGKILLs the
process (after the first model step committed); ``park`` starts turn ``t-1``, whose
tool call parks on an approval, and exits. Either way the turn is left for another
process to finish: ``runtime.recover()`` or ``session.resume(...)``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from turnkit import Agent, Message, Runtime, ToolContext, ToolMessage, UserMessage, tool
from turnkit.otel import OtelTracer
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

AGENT = "a"
SESSION = "s1"
TURN_ID = "t-1"
#: Set in the crashing child only: the tool's first run then kills its process.
KILL = False


@tool
async def ship(order_id: str) -> dict[str, Any]:
    """Ship an order (the crashing child dies in here)."""
    if KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"shipped": order_id}


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once a person approves it."""
    answer = await ctx.request_input("approve", f"Refund {order_id}?")
    return {"refunded": bool(answer["approved"])}


def respond(messages: Sequence[Message]) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        name = "ship" if last.text.startswith("ship") else "refund"
        return ScriptedReply(tool_calls=[tool_call(name, {"order_id": "o-1"})])
    if isinstance(last, ToolMessage):
        return f"done: {last.result}"
    return "?"


def build_agent() -> Agent:
    return Agent(name=AGENT, model=ScriptedModel(respond=respond), tools=[ship, refund])


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        _, schema, dsn = spec.split(":", 2)
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)


class FileExporter(SpanExporter):
    """Appends each finished span, as the SDK's JSON, to a file (flushed at once)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps(json.loads(span.to_json())) + "\n")
        return SpanExportResult.SUCCESS


async def main(spec: str, mode: str, spans: str) -> None:
    global KILL
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans)))
    KILL = mode == "crash"
    text = "ship o-1" if mode == "crash" else "refund o-1"
    async with Runtime(build_agent(), store=open_store(spec), tracer=OtelTracer(provider)) as rt:
        session = rt.session(AGENT, SESSION)
        result = await session.result(session.start(text, turn_id=TURN_ID))
        print(result.status)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[2] not in ("crash", "park"):
        raise SystemExit(__doc__)
    asyncio.run(main(*sys.argv[1:]))
