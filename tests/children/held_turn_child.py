"""Child process for the cross-process cancel and replace tests (not collected).

Usage::

    python held_turn_child.py STORE SIGNAL_DIR [then-submit | submit-on-signal]

``STORE`` is a SQLite file path or ``postgresql://…#schema``. Runs turn ``held`` on
session ``shared`` of agent ``a``: its remote tool creates ``SIGNAL_DIR/holding``
and waits for ``SIGNAL_DIR/release``; then the model would answer. Prints how the
turn ended: its status and reason (or error). With ``then-submit``, once the held
turn is in its tool it submits turn ``after``, prints ``acknowledged`` and waits to
be killed: a turn the store holds but nobody has run. With ``submit-on-signal``,
once the held turn is in its tool it waits for ``SIGNAL_DIR/submit``, submits turn
``after`` and prints how both ended, one line each (``held …`` then ``after …``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually
from shared_session_child import open_store

from turnkit import Agent, Runtime, UserMessage, tool
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def build_agent(signal_dir: Path) -> Agent:
    @tool
    async def hold() -> str:
        """Holds the turn until the parent releases it."""
        (signal_dir / "holding").touch()
        await eventually((signal_dir / "release").exists, what="the release", timeout=120)
        return "released"

    def respond(messages: object) -> object:
        last = messages[-1]  # type: ignore[index]
        if isinstance(last, UserMessage) and last.text == "hold":
            return ScriptedReply(tool_calls=[tool_call("hold")])
        if isinstance(last, UserMessage):
            return f"answered {last.text}"
        return "held and answered"

    return Agent(name="a", model=ScriptedModel(respond=respond), tools=[hold])


async def main(spec: str, signal_dir: Path, mode: str) -> None:
    then_submit = mode == "then-submit"
    async with Runtime(build_agent(signal_dir), store=open_store(spec)) as runtime:
        session = runtime.session("a", "shared")
        held = await session.submit("hold", turn_id="held")
        if mode == "submit-on-signal":
            await eventually((signal_dir / "submit").exists, what="the signal to submit")
            after = await session.submit("after", turn_id="after")
            for turn_id in (held, after):
                result = await session.result(turn_id)
                print(turn_id, result.status, result.reason or result.error or "", flush=True)
            return
        if then_submit:
            await eventually((signal_dir / "holding").exists, what="the held turn in its tool")
            await session.submit("after", turn_id="after")
            print("acknowledged", flush=True)
            await asyncio.Event().wait()  # until the test kills this process
        result = await session.result(held)
        print(result.status, result.reason or result.error or "", flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), (sys.argv[3:] or [""])[0]))
