"""Which ``Host`` and ``Origin`` a request may carry: the defence against DNS
rebinding and cross-site requests.

A page on another site cannot read this server's answers, but it can send
requests, and with DNS rebinding (its own name pointed at 127.0.0.1) its requests
reach a local server as if same-origin. The ``Host`` header still names the
attacker's domain, so a server that answers only the names it is known by refuses
them (421); a state-changing request whose ``Origin`` is another site is refused
too (403), whatever its body looks like.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._errors import ConfigurationError

#: The names of this machine that no DNS answer can make point elsewhere.
LOOPBACK_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
#: Methods that change nothing, so a cross-site one can do no harm by itself.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: str) -> str:
    """The name part of a ``Host`` header (no port, no IPv6 brackets), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _origin(value: str) -> str:
    """``scheme://host[:port]`` of an origin, lower case, as browsers send it."""
    parts = urlsplit(value.strip())
    return f"{parts.scheme}://{parts.netloc}".lower()


def is_ip_literal(name: str) -> bool:
    """Whether ``name`` (from ``host_name``) is an address, not a DNS name. A page can
    rebind only a name it controls, so a request naming an address was sent to that
    address on purpose."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: refuse a ``Host`` that is not one of ``hosts`` (``None``: any
    host; with ``ip_literals``, any address too) and a state-changing request whose
    ``Origin`` is neither the server's own (the ``Host`` it was sent to) nor one of
    ``origins``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: Sequence[str] | None,
        origins: Sequence[str] = (),
        ip_literals: bool = False,
    ) -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(host_name(h) for h in hosts)
        self.origins = frozenset(_origin(o) for o in origins)
        self.ip_literals = ip_literals

    def _answers_to(self, host: str) -> bool:
        if self.hosts is None or "*" in self.hosts:
            return True
        name = host_name(host)
        return name in self.hosts or (self.ip_literals and is_ip_literal(name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self._answers_to(host):
            refusal = _refusal(
                421,
                "misdirected_request",
                "this server does not answer to that Host; open it by the name it listens on",
            )
            await refusal(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and scope["method"] not in _SAFE_METHODS:
            own = _origin(origin) in (f"http://{host}".lower(), f"https://{host}".lower())
            if not own and _origin(origin) not in self.origins:
                refusal = _refusal(
                    403,
                    "cross_origin",
                    "a page of another origin may not change anything here",
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _refusal(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status)


def checked_names(value: Sequence[str] | None, what: str) -> list[str] | None:
    """``allowed_hosts``/``allowed_origins`` as a list of non-empty strings."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigurationError(f"{what} must be a list of non-empty strings, got {value!r}")
    return list(value)
