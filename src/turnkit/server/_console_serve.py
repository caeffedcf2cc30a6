"""``turnkit console``: the operator console served alone on this machine.

Like ``turnkit dev`` it binds a loopback address and answers loopback clients only,
addressed by a loopback name; the person at this machine is the operator, who may
see and act on every session of the store (``authorize`` allows all to them).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Sequence

from .._access.authorize import SessionAccess
from .._access.principal import Principal, loopback_as
from .._channels.local_user import LocalUser
from .._channels.printable import printable
from .._runtime.client import RuntimeClient
from ._console import Console, console_app
from ._dev import _listen
from ._hosts import LOOPBACK_NAMES
from ._serving import Signals, serve_until, until_started


def operator(principal: Principal, access: SessionAccess) -> bool:
    """The console's rule on one's own machine: the loopback caller (already
    authenticated as the local user) may see and act on every session."""
    return True


async def serve_console(
    runtime: RuntimeClient,
    *,
    host: str,
    port: int,
    store_label: str,
    user: LocalUser,
    metrics: Sequence[str] = (),
) -> int:
    """Serve until SIGINT or SIGTERM; print the URL once listening."""
    listener: socket.socket = _listen(host, port)
    app = console_app(
        runtime,
        authenticate=loopback_as(user),
        authorize=operator,
        allowed_hosts=[*LOOPBACK_NAMES, host],
        own_runtime=True,
        console=Console(metrics=metrics),
    )
    signals = Signals()
    started = asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(app, [listener], signals.stop, started=started, lifespan=True)
    )
    with signals.handling(serving):
        try:
            if await until_started(serving, started):
                bound, port = listener.getsockname()[:2]
                shown = f"[{bound}]" if ":" in bound else bound
                agents = ", ".join(sorted(runtime.agents)) or "none: read only"
                print(
                    f"turnkit console: http://{shown}:{port}/ (store {store_label}, "
                    f"agents {agents}, you are {printable(user.id)})",
                    flush=True,
                )
            await asyncio.wait({serving})
        finally:
            serving.cancel()  # a no-op unless this task itself was cancelled
            listener.close()
    if not signals.cut_short:
        serving.result()  # the server's own failure (the runtime did not open, say)
    if signals.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt
    return 0
