"""The ``turnkit`` command line: run an agent's turn, list sessions, show one, serve one.

Each subcommand is one ``_add_<name>`` function that declares its arguments and
one ``_<name>(args, progress)`` coroutine that does the work (returning the exit
status), so a new command is two functions and a line in ``_parser``. Errors
print as one line (``turnkit: error: …``) with a non-zero exit, never a
traceback; ``--help`` on each command says what it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager, nullcontext
from importlib import metadata
from pathlib import Path
from typing import Any

from .._assembly.loader import AgentFolder
from .._channels.channel import mount_agent
from .._channels.local_user import USER_ENV, local_user
from .._channels.printable import printable, printable_json
from .._channels.terminal import TerminalChannel
from .._engine.agent import Agent
from .._errors import InvalidAnswerError, TurnkitError
from .._runtime.retention import Retention, prune
from .._runtime.runtime import Runtime
from .._seams.model import Model
from .._seams.store import Store
from .._seams.tracer import Tracer
from .._values.tenancy import Concurrency
from .._values.turns import TurnResult
from ._agent_dir import answer_target, bundled_example, default_session, run_target
from ._cells import add_cells
from ._folder_model import choose_model
from ._logging import log_to_stderr
from ._migrate import add_migrate
from ._otel import otel_tracing
from ._progress import Progress
from ._records import add_console, add_export, add_fork, add_import
from ._render import render_archive, render_session, render_sessions
from ._show import (
    archive_json,
    list_sessions,
    read_archive,
    read_session,
    session_json,
    sessions_json,
    split_target,
    utc,
)
from ._store import (
    DEFAULT_STORE,
    CliError,
    describe_store,
    one_line,
    reading_store,
    writable_store,
)

__all__ = ["DEFAULT_STORE", "main"]

Handler = Callable[[argparse.Namespace, Progress], Coroutine[Any, Any, int]]
STORE_HELP = (
    "a SQLite file path or a PostgreSQL DSN (postgresql://…; pick a schema with "
    "options=-csearch_path=NAME), or several as cells (cells:NAME=postgresql://…,…); "
    f"default: {DEFAULT_STORE}"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnkit",
        description="Durable agent turns: run an agent, and inspect what its store holds.",
    )
    parser.add_argument("--version", action="version", version=f"turnkit {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_answer(commands)
    _add_wake(commands)
    _add_sessions(commands)
    _add_show(commands)
    _add_prune(commands)
    _add_dev(commands)
    _add_worker(commands)
    add_fork(commands, _add_store_option)
    add_export(commands, _add_store_option)
    add_import(commands, _add_store_option)
    add_console(commands, _add_store_option)
    add_migrate(commands, _add_store_option)
    add_cells(commands, _add_store_option)
    return parser


def _version() -> str:
    """The installed distribution's version, from its metadata."""
    try:
        return metadata.version("turnkit")
    except metadata.PackageNotFoundError:
        return "(not installed: no package metadata)"


def _add_store_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--store", default=DEFAULT_STORE, metavar="STORE", help=STORE_HELP)


def _add_otel_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--otel",
        action="store_true",
        help="trace turns with OpenTelemetry (needs turnkit[otel] and opentelemetry-sdk); "
        "spans go where OTEL_TRACES_EXPORTER says: console (the default, on stderr), "
        "otlp (configured by the OTEL_EXPORTER_OTLP_* variables) or none",
    )


def _tracing(args: argparse.Namespace) -> AbstractContextManager[Tracer | None]:
    """The tracer ``--otel`` asks for (``None`` without it: nothing is traced)."""
    return otel_tracing(args.command) if args.otel else nullcontext(None)


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run one turn of an agent, streamed to the terminal",
        description="Run one turn of an agent, streamed to the terminal. If the turn "
        "parks on a question, it is asked at the prompt. You speak as the local user "
        f"(local:LOGIN, or ${USER_ENV}), whom the turnkit dev page serves too.",
    )
    run.add_argument(
        "words",
        nargs="+",
        metavar="[AGENT_DIR] TEXT",
        help="the agent folder (agent.py, instructions.md, tools/; default: the bundled "
        "example) and what to say to the agent, quoted",
    )
    run.add_argument(
        "--session", help="session id (default: cli:AGENT, one per agent: cli:ops for the example)"
    )
    _add_store_option(run)
    _add_otel_option(run)
    run.set_defaults(handler=_run)


def _add_answer(commands: Any) -> None:
    answer = commands.add_parser(
        "answer",
        help="answer the question a session is parked on (no new turn)",
        description="Answer the question a session's turn is parked on, and let that turn "
        "go on to its end; nothing new is said to the agent. Without ANSWER the question "
        "is asked at the prompt (as are any it asks next).",
    )
    answer.add_argument(
        "words",
        nargs="*",
        metavar="[AGENT_DIR] [ANSWER]",
        help="the agent folder (default: the bundled example) and the answer (yes/no for "
        "a yes-or-no question, JSON or text otherwise)",
    )
    answer.add_argument("--session", help="session id (default: cli:AGENT, as turnkit run uses)")
    _add_store_option(answer)
    answer.set_defaults(handler=_answer)


def _add_wake(commands: Any) -> None:
    wake = commands.add_parser(
        "wake",
        help="end a parked turn's wait on the clock now (a sleep, a retry's backoff)",
        description="End the waits on the clock of the turn a session is parked on (its "
        "ctx.sleep, a retry's backoff, a wait the model asked for) now instead of at their "
        "time, and let the turn go on to its end here; questions for people stay open. "
        "Recorded as woken by you (local:<login>, or $TURNKIT_USER).",
    )
    wake.add_argument(
        "folder",
        nargs="?",
        metavar="AGENT_DIR",
        help="the agent folder (default: the bundled example)",
    )
    wake.add_argument("--session", help="session id (default: cli:AGENT, as turnkit run uses)")
    _add_store_option(wake)
    wake.set_defaults(handler=_wake)


def _add_sessions(commands: Any) -> None:
    sessions = commands.add_parser(
        "sessions",
        help="list the sessions in a store, newest first",
        description="List the sessions in a store (id, agent, status, last update in "
        "UTC), most recently updated first.",
    )
    _add_store_option(sessions)
    sessions.add_argument("--agent", help="only the sessions of this agent")
    sessions.add_argument(
        "--limit", type=_positive_int, metavar="N", help="at most N sessions (the newest)"
    )
    sessions.add_argument("--json", action="store_true", help="print a JSON array instead")
    sessions.set_defaults(handler=_sessions)


def _add_show(commands: Any) -> None:
    show = commands.add_parser(
        "show",
        help="show a session: status, transcript, turns and steps, parked input",
        description="Show a session: its status, live transcript, each turn's status "
        "and memoized steps, the input it is parked on, and its archived generations. "
        "SESSION#gN shows the transcript of archived generation N instead.",
    )
    show.add_argument("session", metavar="SESSION", help="a session id, or SESSION#gN")
    _add_store_option(show)
    show.add_argument("--json", action="store_true", help="print one JSON object instead")
    show.set_defaults(handler=_show)


def _add_prune(commands: Any) -> None:
    prune = commands.add_parser(
        "prune",
        help="delete archived generations and idle sessions older than you keep them",
        description="Delete what a store has kept longer than you want: archived "
        "generations (what resets retired) older than --archives-for, and sessions "
        "unused for --sessions-idle-for with nothing queued, running or parked. "
        "Without --apply it only counts. Durations: 90d, 12h, 30m, 45s, or seconds.",
    )
    _add_store_option(prune)
    prune.add_argument("--archives-for", type=_duration, metavar="DURATION")
    prune.add_argument("--sessions-idle-for", type=_duration, metavar="DURATION")
    prune.add_argument(
        "--keep-events-for",
        type=_duration,
        metavar="DURATION",
        help="cut the event log of turns that ended longer ago to their last event",
    )
    prune.add_argument("--apply", action="store_true", help="delete (default: only count)")
    prune.add_argument("--json", action="store_true", help="print one JSON object instead")
    prune.set_defaults(handler=_prune)


_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def _duration(text: str) -> float:
    """Seconds from ``90d``, ``12h``, ``30m``, ``45s`` or a plain number."""
    number, unit = (text[:-1], _UNITS[text[-1]]) if text[-1:] in _UNITS else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90d, 12h, 30m, 45s or seconds, got {text!r}"
        ) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected a duration above zero, got {text!r}")
    return seconds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


# -- run ---------------------------------------------------------------------------


async def _run(args: argparse.Namespace, progress: Progress) -> int:
    del progress  # the turn streams to the terminal: that is its progress
    with _tracing(args) as tracer:  # before the store opens: a missing SDK stops here
        return await _run_turn(args, tracer)


async def _terminal_agent(args: argparse.Namespace, folder_path: Path) -> tuple[Agent, str, Store]:
    """The folder's agent, the session (``--session`` or the agent's default) and the
    opened store, for a command that talks to the agent at this terminal; a session
    of another agent is refused before anything is stored."""
    folder = AgentFolder.read(folder_path)
    session = args.session or default_session(folder.name)
    store = await writable_store(args.store)
    try:
        await _check_owner(store, session, folder.name, given=args.session is not None)
        agent = folder.agent(_model_for(folder))
    except BaseException:
        await store.close()
        raise
    return agent, session, store


async def _run_turn(args: argparse.Namespace, tracer: Tracer | None) -> int:
    target = run_target(args.words)
    terminal = TerminalChannel()  # a bad TURNKIT_USER stops here, before the store opens
    agent, session, store = await _terminal_agent(args, target.folder)
    # A terminal conversation fires no other session's timers: it would run their
    # turns here and make the command wait for them as it ends.
    async with Runtime([agent], store=store, tracer=tracer, timers=False) as runtime:
        await runtime.recover()
        ctx = mount_agent(agent, runtime, channels=[terminal])
        result = await terminal.converse(ctx, target.text, session=session)
    return _turn_status(result, session)


async def _answer(args: argparse.Namespace, progress: Progress) -> int:
    del progress
    target = answer_target(args.words)
    terminal = TerminalChannel()
    agent, session, store = await _terminal_agent(args, target.folder)
    async with Runtime([agent], store=store, timers=False) as runtime:
        ctx = mount_agent(agent, runtime, channels=[terminal])
        try:
            result = await terminal.answer(ctx, session=session, given=target.answer)
        except (ValueError, InvalidAnswerError) as exc:
            raise CliError(f"the answer {target.answer!r} does not do: {exc}") from None
    if result is None:
        raise CliError(f"session {session!r} is not waiting for an answer")
    return _turn_status(result, session)


async def _wake(args: argparse.Namespace, progress: Progress) -> int:
    del progress
    user = local_user()  # a bad TURNKIT_USER stops here, before the store opens
    folder = Path(args.folder) if args.folder is not None else bundled_example()
    agent, session_id, store = await _terminal_agent(args, folder)
    async with Runtime([agent], store=store, timers=False) as runtime:
        session = runtime.session(agent.name, session_id)
        parked = await session.pending()
        if parked is None or not await session.wake(parked.turn_id, by=user.id):
            raise CliError(f"session {session_id!r} is not waiting on the clock")
        result = await session.result(parked.turn_id)
    print(printable(f"woke turn {result.turn_id}: {result.status}"))
    if result.status == "completed" and result.text:
        print(printable(result.text))
    return _turn_status(result, session_id)


def _turn_status(result: TurnResult, session: str) -> int:
    """The exit status of a turn the terminal showed, saying why it is not 0."""
    if result.status == "suspended" and result.request and result.request.kind == "timer":
        until = result.request.expires_at
        when = utc(until) if until is not None else "its time"
        print(
            printable(
                f"turnkit: the turn is waiting on the clock until {when}; a process serving "
                f"the store (turnkit dev, a worker) runs it on then, or end the wait now with "
                f"turnkit wake --session {shlex.quote(session)}"
            ),
            file=sys.stderr,
        )
        return 3
    if result.status == "suspended":
        print(
            printable(
                f"turnkit: the turn is still waiting for an answer; run turnkit answer "
                f"--session {shlex.quote(session)} to answer it"
            ),
            file=sys.stderr,
        )
        return 3
    if result.status != "completed":
        why = printable(f"{result.error or result.reason}")
        print(f"turnkit: turn {result.status}: {why}", file=sys.stderr)
        return 1
    return 0


async def _check_owner(store: Store, session: str, agent: str, *, given: bool) -> None:
    """Refuse, before anything is stored, a session that another agent opened: session
    ids are one namespace in a store."""
    owner = (await store.session(session).load(from_index=_NO_MESSAGES)).agent
    if owner is None or owner == agent:
        return
    fix = (
        f"name another with --session, or leave it out for {default_session(agent)!r}"
        if given
        else "name another with --session"
    )
    raise CliError(f"session {session!r} belongs to agent {owner!r}, not {agent!r}; {fix}")


#: A transcript position past any session's end: ``load`` then reads no messages.
_NO_MESSAGES = 2**31 - 1  # the largest index every store takes (PostgreSQL: integer)


def _model_for(folder: AgentFolder) -> Model | None:
    """The model to run (see ``choose_model``), saying on stderr which it is."""
    chosen = choose_model(folder)
    if chosen.note:
        print(printable(f"turnkit: {chosen.note}"), file=sys.stderr)
    return chosen.model


# -- dev ---------------------------------------------------------------------------


def _add_dev(commands: Any) -> None:
    dev = commands.add_parser(
        "dev",
        help="serve an agent's chat page and HTTP API on this machine",
        description="Serve an agent's chat page and HTTP API on 127.0.0.1, answering "
        "only clients on this machine. With no folder, the bundled example agent. "
        "With no model configured, the agent's offline demo model (the page says so). "
        "Turns a previous run left open are finished at start-up. Its clients are "
        f"you: the local user turnkit run speaks as too (local:LOGIN, or ${USER_ENV}).",
    )
    dev.add_argument("agent_dir", nargs="?", help="the agent folder (default: the bundled example)")
    _add_store_option(dev)
    dev.add_argument("--host", default="127.0.0.1", help="a loopback address (default: 127.0.0.1)")
    dev.add_argument(
        "--port", type=_port, default=8000, help="the port (default: 8000; 0 picks a free one)"
    )
    dev.add_argument(
        "--quiet",
        action="store_true",
        help="no line on stderr per request and per turn ending",
    )
    dev.add_argument(
        "--slack",
        action="store_true",
        help="also serve the agent in Slack (needs turnkit[slack], SLACK_SIGNING_SECRET and "
        "SLACK_BOT_TOKEN), on a port of its own for your tunnel; prints the URLs to paste",
    )
    dev.add_argument(
        "--slack-port",
        type=_port,
        default=3000,
        help="the port of the Slack routes (default: 3000; 0 picks a free one)",
    )
    _add_otel_option(dev)
    dev.set_defaults(handler=_dev)


async def _dev(args: argparse.Namespace, progress: Progress) -> int:
    del progress  # the server prints its URL when it is ready
    try:
        from ..server.local import DevOptions, serve_dev
    except ImportError as exc:
        raise CliError(
            f"turnkit dev needs the server extra: pip install 'turnkit[server]' ({exc})"
        ) from None
    slack = _slack_options(args) if args.slack else None
    user = local_user()  # a bad TURNKIT_USER stops here, before anything opens
    folder = AgentFolder.read(args.agent_dir or bundled_example())
    chosen = choose_model(folder)
    agent = folder.agent(chosen.model)
    with _tracing(args) as tracer:
        store = await writable_store(args.store)
        options = DevOptions(
            host=args.host,
            port=args.port,
            store_label=describe_store(args.store),
            quiet=args.quiet,
            slack=slack,
            tracer=tracer,
            user=user,
        )
        note = chosen.note and chosen.note[0].upper() + chosen.note[1:] + "."
        return await serve_dev(agent, store, options, notice=note)


def _slack_options(args: argparse.Namespace) -> Any:
    """What ``turnkit dev --slack`` needs, from the environment (never the command
    line, which other users of the machine can read)."""
    try:
        from ..server.local import SlackOptions
        from ..slack import slack_channel
    except ImportError as exc:
        raise CliError(f"turnkit dev --slack needs: pip install 'turnkit[slack]' ({exc})") from None
    missing = [n for n in ("SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN") if not os.environ.get(n)]
    if missing:
        raise CliError(
            f"turnkit dev --slack needs {' and '.join(missing)} in the environment "
            "(the app's signing secret and bot token; see docs/slack.md)"
        )
    channel = slack_channel(
        signing_secret=os.environ["SLACK_SIGNING_SECRET"],
        bot_token=os.environ["SLACK_BOT_TOKEN"],
        base_url=os.environ.get("SLACK_API_URL") or "https://slack.com/api/",
    )
    return SlackOptions(port=args.slack_port, channel=channel)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


# -- worker ------------------------------------------------------------------------


def _add_worker(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="run the turns a shared PostgreSQL store holds (a deployment's worker)",
        description="Run the turns of the given agents that a shared PostgreSQL store "
        "holds, with any number of other workers on any hosts: HTTP nodes store the "
        "turns, workers claim and run them, one worker at a time per session. SIGTERM "
        "stops it gracefully (no new claims; turns under way finish or are handed back).",
    )
    worker.add_argument(
        "agent_dirs", nargs="+", metavar="AGENT_DIR", help="the agent folders whose turns it runs"
    )
    worker.add_argument(
        "--store", required=True, metavar="DSN", help="the PostgreSQL DSN (postgresql://…)"
    )
    worker.add_argument(
        "--concurrency",
        type=_positive_int,
        default=32,
        metavar="N",
        help="sessions it runs at once (default: 32)",
    )
    worker.add_argument(
        "--poll",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how often it looks for turns nobody announced, such as a dead worker's (default: 1)",
    )
    worker.add_argument(
        "--grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long turns under way may finish before they are handed "
        "back (default: 30)",
    )
    worker.add_argument(
        "--serve-versions",
        type=_versions,
        metavar="V1,V2",
        help="take only the turns recorded under these agent versions (comma-separated; "
        "turns recorded without a version are taken too); default: every version. "
        "Old and new workers then share one store during a deploy (docs/deploying.md)",
    )
    worker.add_argument(
        "--per-tenant",
        type=int,
        metavar="N",
        help="run at most N sessions of one tenant at once, across every worker given "
        "the same cap (docs/tenants.md); default: no cap",
    )
    worker.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long this worker may go silent (paused, cut off) before PostgreSQL "
        "frees its sessions for other workers: the idle_session_timeout of its lock "
        "connection, which it pings meanwhile (default: 10)",
    )
    worker.add_argument(
        "--pool-size",
        type=_positive_int,
        default=10,
        metavar="N",
        help="the most connections each of its two pools opens (event loop, local "
        "tools): a worker holds up to 2N + 5 connections (default: 10)",
    )
    worker.add_argument(
        "--ops-port",
        type=_port,
        metavar="PORT",
        help="serve /healthz, /readyz and Prometheus /metrics on this port "
        "(needs turnkit[metrics]; no authentication: keep it on a private network)",
    )
    worker.add_argument(
        "--ops-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --ops-port listens on (default: 127.0.0.1; 0.0.0.0 for all)",
    )
    worker.add_argument(
        "--ops-allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name the ops port answers to besides addresses and loopback names "
        "(repeatable; any other Host is refused with 421)",
    )
    retention = worker.add_argument_group(
        "retention",
        "what the worker deletes as it ages (one worker per store does it, elected; "
        "see turnkit prune)",
    )
    retention.add_argument("--archives-for", type=_duration, metavar="DURATION")
    retention.add_argument("--sessions-idle-for", type=_duration, metavar="DURATION")
    retention.add_argument("--keep-events-for", type=_duration, metavar="DURATION")
    retention.add_argument(
        "--prune-every",
        type=_duration,
        default=3600.0,
        metavar="DURATION",
        help="how often the elected worker prunes (default: 1h)",
    )
    worker.set_defaults(handler=_worker)


async def _worker(args: argparse.Namespace, progress: Progress) -> int:
    del progress
    from ._open import is_shared_store
    from ._worker import WorkerOptions, serve_worker

    if not is_shared_store(args.store):
        raise CliError(
            f"turnkit worker needs a PostgreSQL store (postgresql://…, or cells:…), not "
            f"{args.store!r}: workers on many hosts share one database"
        )
    agents = []
    for path in args.agent_dirs:
        folder = AgentFolder.read(path)
        chosen = choose_model(folder)
        if chosen.note:
            print(printable(f"turnkit: {folder.name}: {chosen.note}"), file=sys.stderr)
        agents.append(folder.agent(chosen.model))
    from ..stores import Takeover

    takeover = Takeover(idle_timeout=args.idle_timeout, heartbeat=min(2.0, args.idle_timeout / 4))
    store = await writable_store(args.store, takeover=takeover, pool_size=args.pool_size)
    options = WorkerOptions(
        concurrency=args.concurrency,
        poll=args.poll,
        grace=args.grace,
        store_label=describe_store(args.store),
        retention=_retention(args),
        serve_versions=args.serve_versions,
        tenants=Concurrency(per_tenant=args.per_tenant),
    )
    hooks = []
    if args.ops_port is not None:
        from ._ops_port import ops_port

        try:
            hooks.append(ops_port(args.ops_host, args.ops_port, args.ops_allowed_host))
        except ImportError as exc:
            raise CliError(str(exc)) from None
    return await serve_worker(agents, store, options, hooks)


def _versions(text: str) -> frozenset[str]:
    """``--serve-versions``: comma-separated agent versions, none empty."""
    versions = [v.strip() for v in text.split(",")]
    if not text.strip() or any(not v for v in versions):
        raise argparse.ArgumentTypeError(
            f"expected agent versions separated by commas (v1,v2), got {text!r}"
        )
    return frozenset(versions)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {text!r}")
    return value


# -- sessions and show -------------------------------------------------------------


async def _sessions(args: argparse.Namespace, progress: Progress) -> int:
    async with reading_store(args.store) as store:
        found = await list_sessions(store, agent=args.agent, limit=args.limit, progress=progress)
    progress.done()
    print(_json(sessions_json(found)) if args.json else render_sessions(found))
    return 0


def _retention(args: argparse.Namespace) -> Retention | None:
    """The retention the command's duration options ask for (``None``: none given)."""
    wanted = (args.archives_for, args.sessions_idle_for, args.keep_events_for)
    if all(duration is None for duration in wanted):
        return None
    return Retention(
        archives_for=args.archives_for,
        sessions_idle_for=args.sessions_idle_for,
        keep_events_for=args.keep_events_for,
        every=getattr(args, "prune_every", 3600.0),
    )


async def _prune(args: argparse.Namespace, progress: Progress) -> int:
    keep = _retention(args)
    if keep is None:
        raise CliError(
            "say what to prune: --archives-for, --sessions-idle-for and/or --keep-events-for"
        )
    async with reading_store(args.store) as store:
        report = await prune(store, keep, apply=args.apply)
    progress.done()
    if args.json:
        print(_json(dataclasses.asdict(report)))
        return 0
    did = "deleted" if report.applied else "would delete (run again with --apply)"
    print(
        f"{describe_store(args.store)}: {did}: {report.generations} archived "
        f"generation(s), {report.sessions} idle session(s), the early events of "
        f"{report.trimmed} ended turn(s); {report.kept} kept (used "
        f"again); {report.seconds:.2f}s, longest lock {report.longest_hold * 1000:.1f} ms"
    )
    return 0


async def _show(args: argparse.Namespace, progress: Progress) -> int:
    session_id, generation = split_target(args.session)
    where = describe_store(args.store)
    async with reading_store(args.store) as store:
        if generation is None:
            view = await read_session(store, session_id, progress, where=where)
            flag = _flag(args)
            output = (
                _json(session_json(view, where))
                if args.json
                else render_session(view, store=where, store_flag=flag, you=local_user().names)
            )
        else:
            archive = await read_archive(store, session_id, generation, progress, where=where)
            output = (
                _json(archive_json(archive, where))
                if args.json
                else render_archive(archive, store=where)
            )
    progress.done()
    print(output)
    return 0


def _flag(args: argparse.Namespace) -> str:
    """The ``--store`` to repeat in the commands ``show`` suggests (none if default)."""
    if args.store == DEFAULT_STORE:
        return ""
    return f" --store {shlex.quote(describe_store(args.store))}"


def _json(value: object) -> str:
    """Exact JSON; the few characters JSON leaves raw that a terminal would act on
    are written as ``\\u`` escapes (the same value to any JSON reader)."""
    return printable_json(json.dumps(value, ensure_ascii=False, indent=2))


# -- entry point -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    progress_line = Progress()  # erased before any error is printed
    unlog = log_to_stderr(tracebacks=args.command in ("dev", "worker"))
    try:
        return asyncio.run(handler(args, progress_line))
    except (CliError, TurnkitError) as exc:
        return _fail(progress_line, one_line(str(exc)), 2)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            return _stdout_closed()
        return _fail(progress_line, one_line(str(exc)), 2)
    except EOFError:
        print("turnkit: no answer given; the turn waits for one on the next run", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        progress_line.done()
        after = "; the turn resumes on the next run" if args.command == "run" else ""
        print(f"turnkit: interrupted{after}", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("TURNKIT_DEBUG"):
            raise
        what = one_line(f"{type(exc).__name__}: {exc}")
        return _fail(progress_line, f"{what} (set TURNKIT_DEBUG=1 for the traceback)", 1)
    finally:
        unlog()


def _fail(progress: Progress, message: str, status: int) -> int:
    progress.done()
    print(printable(f"turnkit: error: {message}"), file=sys.stderr)
    return status


def _stdout_closed() -> int:
    """``turnkit show … | head``: the reader left; exit quietly, not with a traceback
    when Python flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1
