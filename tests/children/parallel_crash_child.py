"""Child process for ``test_parallel_crash.py`` (not a test module: pytest does not collect it).

Usage::

    python parallel_crash_child.py STORE CRASH_AT WHEN MODE

``STORE``, ``CRASH_AT`` and ``WHEN`` are as for ``crash_child.py``. ``MODE`` is ``run``
(start the turn) or ``recover`` (``runtime.recover()``, or a redelivery when the
turn never reached the store). The turn's one model step asks for three calls at
once: ``fetch("a")`` (remote, slow), ``create_order("b")`` (local, writes a row in
its step's transaction) and ``fetch("c")`` (remote, quick), so they finish b, c, a
and the transcript must still read a, b, c. Each ``fetch`` run appends its label
and idempotency key to the remote log. A process that is not killed prints one
JSON object: the turn's result and the commit count.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal, cast

from crash_child import create_order, open_store, remote_log_path

from turnkit import Agent, Message, Runtime, ToolContext, ToolMessage, UserMessage, tool
from turnkit.testing import CrashingStore, ScriptedModel, ScriptedReply, tool_call

AGENT = "ops"
SESSION = "s1"
TURN_ID = "turn-1"
TEXT = "fetch a, order b, fetch c"
DELAYS = {"a": 0.2, "c": 0.05}
SPEC = ""


@tool
async def fetch(label: str, ctx: ToolContext) -> dict[str, str]:
    """Fetch one thing from a remote service (remote: awaited outside the transaction)."""
    await asyncio.sleep(DELAYS[label])  # not a wait: the remote call's duration
    with open(remote_log_path(SPEC), "a") as log:
        log.write(f"{label} {ctx.idempotency_key}\n")
    return {"label": label, "key": ctx.idempotency_key}


def respond(transcript: Sequence[Message]) -> ScriptedReply:
    last = transcript[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(
            text="Three at once.",
            tool_calls=[
                tool_call("fetch", {"label": "a"}),
                tool_call("create_order", {"item": "b"}),
                tool_call("fetch", {"label": "c"}),
            ],
        )
    results = [m for m in transcript if isinstance(m, ToolMessage)]
    # (Not the keys: each database is a store of its own, whose identity is in them.)
    parts = [f"{m.name}:{m.result.get('label') or m.result.get('order_id')}" for m in results]
    return ScriptedReply(text=" | ".join(parts))


async def main(spec: str, crash_at: int, when: Literal["before", "after"], mode: str) -> None:
    global SPEC
    SPEC = spec
    store = CrashingStore(open_store(spec), crash_at=crash_at or None, when=when)
    model = ScriptedModel(respond=respond, record_calls=False)
    agent = Agent(name=AGENT, model=model, tools=[fetch, create_order], max_parallel_tools=4)
    out: dict[str, Any] = {}
    async with Runtime([agent], store=store) as runtime:
        session = runtime.session(AGENT, SESSION)
        if mode == "recover":
            await runtime.recover()
            if await store.session(SESSION).turn(TURN_ID) is None:
                session.start(TEXT, turn_id=TURN_ID)  # it never reached the store
        elif mode == "run":
            session.start(TEXT, turn_id=TURN_ID)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        out["turn"] = asdict(await session.result(TURN_ID))
        out["commits"] = store.commits
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
