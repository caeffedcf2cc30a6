"""Child process for ``test_tracing.py`` (not a test module: pytest does not collect it).

Usage::

    python tracing_child.py STORE crash|park|summary-call|summary-model SPANS

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. The process traces with the
OpenTelemetry SDK, exporting each span as it ends, one JSON object a line, to the
file ``SPANS``. ``crash`` starts turn ``t-1``, whose first tool call SIGKILLs the
process (after the first model step committed); ``park`` starts turn ``t-1``, whose
tool call parks on an approval, and exits. Either way the turn is left for another
process to finish: ``runtime.recover()`` or ``session.resume(...)``. The
``summary-*`` modes run an agent whose history policy summarizes older turns: a few
turns, then turn ``t-1``, which dies in its first summary call (``summary-call``)
or in the model step that summary was made for, after it committed
(``summary-model``).
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

from turnkit import (
    Agent,
    Message,
    Runtime,
    SummarizeOlder,
    Summarizer,
    ToolContext,
    ToolMessage,
    UserMessage,
    tool,
)
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


#: Where the summarizing child dies in turn ``t-1`` ("call" or "model"); "" never.
DIE_IN = ""


class Summarizing(ScriptedModel):
    """The summarizer: a model with a name, so its spans are ``chat summarizer``."""

    model = "summarizer"


def summarize(messages: Sequence[Message]) -> Any:
    if DIE_IN == "call":
        os.kill(os.getpid(), signal.SIGKILL)
    return f"summary of {len(messages[0].text)} chars"


def chat(messages: Sequence[Message]) -> Any:
    if DIE_IN == "model":
        os.kill(os.getpid(), signal.SIGKILL)
    return "noted " + "w" * 80


def build_summarizing_agent() -> Agent:
    policy = SummarizeOlder(
        max_tokens=60, summarizer=Summarizer(model=Summarizing(respond=summarize))
    )
    return Agent(name=AGENT, model=ScriptedModel(respond=chat), history=policy)


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
    global KILL, DIE_IN
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans)))
    if mode.startswith("summary-"):
        agent = build_summarizing_agent()
        async with Runtime(agent, store=open_store(spec), tracer=OtelTracer(provider)) as rt:
            session = rt.session(AGENT, SESSION)
            for n in range(3):
                await session.result(session.start(f"note {n} " + "n" * 80))
            DIE_IN = mode.removeprefix("summary-")
            await session.result(session.start("note 3 " + "n" * 80, turn_id=TURN_ID))
        return
    KILL = mode == "crash"
    text = "ship o-1" if mode == "crash" else "refund o-1"
    async with Runtime(build_agent(), store=open_store(spec), tracer=OtelTracer(provider)) as rt:
        session = rt.session(AGENT, SESSION)
        result = await session.result(session.start(text, turn_id=TURN_ID))
        print(result.status)


MODES = ("crash", "park", "summary-call", "summary-model")

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[2] not in MODES:
        raise SystemExit(__doc__)
    asyncio.run(main(*sys.argv[1:]))
