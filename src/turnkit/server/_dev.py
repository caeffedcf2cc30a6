"""``turnkit dev``: one agent folder served with its chat page on this machine.

The server binds loopback only and answers loopback clients only, addressed by a
loopback name (no rebound domain) and, for changes, from its own page; it recovers the
turns a previous run left open, so a page that reconnects sees them finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Protocol

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from .._access.authorize import one_person
from .._access.principal import loopback_as
from .._channels.channel import ChannelContext, DeliveringChannel, mount_agent
from .._channels.local_user import LocalUser, local_user
from .._channels.printable import printable
from .._channels.terminal import SOURCE as TERMINAL_SOURCE
from .._engine.agent import Agent
from .._errors import ConfigurationError
from .._runtime.runtime import Runtime
from .._seams.store import Store
from .._seams.tracer import Tracer
from ._app import create_app, recover_quietly
from ._dev_log import TurnLog, configure, log, logged_requests
from ._hosts import LOOPBACK_NAMES
from ._serving import Signals, listen, serve_until, until_started


class ServedChannel(DeliveringChannel, Protocol):
    """A channel that serves its platform's webhooks for an agent (``SlackChannel``):
    ``app(ctx)`` gives the routes its platform calls."""

    def app(self, ctx: ChannelContext) -> ASGIApp: ...


@dataclass(frozen=True, kw_only=True)
class SlackOptions:
    """``turnkit dev --slack``: the Slack channel (made by the command line, which
    reads its secrets) and the port its routes use."""

    port: int = 3000
    channel: ServedChannel


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    """Where ``turnkit dev`` listens, and how it names its store to people."""

    host: str = "127.0.0.1"
    port: int = 8000
    store_label: str = ""
    #: No line per request or per turn ending on stderr.
    quiet: bool = False
    #: Also serve the agent in Slack, on a port of its own (``--slack``).
    slack: SlackOptions | None = None
    #: Traces the runtime's turns (``--otel``); ``None``: nothing is traced.
    tracer: Tracer | None = None
    #: Who the page's loopback clients are: the local user ``turnkit run`` is too.
    user: LocalUser = field(default_factory=local_user)


async def serve_dev(agent: Agent, store: Store, options: DevOptions, *, notice: str | None) -> int:
    """Serve ``agent`` on ``store`` until interrupted; returns the exit status.

    Prints one line with the URL once the server accepts connections (``port=0``
    picks a free port, and the line gives the real one).
    """
    if not _is_loopback(options.host):
        await store.close()
        raise ConfigurationError(
            f"turnkit dev serves loopback addresses only (127.0.0.1, ::1), not "
            f"{options.host!r}; put create_app behind your own server with real "
            "authentication instead"
        )
    try:
        listener = _listen(options.host, options.port)
        slack_listener = (
            _listen(options.host, options.slack.port) if options.slack is not None else None
        )
    except ConfigurationError:
        await store.close()
        raise
    unconfigure = configure(options.quiet)
    stopped = False
    try:
        async with Runtime([agent], store=store, tracer=options.tracer) as runtime:
            await _serve(runtime, listener, agent, options, notice, slack_listener)
    except _Stopped:
        stopped = True  # the turns under way were interrupted; the next start recovers them
    finally:
        unconfigure()
    listener.close()
    if slack_listener is not None:
        slack_listener.close()
    if stopped:
        print("turnkit dev: stopped (SIGTERM)", file=sys.stderr, flush=True)
        _exit_now_if_a_tool_still_runs()
    return 0


class _Stopped(Exception):
    """SIGTERM stopped the server: the runtime closes as on an error, interrupting
    the turns under way (they stay open, and the next start finishes them)."""


def _exit_now_if_a_tool_still_runs() -> None:
    """A local (``def``) tool interrupted by the stop may still run on its thread,
    and Python waits for such threads before a process ends; its turn is recorded
    as unfinished already and its connection closed, so end the process now."""
    main = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate()):
        sys.stdout.flush()
        logging.shutdown()
        os._exit(0)


def _slack_app(runtime: Runtime, agent: Agent, options: SlackOptions) -> Starlette:
    """The Slack routes under ``/slack``, for the port a tunnel points at."""
    app = Starlette()
    # ``turnkit run`` on the same store is the terminal's way in: its policy is expected.
    ctx = mount_agent(
        agent, runtime, channels=[options.channel], served_elsewhere=[TERMINAL_SOURCE]
    )
    app.mount("/slack", options.channel.app(ctx))
    return app


def _by_port(apps: dict[int, ASGIApp]) -> ASGIApp:
    """One ASGI app serving each listening port with its own app: the chat page's
    port never serves Slack's routes, and the Slack port serves nothing else."""

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        app = apps.get(server[1]) if server else None
        if app is None:
            app = next(iter(apps.values()))
        await app(scope, receive, send)

    return dispatch


async def _serve(
    runtime: Runtime,
    listener: socket.socket,
    agent: Agent,
    options: DevOptions,
    notice: str | None,
    slack_listener: socket.socket | None,
) -> None:
    turns = TurnLog()
    unwatch = turns.watch(runtime.sink)
    try:
        # Only this machine's own names: a page that rebinds its domain to 127.0.0.1
        # still sends its own name as the Host, and is refused.
        app = create_app(
            runtime,
            authenticate=loopback_as(options.user),
            # One person's machine: what `turnkit run` opened without an owner is theirs.
            authorize=one_person,
            allowed_hosts=[*LOOPBACK_NAMES, options.host],
            chat_page=True,
            notice=notice,
        )
        served: ASGIApp = app
        listeners = [listener]
        if slack_listener is not None and options.slack is not None:
            served = _by_port(
                {
                    listener.getsockname()[1]: app,
                    slack_listener.getsockname()[1]: _slack_app(runtime, agent, options.slack),
                }
            )
            listeners.append(slack_listener)
        signals = Signals()
        started = asyncio.Event()
        serving = asyncio.ensure_future(
            serve_until(logged_requests(served), listeners, signals.stop, started=started)
        )
        with signals.handling(serving):
            try:
                if await until_started(serving, started):
                    _announce(listener, slack_listener, agent, options, notice)
                    runtime.spawn(_recover(runtime, turns))
                await asyncio.wait({serving})
            finally:
                serving.cancel()  # a no-op unless this task itself was cancelled
        if not signals.cut_short:
            serving.result()  # the server's own failure, if it had one
    finally:
        unwatch()
    if signals.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt  # Ctrl-C: "interrupted", 130, once all is closed
    if signals.stopped_by == signal.SIGTERM:
        raise _Stopped


def _announce(
    listener: socket.socket,
    slack_listener: socket.socket | None,
    agent: Agent,
    options: DevOptions,
    notice: str | None,
) -> None:
    """The lines saying where the server answers, once it does."""
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"turnkit dev: http://{shown}:{port}/ (agent {agent.name}, "
        f"store {options.store_label}, you are {printable(options.user.id)})",
        flush=True,
    )
    if slack_listener is not None:
        slack_port = slack_listener.getsockname()[1]
        print(
            f"turnkit dev: Slack on http://{shown}:{slack_port}/slack/ - point a tunnel "
            "at it and paste https://<tunnel host>/slack/events (Event Subscriptions) "
            "and https://<tunnel host>/slack/interactivity (Interactivity)",
            flush=True,
        )
    if notice:
        print(f"turnkit dev: {notice}", file=sys.stderr, flush=True)


async def _recover(runtime: Runtime, turns: TurnLog) -> None:
    """Finish the turns a previous run left open, their log lines marked recovered."""
    try:
        turns.recovering(r.turn_id for r in await runtime.store.unfinished_turns())
    except Exception as exc:
        log.warning("reading the unfinished turns failed: %s", exc)
    await recover_quietly(runtime)


def _listen(host: str, port: int) -> socket.socket:
    try:
        return listen(host, port)
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False
