"""``turnkit dev``: one agent folder served with its chat page on this machine.

The server binds loopback only and answers loopback clients only; it recovers the
turns a previous run left open, so a page that reconnects sees them finish.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from .._errors import ConfigurationError
from .._loader import AgentFolder
from .._model import Model
from .._runtime import Runtime
from ..models import demo_model
from ..models._env import configured
from ..stores import open_store
from ._app import create_app, recover_quietly
from ._principal import loopback_only

log = logging.getLogger("turnkit.dev")

#: The example agent of a source checkout, served when no folder is named.
BUNDLED_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ops"
DEMO_NOTICE = (
    "No model is configured (set ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL or "
    "TURNKIT_MODEL): this is the agent's offline demo model."
)


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    """What ``turnkit dev`` was asked for."""

    agent_dir: str | None = None
    store: str = ".turnkit/sessions.db"
    host: str = "127.0.0.1"
    port: int = 8000


def serve_dev(options: DevOptions) -> int:
    """Serve until interrupted; returns the exit code."""
    if not _is_loopback(options.host):
        raise ConfigurationError(
            f"turnkit dev serves loopback addresses only (127.0.0.1, ::1), not {options.host!r}; "
            "put create_app behind your own server with real authentication instead"
        )
    asyncio.run(_serve(options))
    return 0


async def _serve(options: DevOptions) -> None:
    folder = AgentFolder.read(_agent_dir(options.agent_dir))
    model, notice = pick_model(folder)
    agent = folder.agent(model)
    listener = _listen(options.host, options.port)
    async with Runtime([agent], store=open_store(options.store)) as runtime:
        app = create_app(runtime, authenticate=loopback_only, chat_page=True, notice=notice)
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started:
            host, port = listener.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(
                f"turnkit dev: http://{shown}:{port}/ (agent {agent.name}, store {options.store})",
                flush=True,
            )
            if notice:
                print(f"turnkit dev: {notice}", file=sys.stderr, flush=True)
            recovering = runtime.spawn(recover_quietly(runtime))
        await serving
        if server.started:
            recovering.cancel()


def pick_model(folder: AgentFolder) -> tuple[Model | None, str | None]:
    """The model to run and a notice for people: the folder's own model, else the
    environment's, else the folder's (or the generic) offline demo model."""
    if folder.model is not None:
        return None, None
    found = configured()
    if found is not None:
        model, choice = found
        return model, f"Model: {choice.label} ({choice.because})."
    return (None if folder.demo_model is not None else demo_model()), DEMO_NOTICE


def _agent_dir(given: str | None) -> Path:
    if given is not None:
        return Path(given)
    if not BUNDLED_EXAMPLE.is_dir():
        raise ConfigurationError(
            "this installation has no bundled example agent; name an agent folder: "
            "turnkit dev path/to/agent"
        )
    return BUNDLED_EXAMPLE


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        from ipaddress import ip_address

        return ip_address(host).is_loopback
    except ValueError:
        return False
