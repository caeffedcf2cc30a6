"""MCP both ways, with the official ``mcp`` SDK (``turnkit[mcp]``).

``mcp_tools(server)`` gives an ``Agent`` the tools of an MCP server, reached with
``stdio(...)`` or ``http(...)``; ``server(runtime, agent)`` serves an agent's actions
(and, if asked, the agent itself) as MCP tools at ``/mcp`` of ``create_app``. See
docs/mcp.md.
"""

try:
    import mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("turnkit.mcp needs the MCP SDK: pip install 'turnkit[mcp]'") from exc

from ._connection import IDEMPOTENCY_KEY
from ._server import McpEndpoint, server
from ._servers import HttpServer, StdioServer, http, stdio
from ._sessions import McpLimits
from ._tools import McpTools, mcp_tools

__all__ = [
    "IDEMPOTENCY_KEY",
    "HttpServer",
    "McpEndpoint",
    "McpLimits",
    "McpTools",
    "StdioServer",
    "http",
    "mcp_tools",
    "server",
    "stdio",
]
