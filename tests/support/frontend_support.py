"""What the front-end tests share: the real JavaScript clients run by Node, and an
agent whose model can be held mid-reply.

The Node scripts live in ``tests/js`` with their packages pinned in its lockfile
(``npm ci`` there, as ``.ci/run`` does). Without Node or those packages a test is
skipped with a message saying how to get them, except in CI (``CI`` set), where
it fails instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import pytest
from suite_paths import JS

import turnkit
from turnkit import Answerers, Approval, ToolContext, define_action, tool
from turnkit.testing import ScriptedReply, tool_call

#: How long a Node client may take to say its next line.
LINE_DEADLINE = 20.0


def node_or_skip() -> str:
    """The ``node`` executable, once ``tests/js``'s packages are installed."""
    node = shutil.which("node")
    missing = (
        "node is not on PATH"
        if node is None
        else None
        if (JS / "node_modules" / "ai").is_dir() and (JS / "node_modules" / "@ag-ui").is_dir()
        else "tests/js/node_modules is missing: run `npm ci` in tests/js"
    )
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the JavaScript client tests must run in CI, but {missing}")
        pytest.skip(f"the JavaScript client tests need Node 20+ and their packages: {missing}")
    assert node is not None
    return node


class NodeClient:
    """A Node script run as a subprocess, read one JSON line at a time."""

    #: Every client started, so a fixture can end those a failed test left running.
    started: ClassVar[list[NodeClient]] = []

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, script: str, *args: str) -> NodeClient:
        process = await asyncio.create_subprocess_exec(
            node_or_skip(),
            str(JS / script),
            *args,
            cwd=JS,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        client = cls(process)
        cls.started.append(client)
        return client

    async def until(self, event: str) -> dict[str, Any]:
        """The next line whose ``event`` is ``event`` (failing on a ``failed`` one)."""
        assert self.process.stdout is not None
        while True:
            try:
                raw = await asyncio.wait_for(self.process.stdout.readline(), LINE_DEADLINE)
            except TimeoutError:
                raise AssertionError(
                    f"the Node client said no {event!r}; saw {self.lines}"
                ) from None
            if not raw:
                raise AssertionError(
                    f"the Node client ended before saying {event!r}: {await self._stderr()}"
                )
            line = json.loads(raw)
            self.lines.append(line)
            if line["event"] == "failed":
                raise AssertionError(f"the Node client failed: {line['message']}; saw {self.lines}")
            if line["event"] == event:
                return line

    async def result(self) -> dict[str, Any]:
        line = await self.until("result")
        code = await asyncio.wait_for(self.process.wait(), LINE_DEADLINE)
        assert code == 0, await self._stderr()
        return line

    async def _stderr(self) -> str:
        assert self.process.stderr is not None
        return (await asyncio.wait_for(self.process.stderr.read(), LINE_DEADLINE)).decode()

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


noted: list[str] = []


@tool
def weigh(item: str) -> str:
    """Weigh an item."""
    return f"{item}: 2 kg"


@tool
def price(item: str) -> str:
    """Price an item."""
    return f"{item}: 3 EUR"


@tool
def note(text: str) -> str:
    """Write a note down."""
    noted.append(text)
    return "noted"


@tool
async def refund(order: str, ctx: ToolContext) -> str:
    """Refund an order once someone approves; A-2 only the lead may approve."""
    answerers = Answerers.user("lead") if order == "A-2" else None
    yes = await ctx.request_input(
        "approve-refund", f"Refund {order}?", schema={"type": "boolean"}, answerers=answerers
    )
    return f"{order} refunded" if yes else f"{order} kept"


def _ship(data: dict[str, Any], actx: Any) -> str:
    return f"{data['order']} shipped to {data['address']}"


#: Shipping waits for a decision on the proposed call: approve, edit, reject or respond.
ship = define_action(
    name="ship",
    description="Ship an order to an address.",
    input_schema={
        "type": "object",
        "properties": {"order": {"type": "string"}, "address": {"type": "string", "minLength": 3}},
        "required": ["order", "address"],
        "additionalProperties": False,
    },
    run=_ship,
    approval=Approval(allowed=("approve", "edit", "reject", "respond")),
)


class StoryModel:
    """Answers by the user's words; "tell a slow story" streams its first words, then
    waits for ``gate`` before the rest (``held`` is set while it waits)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.held = asyncio.Event()

    async def stream(
        self,
        messages: Sequence[turnkit.Message],
        tools: Sequence[turnkit.ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[turnkit.ModelDelta]:
        last = messages[-1]
        if isinstance(last, turnkit.ToolMessage):
            reply = _after_tool(last)
        else:
            reply = _opening(getattr(last, "text", ""))
        if reply.text.startswith("Once upon a time"):
            yield turnkit.TextDelta(text="Once upon a time, ")
            self.held.set()
            await self.gate.wait()
            yield turnkit.TextDelta(text=reply.text.removeprefix("Once upon a time, "))
        else:
            for word in reply.text.split(" "):
                yield turnkit.TextDelta(text=word + " ")
        stop = turnkit.StopReason(kind="tool_use" if reply.tool_calls else "end_turn")
        yield turnkit.ModelDone(
            reply=turnkit.ModelReply(
                text=_spoken(reply.text), tool_calls=tuple(reply.tool_calls), stop=stop
            )
        )


def _spoken(text: str) -> str:
    """What the deltas above add up to (words each followed by a space)."""
    if text.startswith("Once upon a time"):
        return text
    return "".join(word + " " for word in text.split(" "))


def _opening(text: str) -> ScriptedReply:
    if text == "weigh and price a widget":
        calls = [
            tool_call("weigh", {"item": "widget"}, id="call_weigh"),
            tool_call("price", {"item": "widget"}, id="call_price"),
        ]
        return ScriptedReply(text="Let me look.", tool_calls=calls)
    if text.startswith("refund"):
        order = text.split()[-1]
        return ScriptedReply(
            text="Asking first.",
            tool_calls=[tool_call("refund", {"order": order}, id="call_refund")],
        )
    if text.startswith("ship"):
        order = text.split()[-1]
        arguments = {"order": order, "address": "Old Road 1"}
        return ScriptedReply(
            text="Checking with you.",
            tool_calls=[tool_call("ship", arguments, id="call_ship")],
        )
    if text == "tell a slow story":
        return ScriptedReply(
            text="Once upon a time, there was a durable turn.",
            tool_calls=[tool_call("note", {"text": "story"}, id="call_note")],
        )
    return ScriptedReply(text=f"You said {text}.")


def _after_tool(last: turnkit.ToolMessage) -> ScriptedReply:
    if last.name == "note":
        return ScriptedReply(text="The end.")
    if last.name in ("refund", "ship"):
        return ScriptedReply(text=f"Done: {last.result}.")
    return ScriptedReply(text="A widget weighs 2 kg and costs 3 EUR.")


def shop_agent(model: StoryModel) -> turnkit.Agent:
    return turnkit.Agent(
        name="shop", model=model, instructions="Help.", tools=[weigh, price, note, refund, ship]
    )
