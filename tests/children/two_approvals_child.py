"""Child process for the two-approvals tests (not collected by pytest).

Usage::

    python two_approvals_child.py STORE park
    python two_approvals_child.py STORE answer ORDER BY

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. ``park`` starts a turn whose
one model step refunds orders ``o-1`` (approved only by ``ana``) and ``o-2`` (only
by ``bo``); both calls ask ``approve-refund``, so the turn parks on two requests.
``answer`` (a new process, nothing in memory) answers the request of ``ORDER`` as
``BY``. Each prints one JSON line: the turn's status and the ids still open (or
its answer), or the refusal. A refund appends ``ORDER`` to ``STORE.refunds``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from turnkit import (
    Agent,
    Answerers,
    ResumeAuthorizationError,
    Runtime,
    ToolContext,
    ToolMessage,
    UserMessage,
    tool,
)
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

APPROVERS = {"o-1": "ana", "o-2": "bo"}
SPEC = ""


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once its approver says yes."""
    yes = await ctx.request_input(
        "approve-refund",
        f"Refund {order_id}?",
        schema={"type": "boolean"},
        answerers=Answerers.user(APPROVERS[order_id]),
    )
    if yes:
        with open(refunds_path(SPEC), "a") as log:
            log.write(order_id + "\n")
    return {"order": order_id, "refunded": yes}


def refunds_path(spec: str) -> str:
    if spec.startswith("postgres:"):
        return "/tmp/" + spec.split(":", 2)[1] + ".refunds"
    return spec + ".refunds"


def respond(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(
            tool_calls=[tool_call("refund", {"order_id": order}) for order in APPROVERS]
        )
    results = [m.result for m in messages if isinstance(m, ToolMessage)]
    return "; ".join(f"{r['order']}: {r['refunded']}" for r in results)


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        _, schema, dsn = spec.split(":", 2)
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)


async def main(spec: str, mode: str, args: list[str]) -> dict[str, Any]:
    global SPEC
    SPEC = spec
    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[refund])
    async with Runtime(agent, store=open_store(spec)) as runtime:
        session = runtime.session("a", "s1")
        if mode == "park":
            result = await session.result(session.start("refund both", turn_id="t-1"))
        else:
            order, by = args
            waiting = await session.pending_all()
            (request,) = [r for r in waiting if r.prompt == f"Refund {order}?"]
            try:
                tid = await session.resume(request.turn_id, request.id, True, by=by)
            except ResumeAuthorizationError as exc:
                return {"refused": str(exc), "open": [r.id for r in await session.pending_all()]}
            result = await session.result(tid)
        return {
            "status": result.status,
            "open": [r.id for r in result.requests],
            "text": result.text,
        }


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in ("park", "answer"):
        raise SystemExit(__doc__)
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))))
