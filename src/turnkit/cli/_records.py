"""``turnkit fork``: copying a session's history up to a step into a new session.

The work is ``turnkit._runtime.forking.fork_session``, through the store seam; this
module only reads the arguments and says what was made.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from .._channels.printable import printable, printable_json
from .._runtime.forking import fork_session
from ._progress import Progress
from ._show import split_target
from ._store import CliError, describe_store, reading_store

StoreOption = Callable[[argparse.ArgumentParser], None]


def add_fork(commands: Any, store_option: StoreOption) -> None:
    fork = commands.add_parser(
        "fork",
        help="copy a session's history up to a step into a new session",
        description="Make a new session holding SESSION's transcript and committed steps "
        "up to --at, and nothing after it; the original is only read. The turn cut at "
        "that point is left running: the next turnkit run, worker or runtime.recover() "
        "carries it on, with whatever model and tools run it then. SESSION#gN forks an "
        "archived generation.",
    )
    fork.add_argument("session", metavar="SESSION", help="a session id, or SESSION#gN")
    fork.add_argument(
        "--at",
        metavar="POINT",
        help="a transcript position (how many messages to keep), model:N (before that "
        "model step) or tool:N:CALL_ID (before that tool call); default: everything, "
        "a parked turn staying parked",
    )
    fork.add_argument("--to", metavar="NEW", help="the new session's id (default: made up)")
    fork.add_argument("--agent", help="the agent the new session belongs to (default: SESSION's)")
    store_option(fork)
    fork.add_argument("--json", action="store_true", help="print one JSON object instead")
    fork.set_defaults(handler=fork_command)


def fork_point_arg(text: str | None) -> int | str | None:
    """``--at``: digits are a transcript position, anything else a step id."""
    if text is None:
        return None
    return int(text) if text.isdigit() else text


async def fork_command(args: argparse.Namespace, progress: Progress) -> int:
    session_id, generation = split_target(args.session)
    async with reading_store(args.store) as store:
        progress.update(f"forking {args.session}…", force=True)
        try:
            made = await fork_session(
                store,
                session_id,
                at=fork_point_arg(args.at),
                new_session=args.to,
                generation=generation,
                agent=args.agent,
            )
        except ValueError as exc:
            raise CliError(str(exc)) from None
    progress.done()
    if args.json:
        out = {
            "source": made.source,
            "session_id": made.session_id,
            "agent": made.agent,
            "at": made.at,
            "turn_id": made.turn_id,
            "status": made.status,
            "turns": made.turns,
            "steps": made.steps,
            "events": made.events,
            "store": describe_store(args.store),
        }
        print(printable_json(json.dumps(out, ensure_ascii=False, indent=2)))
        return 0
    left = {
        "running": "left running: the next delivery carries it on",
        "suspended": "parked on the same question",
    }.get(made.status, made.status)
    print(
        printable(
            f"forked {made.source} at message {made.at} into {made.session_id} "
            f"(agent {made.agent}): {made.turns} turn(s), {made.steps} step(s); "
            f"turn {made.turn_id} {left}"
        )
    )
    return 0
