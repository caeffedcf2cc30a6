"""``turnkit fork``, ``export`` and ``import``: a session's history copied into a new
session, written to a file, or read back from one.

The work is ``turnkit._runtime.forking`` and ``turnkit._runtime.exported``, through
the store seam; this module only reads the arguments and says what was made.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._channels.printable import printable, printable_json
from .._runtime.exported import export_session, import_session
from .._runtime.forking import fork_session
from ._progress import Progress
from ._show import split_target
from ._store import CliError, StoreOption, describe_store, reading_store, writable_store


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


def add_export(commands: Any, store_option: StoreOption) -> None:
    export = commands.add_parser(
        "export",
        help="write a session (transcript, turns, steps, events) as JSON",
        description="Write SESSION's live generation (or SESSION#gN, an archived one) as "
        "one versioned JSON object on stdout: what turnkit import stores again and "
        "turnkit.testing.replay plays back. Redirect it to a file: turnkit export s1 > s1.json",
    )
    export.add_argument("session", metavar="SESSION", help="a session id, or SESSION#gN")
    store_option(export)
    export.set_defaults(handler=export_command)


async def export_command(args: argparse.Namespace, progress: Progress) -> int:
    session_id, generation = split_target(args.session)
    async with reading_store(args.store) as store:
        progress.update(f"reading {args.session}…", force=True)
        exported = await export_session(store, session_id, generation)
    progress.done()
    print(json.dumps(exported, ensure_ascii=False, indent=1))
    return 0


def add_import(commands: Any, store_option: StoreOption) -> None:
    imported = commands.add_parser(
        "import",
        help="store a session turnkit export wrote",
        description="Store the session in FILE (written by turnkit export; - reads "
        "stdin). An existing session of that id is refused unless --replace, which "
        "archives its live generation first (as a reset does). A file that is not such "
        "a session is refused, naming the first wrong field, before anything is stored.",
    )
    imported.add_argument("file", metavar="FILE", help="the exported JSON, or - for stdin")
    imported.add_argument("--as", dest="as_id", metavar="SESSION", help="store it under this id")
    imported.add_argument(
        "--replace",
        action="store_true",
        help="replace an existing session of that id (its live generation is archived)",
    )
    store_option(imported)
    imported.set_defaults(handler=import_command)


async def import_command(args: argparse.Namespace, progress: Progress) -> int:
    name = "stdin" if args.file == "-" else repr(args.file)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {name}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{name} is not JSON: {exc}") from None
    store = await writable_store(args.store)
    try:
        progress.update("importing…", force=True)
        made = await import_session(store, data, session_id=args.as_id, replace=args.replace)
    finally:
        await store.close()
    progress.done()
    archived = (
        f"; its earlier live generation is archived as {made.session_id}#g"
        f"{made.archived_generation}"
        if made.archived_generation is not None
        else ""
    )
    print(
        printable(
            f"imported {made.session_id} into {describe_store(args.store)}: "
            f"{made.messages} message(s), {made.turns} turn(s), {made.steps} step(s), "
            f"{made.events} event(s){archived}"
        )
    )
    return 0


def add_console(commands: Any, store_option: StoreOption) -> None:
    console = commands.add_parser(
        "console",
        help="serve the operator console for a store on this machine",
        description="Serve the operator console on 127.0.0.1, answering only clients on "
        "this machine: every session of the store, filterable by agent, status and age; a "
        "turn's timeline beside its transcript; live queued and running turns; and cancel, "
        "answer, reset, retry and erase for the sessions of the agents given (without "
        "AGENT_DIR, read only). On SQLite a retried turn runs in this process; on "
        "PostgreSQL it is stored for the workers.",
    )
    console.add_argument("agent_dirs", nargs="*", metavar="AGENT_DIR", help="agent folders")
    store_option(console)
    console.add_argument("--host", default="127.0.0.1", help="a loopback address")
    console.add_argument("--port", type=int, default=8377, help="the port (0: a free one)")
    console.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's Prometheus /metrics URL (its --ops-port), whose step latencies "
        "and takeovers the live view sums (repeatable)",
    )
    console.set_defaults(handler=console_command)


async def console_command(args: argparse.Namespace, progress: Progress) -> int:
    del progress
    try:
        from ..server.local import serve_console
    except ImportError as exc:
        raise CliError(f"turnkit console needs: pip install 'turnkit[server]' ({exc})") from None
    from .._assembly.loader import AgentFolder
    from .._channels.local_user import local_user
    from .._runtime.client import RuntimeClient
    from .._runtime.runtime import Runtime
    from ._folder_model import choose_model
    from ._open import is_shared_store
    from ._store import check_store_exists

    user = local_user()
    agents = []
    for folder_path in args.agent_dirs:
        folder = AgentFolder.read(folder_path)
        agents.append(folder.agent(choose_model(folder).model))
    await check_store_exists(args.store)
    store = await writable_store(args.store)
    # On a shared store (PostgreSQL, cells) the workers run what the console stores;
    # on a file, this process.
    runtime = (
        RuntimeClient(agents, store=store)
        if is_shared_store(args.store)
        else Runtime(agents, store=store)
    )
    return await serve_console(
        runtime,
        host=args.host,
        port=args.port,
        store_label=describe_store(args.store),
        user=user,
        metrics=args.metrics,
    )
