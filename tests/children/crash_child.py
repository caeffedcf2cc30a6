"""Child process for ``test_crash_recovery.py`` (not a test module: pytest does not collect it).

Usage::

    python crash_child.py STORE CRASH_AT WHEN MODE

``STORE`` is a SQLite file path, or ``postgres:SCHEMA:WORK_DIR`` for PostgreSQL
(the server named by ``TURNKIT_TEST_POSTGRES_DSN``, turnkit's tables in ``SCHEMA``).

``CRASH_AT`` is the commit number (counted by ``CrashingStore`` across all sessions,
commit 1 being the turn's opening) at which the process SIGKILLs itself; ``0`` means
never. ``WHEN`` is ``before`` or ``after`` that commit. ``MODE`` is

* ``run``: start the first turn (fixed turn id), wait for it, then run a second turn;
* ``redeliver``: redeliver the first turn with ``start(text, turn_id=same)``, then run
  a second turn;
* ``recover``: ``await runtime.recover()``, then run a second turn. If the first
  turn never reached the store (a crash before its opening committed),
  ``recover()`` cannot know about it; the child then redelivers it, as the caller
  that never got an answer would, and reports ``fallback: true``.

A process that is not killed prints one JSON object on stdout: the commit count
after the first turn, both turns' results and, in ``recover`` mode, what
``recover()`` returned. The remote tool appends one line per run (the idempotency key
it got and the commit count before it) to ``remote_log_path(STORE)``.

The model answers with ``ScriptedModel(respond=...)``: every reply is derived from
the transcript alone, so a replay in a fresh process asks for the same calls and
writes the same final text.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal, cast

from turnkit import (
    Agent,
    AssistantMessage,
    Message,
    Runtime,
    ToolContext,
    ToolMessage,
    UserMessage,
    tool,
)
from turnkit.stores import SqliteStore, Store
from turnkit.testing import CrashingStore, ScriptedModel, ScriptedReply, tool_call

AGENT = "ops"
SESSION = "s1"
TURN_ID = "turn-1"
TURN_TEXT = "please order a, b and c"
ITEMS = ("a", "b", "c")
SECOND_TURN_ID = "turn-2"
SECOND_TEXT = "one more: d"
SECOND_ITEM = "d"

_ORDERS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders ("
    "id INTEGER PRIMARY KEY, item TEXT NOT NULL, turn_id TEXT NOT NULL, call_id TEXT NOT NULL)"
)


@tool
def create_order(item: str, ctx: ToolContext) -> dict[str, object]:
    """Place an order for `item`; returns the new order id (local: runs in the step tx)."""
    ctx.store.execute(_ORDERS_SCHEMA)
    # Portable SQL, so the same tool runs on SQLite and PostgreSQL unchanged.
    rows = ctx.store.execute(
        "INSERT INTO orders (id, item, turn_id, call_id) "
        "SELECT coalesce(max(id), 0) + 1, ?, ?, ? FROM orders RETURNING id",
        (item, ctx.turn_id, ctx.call_id),
    )
    return {"order_id": rows[0][0], "item": item}


def remote_log_path(spec: str) -> str:
    """Where ``check_orders`` logs each run: a remote service's own record of requests."""
    if spec.startswith("postgres:"):
        _, schema, work_dir = spec.split(":", 2)
        return os.path.join(work_dir, f"{schema}.remote.log")
    return spec + ".remote.log"


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        schema = spec.split(":", 2)[1]
        return PostgresStore(os.environ["TURNKIT_TEST_POSTGRES_DSN"], schema=schema)
    return SqliteStore(spec)


#: Set by ``main``: the store spec this process runs on, and its crashing store.
SPEC = ""
STORES: list[CrashingStore] = []


@tool
async def check_orders(order_ids: list[int], ctx: ToolContext) -> dict[str, object]:
    """Look up the shipping status of orders (remote: awaited outside the transaction)."""
    await asyncio.sleep(0)  # not a wait: stands in for a request to a remote service
    store = STORES[0]
    # One line per run: the key it was sent and how many commits preceded it.
    with open(remote_log_path(SPEC), "a") as log:
        log.write(f"{ctx.idempotency_key} {store.commits}\n")
    return {
        "statuses": {str(i): "packed" if i % 2 else "shipped" for i in order_ids},
        "request_key": ctx.idempotency_key,
    }


def _unexpected(why: str) -> ScriptedReply:
    return ScriptedReply(text=f"UNEXPECTED: {why}")


def _final_text(orders: Sequence[ToolMessage], check: ToolMessage) -> str:
    statuses = check.result["statuses"]
    parts = [
        f"#{o.result['order_id']} {o.result['item']} ({statuses[str(o.result['order_id'])]})"
        for o in orders
    ]
    return "Ordered: " + ", ".join(parts) + "."


def respond(transcript: Sequence[Message]) -> ScriptedReply:
    """The next reply, read off the current turn's part of the transcript."""
    openings = [i for i, m in enumerate(transcript) if isinstance(m, UserMessage)]
    if not openings:
        return _unexpected("no user message")
    start = openings[-1]
    opening = cast(UserMessage, transcript[start])
    since = list(transcript[start + 1 :])
    step = sum(isinstance(m, AssistantMessage) for m in since)
    results = [m for m in since if isinstance(m, ToolMessage)]
    errors = [m for m in results if m.is_error]
    if errors:
        return _unexpected(f"tool error {errors[0].result!r}")
    if opening.text == TURN_TEXT:
        if step == 0:
            return ScriptedReply(
                text="Placing three orders.",
                tool_calls=[tool_call("create_order", {"item": item}) for item in ITEMS],
            )
        if step == 1:
            ids = [m.result["order_id"] for m in results]
            return ScriptedReply(
                text="Checking them.",
                tool_calls=[tool_call("check_orders", {"order_ids": ids})],
            )
        if step == 2:
            return ScriptedReply(text=_final_text(results[:-1], results[-1]))
    elif opening.text == SECOND_TEXT:
        if step == 0:
            return ScriptedReply(
                text="One more.",
                tool_calls=[tool_call("create_order", {"item": SECOND_ITEM})],
            )
        if step == 1:
            return ScriptedReply(text=f"Also ordered #{results[0].result['order_id']} d.")
    return _unexpected(f"step {step} of turn {opening.text!r}")


def build_agent() -> Agent:
    return Agent(
        name=AGENT,
        model=ScriptedModel(respond=respond, record_calls=False),
        instructions="You place orders.",
        tools=[create_order, check_orders],
    )


async def main(spec: str, crash_at: int, when: Literal["before", "after"], mode: str) -> None:
    global SPEC
    SPEC = spec
    store = CrashingStore(open_store(spec), crash_at=crash_at or None, when=when)
    STORES.append(store)
    out: dict[str, Any] = {"mode": mode}
    async with Runtime([build_agent()], store=store) as runtime:
        session = runtime.session(AGENT, SESSION)
        if mode in ("run", "redeliver"):
            session.start(TURN_TEXT, turn_id=TURN_ID)
        elif mode == "recover":
            recovered = await runtime.recover()
            out["recovered"] = [asdict(r) for r in recovered]
            known = await store.session(SESSION).turn(TURN_ID)
            out["fallback"] = known is None
            if known is None:
                session.start(TURN_TEXT, turn_id=TURN_ID)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        out["turn1"] = asdict(await session.result(TURN_ID))
        out["commits"] = store.commits
        session.start(SECOND_TEXT, turn_id=SECOND_TURN_ID)
        out["turn2"] = asdict(await session.result(SECOND_TURN_ID))
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[3] not in ("before", "after"):
        raise SystemExit(__doc__)
    asyncio.run(
        main(
            sys.argv[1],
            int(sys.argv[2]),
            cast(Literal["before", "after"], sys.argv[3]),
            sys.argv[4],
        )
    )
