"""``server(runtime, agent)``: an agent's actions, and optionally the agent itself, as
an MCP server over Streamable HTTP, mounted by ``create_app(..., mcp=...)`` at ``/mcp``.

The low-level ``Server`` of the official SDK does the protocol; turnkit lists the
tools and runs them. Who calls is the HTTP app's business: ``create_app``
authenticates every request before it reaches the SDK and hands the principal
down in the request's scope; sessions are opened and used under the app's
``authorize``, exactly as over the app's own endpoints.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import jsonschema
from mcp.server import Server, ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult
from mcp.types import Tool as McpTool
from starlette.types import ASGIApp

from .._access.authorize import Authorize
from .._access.principal import Principal, principal_of
from .._engine.agent import Agent
from .._engine.tool_results import error_text, to_json_result
from .._engine.tools import ActionContext, Tool, is_async_callable
from .._errors import ConfigurationError
from .._runtime.client import RuntimeClient
from .._values.inbound import User
from ._agent_tool import AgentTool
from ._results import failure, success
from ._sessions import McpLimits, SessionGuard

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class McpEndpoint:
    """An agent served over MCP; pass it to ``create_app(..., mcp=...)``.

    Build it with ``server(...)``. It serves every ``define_action`` tool of the
    agent that has a description and, with ``agent_tool``, the agent itself.
    """

    path = "/mcp"

    def __init__(
        self, runtime: RuntimeClient, agent: Agent, agent_tool: str | None, limits: McpLimits
    ) -> None:
        self.runtime = runtime
        self.limits = limits
        self.agent = agent
        self.actions: dict[str, Tool] = {
            t.name: t
            for t in agent.tools
            if isinstance(t, Tool) and t.action is not None and t.spec.description.strip()
        }
        self._agent_tool_name = agent_tool
        self._server: Server[Any] | None = None

    def asgi(self, authorize: Authorize) -> ASGIApp:
        """The Streamable HTTP app; ``authorize`` decides who may use which session."""
        if self._server is not None:
            raise ConfigurationError("this turnkit.mcp.server(...) is mounted already")
        turn = (
            AgentTool(self.runtime, self.agent, self._agent_tool_name, authorize)
            if self._agent_tool_name is not None
            else None
        )
        handlers = _Handlers(self, turn)
        self._server = Server(
            f"turnkit-{self.agent.name}",
            instructions=self.agent.instructions or None,
            on_list_tools=handlers.list_tools,
            on_call_tool=handlers.call_tool,
        )
        # Host and Origin are create_app's to check (allowed_hosts, allowed_origins).
        unchecked = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        app = self._server.streamable_http_app(
            streamable_http_path=self.path,
            transport_security=unchecked,
            session_idle_timeout=self.limits.idle_seconds,
            max_sessions=self.limits.total,
        )
        return SessionGuard(app, self.limits, path=self.path)

    def running(self) -> AbstractAsyncContextManager[object]:
        """The SDK's session manager, run for as long as the app serves."""
        if self._server is None:
            raise ConfigurationError("turnkit.mcp.server(...) runs once create_app mounted it")
        return self._server.session_manager.run()


class _Handlers:
    """The ``tools/list`` and ``tools/call`` handlers of one endpoint."""

    def __init__(self, endpoint: McpEndpoint, turn: AgentTool | None) -> None:
        self.endpoint = endpoint
        self.turn = turn

    async def list_tools(self, ctx: ServerRequestContext[Any], params: object) -> ListToolsResult:
        tools = [
            McpTool(name=t.name, description=t.spec.description, input_schema=t.spec.input_schema)
            for t in self.endpoint.actions.values()
        ]
        if self.turn is not None:
            tools += self.turn.tools()
        return ListToolsResult(tools=tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        request = ctx.request
        principal = principal_of(request.scope) if request is not None else None
        if principal is None:  # create_app authenticates first; anything else is a mistake
            return failure("this MCP endpoint is served only through create_app(..., mcp=...)")
        if not self.endpoint.runtime.is_open:
            return failure("the runtime is not open; try again later")
        arguments = params.arguments or {}
        action = self.endpoint.actions.get(params.name)
        if action is not None:
            return await run_action(action, arguments, principal)
        if self.turn is not None and self.turn.serves(params.name):
            return await self.turn.call(params.name, arguments, principal)
        return failure(f"unknown tool: {params.name}")


async def run_action(
    tool: Tool, arguments: Mapping[str, Any], principal: Principal
) -> CallToolResult:
    """Run a ``define_action`` for ``principal``: its input checked against its schema,
    a plain ``def`` off the event loop, any exception an error result."""
    try:
        jsonschema.validate(dict(arguments), tool.spec.input_schema)
    except jsonschema.ValidationError as exc:
        return failure(f"invalid input: {exc.message}")
    actx = ActionContext(user=User(id=principal.id, attested=principal.attested))
    run = tool.action
    assert run is not None
    try:
        if is_async_callable(run):
            value = await run(dict(arguments), actx)
        else:
            value = await asyncio.to_thread(run, dict(arguments), actx)
        return success(to_json_result(value))
    except Exception as exc:
        return failure(error_text(exc))


def server(
    runtime: RuntimeClient,
    agent: Agent | str,
    *,
    agent_tool: bool | str = False,
    limits: McpLimits | None = None,
) -> McpEndpoint:
    """``agent``'s actions (``define_action`` tools with a description) as an MCP
    server, for ``create_app(runtime, ..., mcp=server(runtime, agent))``.

    ``agent_tool=True`` also serves the agent as one tool named after it (a string
    names it): each call runs a durable turn in a session of the caller's, and a
    turn that parks answers with its question and how to resume it.

    Each MCP session belongs to the principal that opened it (another gets 404
    for it); ``limits`` (``McpLimits``) bounds the sessions per principal and in
    all, and how long an unused one lives.
    """
    if not isinstance(runtime, RuntimeClient):
        raise ConfigurationError(
            "turnkit.mcp.server needs a turnkit.Runtime or a turnkit.RuntimeClient, "
            f"got {type(runtime).__name__}"
        )
    name = agent.name if isinstance(agent, Agent) else agent
    found = runtime.agents.get(name) if isinstance(name, str) else None
    if found is None or (isinstance(agent, Agent) and found is not agent):
        raise ConfigurationError(
            f"turnkit.mcp.server: {agent!r} is not an agent of this runtime "
            f"(its agents: {sorted(runtime.agents)})"
        )
    if limits is not None and not isinstance(limits, McpLimits):
        raise ConfigurationError(
            f"turnkit.mcp.server: limits must be an McpLimits, got {type(limits).__name__}"
        )
    return McpEndpoint(runtime, found, _agent_tool_name(found, agent_tool), limits or McpLimits())


def _agent_tool_name(agent: Agent, agent_tool: bool | str) -> str | None:
    if agent_tool is False:
        return None
    name = _UNSAFE.sub("_", agent.name)[:50] if agent_tool is True else agent_tool
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,50}", name):
        raise ConfigurationError(
            f"turnkit.mcp.server: agent_tool must be True, False or a tool name of 1-50 "
            f"letters, digits, '_' or '-', got {agent_tool!r}"
        )
    return name
