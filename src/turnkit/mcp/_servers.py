"""Where an MCP server is: ``stdio(...)`` (a command turnkit starts) or ``http(...)`` (a
Streamable HTTP URL), as typed, checked values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import urlsplit, urlunsplit

from .._errors import ConfigurationError


@dataclass(frozen=True, kw_only=True)
class StdioServer:
    """An MCP server run as a subprocess speaking MCP on its stdin and stdout.

    The process gets a minimal environment (the SDK's allow-list: ``PATH``,
    ``HOME``…) plus ``env``; its stderr is this process's.
    """

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command:
            raise ConfigurationError(
                f"stdio: command must be a non-empty str, got {self.command!r}"
            )
        args = tuple(self.args)
        if not all(isinstance(a, str) for a in args):
            raise ConfigurationError(f"stdio: every argument must be a str, got {args!r}")
        env = dict(self.env)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ConfigurationError("stdio: env must map str names to str values")
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise ConfigurationError(f"stdio: cwd must be a str or None, got {self.cwd!r}")
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "env", MappingProxyType(env))

    @property
    def label(self) -> str:
        """How the server is named by default: its command line (no environment)."""
        return " ".join((self.command, *self.args))


@dataclass(frozen=True, kw_only=True)
class HttpServer:
    """An MCP server reached over Streamable HTTP at ``url``, with ``headers`` (an
    ``Authorization``, say) sent on every request."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or urlsplit(self.url).scheme not in ("http", "https"):
            raise ConfigurationError(
                f"http: url must be an http:// or https:// URL, got {self.url!r}"
            )
        if not urlsplit(self.url).hostname:
            raise ConfigurationError(f"http: url {self.url!r} names no host")
        headers = dict(self.headers)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ConfigurationError("http: headers must map str names to str values")
        object.__setattr__(self, "headers", MappingProxyType(headers))

    @property
    def label(self) -> str:
        """How the server is named by default: its URL without credentials or query."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


McpServer = StdioServer | HttpServer


def stdio(
    command: str, *args: str, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> StdioServer:
    """An MCP server that turnkit starts as ``command args…`` and talks to over stdio."""
    return StdioServer(command=command, args=args, env=env or {}, cwd=cwd)


def http(url: str, *, headers: Mapping[str, str] | None = None) -> HttpServer:
    """An MCP server at a Streamable HTTP ``url``."""
    return HttpServer(url=url, headers=headers or {})


def as_server(server: object) -> McpServer:
    """``server`` as a typed value: a ``stdio``/``http`` value, or a URL string."""
    if isinstance(server, StdioServer | HttpServer):
        return server
    if isinstance(server, str):
        if urlsplit(server).scheme in ("http", "https"):
            return http(server)
        raise ConfigurationError(
            f"mcp_tools({server!r}): a string names a Streamable HTTP URL; for a command "
            "to run, use turnkit.mcp.stdio(command, *args)"
        )
    raise ConfigurationError(
        "mcp_tools needs turnkit.mcp.stdio(...), turnkit.mcp.http(...) or a URL, "
        f"got {type(server).__name__}"
    )
