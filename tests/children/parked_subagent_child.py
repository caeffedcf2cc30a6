"""Child process for the parent-cancel-reaches-child test (not collected by pytest).

Usage::

    python parked_subagent_child.py STORE

``STORE`` is a SQLite path or ``postgresql://…#schema``. Runs a ``boss`` turn whose
subagent (``researcher``) parks on an approval, so the boss parks too, prints the
parent's status and exits, leaving both parked in the store.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from shared_session_child import open_store

from turnkit import (
    Agent,
    Runtime,
    ToolContext,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    subagent,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


@tool
async def deploy(ctx: ToolContext) -> dict[str, bool]:
    """Deploy once approved."""
    ok = await ctx.request_input("approve", "Deploy to prod?", schema={"type": "boolean"})
    return {"deployed": bool(ok)}


def agents() -> list[Agent]:
    def boss_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("researcher", {"task": "ship it"})])
        return f"boss: {last.result}" if isinstance(last, ToolMessage) else "?"

    def child_reply(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, TriggerMessage):
            return ScriptedReply(tool_calls=[tool_call("deploy", {})])
        return f"child: {last.result}"

    boss = Agent(
        name="boss",
        model=ScriptedModel(respond=boss_reply),
        tools=[subagent("researcher", description="Ships things.")],
    )
    researcher = Agent(name="researcher", model=ScriptedModel(respond=child_reply), tools=[deploy])
    return [boss, researcher]


async def main(spec: str) -> None:
    async with Runtime(agents(), store=open_store(spec)) as runtime:
        session = runtime.session("boss", "s1")
        result = await session.result(await session.submit("ship", turn_id="parent"))
        print(result.status, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1]))
