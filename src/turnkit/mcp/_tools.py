"""``mcp_tools(server)``: an MCP server's tools as a tool source of an ``Agent``.

The tools are listed when a turn opens and stored with it (see ``ToolSource``).
Every call is a remote tool: at-least-once, its ``ctx.idempotency_key`` sent in
the request's ``_meta`` under ``IDEMPOTENCY_KEY``. How a call can end:

- a result: what the model reads (structured content if the server gave some,
  else the text, else the content blocks);
- an ``isError`` result, a JSON-RPC error, or a server that could not be reached
  (so nothing ran): an error result the model reads;
- the connection lost or the answer late once the request was sent: whether it
  ran is unknown, so the step fails the turn unrecorded, and delivering the turn
  again calls once more with the same key (for the server to deduplicate on).

While a ``Runtime`` holds the source open (``open``/``close``), its listings and
calls share one connection per event loop (see ``_connection``); a call known never
to have reached the tool goes once more on a new one.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pydantic
from jsonschema import ValidationError
from mcp import Client, MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    TextContent,
)
from mcp.types import Tool as McpTool

from .._engine.tools import TOOL_NAME, Tool
from .._errors import ConfigurationError, FatalToolError
from .._seams.model import ToolSpec
from .._values.listed_tools import ListedTool
from ._connection import IDEMPOTENCY_KEY, Connection, Connections, Unreachable, reason
from ._servers import McpServer, as_server

if TYPE_CHECKING:
    from .._engine.context import ToolContext

log = logging.getLogger("turnkit.mcp")

#: Most pages of ``tools/list`` read from one server (a paginator that never ends
#: cannot hang a turn).
_MAX_PAGES = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: JSON-RPC errors that mean no answer came, rather than that the server refused.
_NO_ANSWER = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})


@dataclass(frozen=True, kw_only=True)
class McpTools:
    """The tools of one MCP server, as a tool source: put it in ``Agent(tools=[…])``.

    Build it with ``mcp_tools(...)``. ``key`` names the server in what each turn
    stores; ``prefix`` goes before every tool name the model sees. A ``Runtime``
    opens it (one shared connection per event loop) and closes it.
    """

    server: McpServer
    key: str
    prefix: str = ""
    #: Seconds a call (or a listing) may wait for its answer.
    timeout: float = 60.0
    #: Seconds to start or reach the server and finish the handshake.
    connect_timeout: float = 30.0
    _connections: Connections = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        connections = Connections(
            self.server, connect_timeout=self.connect_timeout, call_timeout=self.timeout
        )
        object.__setattr__(self, "_connections", connections)

    async def list_tools(self) -> Sequence[ListedTool]:
        """Ask the server for its tools, every page of them (once more on a new
        connection if the one used was lost: listing changes nothing)."""
        failure: BaseException | None = None
        for attempt in range(2):
            try:
                async with self._connections.connection() as conn:
                    client = await conn.client()
                    try:
                        async with asyncio.timeout(self.timeout):
                            return await self._pages(client)
                    except TimeoutError:
                        failure = TimeoutError(f"no tool list within {self.timeout:g}s")
                    except Exception as exc:
                        failure = exc
                        if _no_answer(exc) or conn.lost:
                            conn.lost = True
                            if attempt == 0:
                                continue
            except Unreachable as exc:
                raise ConnectionError(
                    f"MCP server {self.key!r} could not be reached: {exc}"
                ) from None
            break
        assert failure is not None
        raise Exception(f"MCP server {self.key!r}: {reason(failure)}") from None

    async def _pages(self, client: Client) -> list[ListedTool]:
        found: list[ListedTool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            found += [t for t in map(self._listed, page.tools) if t is not None]
            cursor = page.next_cursor
            if not cursor:
                break
        return found

    def bind(self, listed: ListedTool) -> Tool:
        """A remote tool calling ``listed.target`` on this server."""
        spec = ToolSpec(
            name=listed.name, description=listed.description, input_schema=listed.input_schema
        )
        target = listed.target

        async def run(data: Any, ctx: ToolContext) -> Any:
            return await self.call(target, data, ctx.idempotency_key)

        return Tool(spec, run, needs_store=False)

    async def call(self, target: str, arguments: Any, idempotency_key: str) -> Any:
        """Call the tool ``target`` once; see the module docstring for how it ends.

        A call known never to have reached the tool (its connection was lost before
        it was sent, the server refused the TCP connection or a session it no longer
        knows) goes once more on a new connection; one sent on a connection that is
        then lost is an unknown outcome.
        """
        for attempt in range(2):
            try:
                async with self._connections.connection() as conn:
                    client = await conn.client()
                    try:
                        result = await self._send(client, target, arguments, idempotency_key)
                    except Exception as exc:
                        if _never_sent(conn, idempotency_key):
                            conn.lost = True
                            if attempt == 0:
                                continue
                            raise ConnectionError(
                                f"MCP server {self.key!r} could not be reached: {reason(exc)}"
                            ) from None
                        if _no_answer(exc):
                            conn.lost = True  # later calls go on a new connection
                        raise self._failure(target, exc) from None
            except Unreachable as exc:
                raise ConnectionError(
                    f"MCP server {self.key!r} could not be reached: {exc}"
                ) from None
            return _read(result)
        raise AssertionError("unreachable")  # pragma: no cover

    async def open(self) -> None:
        """Share one connection to the server on the running loop (opened at the first
        listing or call) until ``close``: a ``Runtime`` calls both."""
        self._connections.hold()

    async def close(self) -> None:
        """Undo one ``open``; the last one closes the loop's connection (a stdio
        server's process ends with it)."""
        await self._connections.release()

    async def _send(
        self, client: Client, target: str, arguments: Any, idempotency_key: str
    ) -> CallToolResult:
        meta = cast(Any, {IDEMPOTENCY_KEY: idempotency_key})
        async with asyncio.timeout(self.timeout + 5.0):
            return await client.call_tool(target, arguments, meta=meta)

    def _failure(self, target: str, exc: Exception) -> Exception:
        """What a call that was sent and then raised ``exc`` becomes."""
        if isinstance(exc, MCPError) and exc.code not in _NO_ANSWER:
            return Exception(
                f"MCP server {self.key!r} answered {target!r} with error {exc.code}: {exc.message}"
            )
        if isinstance(exc, pydantic.ValidationError) or _bad_structured_content(exc):
            # An answer came, one the SDK could not accept: the server's to fix.
            return Exception(f"MCP server {self.key!r} answered {target!r} wrongly: {exc}")
        if isinstance(exc, TimeoutError):
            return self._unknown(target, f"no answer within {self.timeout:g}s")
        return self._unknown(target, reason(exc))

    def _unknown(self, target: str, why: str) -> FatalToolError:
        return FatalToolError(
            f"MCP server {self.key!r} gave no answer to the call of {target!r} ({why}); "
            "whether it ran is unknown, so the step was not recorded: deliver the turn "
            "again to call it once more with the same idempotency key"
        )

    def _listed(self, tool: McpTool) -> ListedTool | None:
        """The listed form of one MCP tool; ``None`` (logged) for a name no model takes."""
        name = self.prefix + _UNSAFE.sub("_", tool.name)
        if not TOOL_NAME.match(name):
            log.warning(
                "MCP server %r: tool %r is not offered: %r is not a name models accept",
                self.key,
                tool.name,
                name,
            )
            return None
        return ListedTool(
            source=self.key,
            name=name,
            description=tool.description or tool.title or tool.name,
            input_schema=dict(tool.input_schema),
            target=tool.name,
        )


def _no_answer(exc: Exception) -> bool:
    """Whether ``exc`` means the connection was lost (not a refusal by the server)."""
    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return not isinstance(exc, pydantic.ValidationError | TimeoutError | RuntimeError)


def _never_sent(conn: Connection, idempotency_key: str) -> bool:
    """Whether the call certainly never reached the tool (see ``_connection``)."""
    return idempotency_key in conn.unsent


def _bad_structured_content(exc: Exception) -> bool:
    """The SDK's ``RuntimeError`` for a result that breaks the tool's output schema:
    told by its cause, the schema's ``ValidationError``, not by its words."""
    return isinstance(exc, RuntimeError) and isinstance(exc.__cause__, ValidationError)


def _read(result: CallToolResult) -> Any:
    """What the model reads of a result; an ``isError`` one raises its text."""
    if result.is_error:
        # A plain Exception: the model reads the server's text as it is.
        raise Exception(_text(result) or "the tool reported an error and said nothing more")
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(block, TextContent) for block in result.content):
        return _text(result)
    return [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]


def _text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def mcp_tools(
    server: object,
    *,
    name: str | None = None,
    prefix: str = "",
    timeout: float = 60.0,
    connect_timeout: float = 30.0,
) -> McpTools:
    """The tools of the MCP server ``server`` (``stdio(...)``, ``http(...)`` or a URL),
    for ``Agent(tools=[…])``.

    ``name`` is the key stored with each turn's tools (default: the URL or the
    command line); ``prefix`` is put before each tool's name, to keep two servers'
    tools apart. ``timeout`` bounds each call and listing, ``connect_timeout`` the
    start of the server and the handshake.
    """
    target = as_server(server)
    key = name if name is not None else f"mcp:{target.label}"
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"mcp_tools: name must be a non-empty str, got {name!r}")
    if not isinstance(prefix, str) or (prefix and not TOOL_NAME.match(prefix)):
        raise ConfigurationError(
            f"mcp_tools: prefix {prefix!r} must be letters, digits, '_' or '-' (at most 64)"
        )
    for what, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigurationError(f"mcp_tools: {what} must be a positive number, got {value!r}")
    return McpTools(
        server=target,
        key=key,
        prefix=prefix,
        timeout=float(timeout),
        connect_timeout=float(connect_timeout),
    )
