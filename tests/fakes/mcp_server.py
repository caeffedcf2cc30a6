"""A small MCP server for the tests, built with the official SDK's ``MCPServer``.

Run as a script it serves stdio (``python tests/fakes/mcp_server.py``); ``build()``
gives the same server to serve over Streamable HTTP in the test's loop. Every call
of a tool that takes a context appends one JSON line to ``$MCP_FIXTURE_LOG``: the
tool, the idempotency key the request's ``_meta`` carried, and the server's pid (so
a test can kill it mid-call). ``$MCP_FIXTURE_VARIANT`` names a file whose text picks
the tool set at start-up: ``v2`` adds ``multiply``, so a test can change what the
server lists between two turns. With ``$MCP_FIXTURE_HTTP_PORT`` set, the script
serves Streamable HTTP on that loopback port instead of stdio (a server in a
process of its own, for a test to kill); with ``$MCP_FIXTURE_LEGACY`` too, it refuses
the ``server/discover`` probe, so clients fall back to the initialize handshake and
an HTTP session, as servers built before the 2026 protocol do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp import MCPError
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

#: Where turnkit puts a call's idempotency key in the request's ``_meta``.
KEY = "turnkit/idempotency_key"


def _seen(log: Path | None) -> list[dict[str, Any]]:
    if log is None or not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def build(log: Path | None = None, variant: str = "v1") -> MCPServer:
    server = MCPServer("fixture")

    def note(tool: str, ctx: Context) -> str | None:
        meta = ctx.request_context.meta or {}
        key = meta.get(KEY)
        if log is not None:
            with log.open("a") as out:
                out.write(json.dumps({"tool": tool, "key": key, "pid": os.getpid()}) + "\n")
        return key if isinstance(key, str) else None

    @server.tool()
    def add(a: int, b: int, ctx: Context) -> int:
        """Add two numbers."""
        note("add", ctx)
        return a + b

    @server.tool()
    def refuse(reason: str) -> str:
        """Always fails, saying why."""
        raise ToolError(f"refused: {reason}")

    @server.tool()
    def broken() -> str:
        """Answers with a JSON-RPC error instead of a result."""
        raise MCPError(code=-32603, message="the fixture broke on purpose")

    @server.tool()
    async def hang(text: str, ctx: Context) -> str:
        """Waits forever the first time a key is seen; answers once it comes again."""
        earlier = [entry for entry in _seen(log) if entry["tool"] == "hang"]
        key = note("hang", ctx)
        if not any(entry["key"] == key for entry in earlier):
            await anyio.sleep(3600)  # not a wait: a call that hangs, on purpose
        return f"done: {text}"

    if variant == "v2":

        @server.tool()
        def multiply(a: int, b: int) -> int:
            """Multiply two numbers."""
            return a * b

    return server


def main() -> None:
    log = os.environ.get("MCP_FIXTURE_LOG")
    variant_file = os.environ.get("MCP_FIXTURE_VARIANT")
    variant = "v1"
    if variant_file and Path(variant_file).exists():
        variant = Path(variant_file).read_text().strip() or "v1"
    server = build(Path(log) if log else None, variant)
    port = os.environ.get("MCP_FIXTURE_HTTP_PORT")
    if port is None:
        server.run()
        return
    import uvicorn

    app: Any = server.streamable_http_app()
    if os.environ.get("MCP_FIXTURE_LEGACY"):
        app = _legacy_only(app)
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


def _legacy_only(app: Any) -> Any:
    """``app`` answering the ``server/discover`` probe with "method not found"."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if isinstance(request, dict) and request.get("method") == "server/discover":
            error = {"code": -32601, "message": "Method not found"}
            reply = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "error": error})
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": reply.encode()})
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


if __name__ == "__main__":
    main()
