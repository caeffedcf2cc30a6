"""The A2A front end: each agent of a ``create_app`` as an A2A agent.

``create_app(runtime, authenticate=…, frontends=[a2a_server(...)])`` serves, per
agent, the A2A JSON-RPC endpoint at ``/agents/{agent}/a2a`` (the official SDK's
dispatcher, with turnkit's ``TurnTasks`` as its request handler) and the agent's
card at ``/agents/{agent}/a2a/.well-known/agent-card.json``. The endpoint runs
behind the app's ``authenticate`` (a refused call gets the app's 401 and reaches
nothing) and every session it touches is checked with ``authorize``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    APIKeySecurityScheme,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_CURRENT,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._access.principal import Principal
from .._engine.tools import Tool
from .._errors import ConfigurationError
from ..server.frontend import FrontendHost, HttpError
from ._handler import AGENT_KEY, PRINCIPAL_KEY, TurnTasks

#: The skills an agent's card lists, given the agent's name and its declared tools.
Skills = Callable[[str, Sequence[Tool]], Sequence[AgentSkill]]

_MEDIA = ["text/plain", "application/json"]


def bearer_scheme(description: str = "") -> SecurityScheme:
    """An ``Authorization: Bearer <token>`` scheme, for ``security_schemes=``."""
    return SecurityScheme(
        http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer", description=description)
    )


def api_key_scheme(header: str, description: str = "") -> SecurityScheme:
    """A key sent in the request header ``header``, for ``security_schemes=``."""
    return SecurityScheme(
        api_key_security_scheme=APIKeySecurityScheme(
            location="header", name=header, description=description
        )
    )


def tool_skills(agent: str, tools: Sequence[Tool]) -> list[AgentSkill]:
    """The default skills: one per tool the agent declares (its name and description),
    or, for an agent without tools, one named after the agent."""
    skills = [
        AgentSkill(
            id=t.spec.name,
            name=t.spec.name,
            description=t.spec.description or t.spec.name,
            tags=["tool"],
        )
        for t in tools
    ]
    return skills or [
        AgentSkill(id=agent, name=agent, description=f"Talk to {agent}.", tags=["chat"])
    ]


class A2AServer:
    """The A2A endpoints (``create_app(frontends=[a2a_server()])``)."""

    def __init__(
        self,
        *,
        security_schemes: Mapping[str, SecurityScheme],
        skills: Skills,
        description: Callable[[str], str] | None,
        public_url: str | None,
        public_card: bool,
        cancel_wait: float,
        version: str,
        prefix: str,
    ) -> None:
        self.security_schemes = dict(security_schemes)
        self.skills = skills
        self.description = description
        self.public_url = public_url.rstrip("/") if public_url else None
        self.public_card = public_card
        self.cancel_wait = cancel_wait
        self.version = version
        self.prefix = prefix

    def routes(self, host: FrontendHost) -> Sequence[BaseRoute]:
        handler = TurnTasks(host, cancel_wait=self.cancel_wait)
        [route] = create_jsonrpc_routes(
            handler, rpc_url=self.prefix, context_builder=_CallerContext(), enable_v0_3_compat=True
        )
        assert isinstance(route, Route)
        dispatch = route.endpoint

        async def rpc(request: Request, principal: Principal) -> Response:
            agent = host.agent_name(request.path_params["agent"])
            request.scope[PRINCIPAL_KEY] = principal
            request.scope[AGENT_KEY] = agent
            answer = await dispatch(request)
            assert isinstance(answer, Response)
            return answer

        async def card(request: Request, principal: Principal | None = None) -> Response:
            name = host.agent_name(request.path_params["agent"])
            served = self.card(name, host.agent_tools(name), self._url(request, name))
            [card_route] = create_agent_card_routes(served, card_url="/")
            assert isinstance(card_route, Route)
            answer = await card_route.endpoint(request)
            assert isinstance(answer, Response)
            return answer

        card_path = self.prefix + AGENT_CARD_WELL_KNOWN_PATH
        card_endpoint = host.endpoint(card) if not self.public_card else _public(card)
        return [
            Route(self.prefix, host.endpoint(rpc), methods=["POST"]),
            Route(card_path, card_endpoint, methods=["GET"]),
        ]

    def card(self, name: str, tools: Sequence[Tool], url: str) -> AgentCard:
        """Agent ``name``'s card, its endpoint at ``url``."""
        described = self.description(name) if self.description else f"The turnkit agent {name}."
        card = AgentCard(
            name=name,
            description=described,
            version=self.version,
            supported_interfaces=[
                # The same endpoint speaks both: 0.3 clients read the card's 0.3 fields.
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=version)
                for version in (PROTOCOL_VERSION_CURRENT, PROTOCOL_VERSION_0_3)
            ],
            capabilities=AgentCapabilities(streaming=True, push_notifications=False),
            default_input_modes=_MEDIA,
            default_output_modes=_MEDIA,
            skills=list(self.skills(name, tools)),
        )
        for scheme_name, scheme in self.security_schemes.items():
            card.security_schemes[scheme_name].CopyFrom(scheme)
            card.security_requirements.append(
                SecurityRequirement(schemes={scheme_name: StringList()})
            )
        return card

    def _url(self, request: Request, name: str) -> str:
        path = self.prefix.replace("{agent}", name)
        base = self.public_url or str(request.base_url).rstrip("/")
        return base + path


def a2a_server(
    *,
    security_schemes: Mapping[str, SecurityScheme] | None = None,
    skills: Skills = tool_skills,
    description: Callable[[str], str] | None = None,
    public_url: str | None = None,
    public_card: bool = True,
    cancel_wait: float = 5.0,
    version: str = "1.0.0",
) -> A2AServer:
    """The A2A endpoints, for ``create_app(frontends=[...])`` (see docs/a2a.md).

    ``security_schemes`` is what each card declares callers must present
    (``bearer_scheme()``, ``api_key_scheme("X-Api-Key")``, or any A2A
    ``SecurityScheme``): the scheme the app's ``authenticate`` checks. ``skills``
    picks each card's skills (default: the agent's declared tools) and
    ``description`` its description (default: a line naming the agent; the
    instructions are never published unless the app says so). ``public_url`` is
    the base URL clients reach the app at (default: the request's). The card is
    served without authentication, as clients read it to learn how to
    authenticate; ``public_card=False`` puts it behind ``authenticate`` too.
    ``tasks/cancel`` waits up to ``cancel_wait`` seconds for the turn to stop.
    """
    schemes = dict(security_schemes or {})
    for key, scheme in schemes.items():
        if not isinstance(key, str) or not key or not isinstance(scheme, SecurityScheme):
            raise ConfigurationError(
                "a2a_server: security_schemes maps names to a2a.types.SecurityScheme "
                f"(bearer_scheme(), api_key_scheme(...)), got {key!r}: {type(scheme).__name__}"
            )
    if not callable(skills):
        raise ConfigurationError("a2a_server: skills must be a function (agent name, tools)")
    if description is not None and not callable(description):
        raise ConfigurationError("a2a_server: description must be a function of the agent name")
    if isinstance(cancel_wait, bool) or not isinstance(cancel_wait, int | float):
        raise ConfigurationError(f"a2a_server: cancel_wait must be seconds, got {cancel_wait!r}")
    if cancel_wait < 0:
        raise ConfigurationError(f"a2a_server: cancel_wait must be >= 0, got {cancel_wait!r}")
    if public_url is not None and not public_url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"a2a_server: public_url must be an http(s) URL, got {public_url!r}"
        )
    return A2AServer(
        security_schemes=schemes,
        skills=skills,
        description=description,
        public_url=public_url,
        public_card=public_card,
        cancel_wait=float(cancel_wait),
        version=version,
        prefix="/agents/{agent}/a2a",
    )


class _CallerContext(DefaultServerCallContextBuilder):
    """The SDK's call context, plus the caller and agent the endpoint checked."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[PRINCIPAL_KEY] = request.scope.get(PRINCIPAL_KEY)
        context.state[AGENT_KEY] = request.scope.get(AGENT_KEY)
        return context


def _public(card: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """The card endpoint for anyone: an unknown agent is the app's own 404."""

    async def endpoint(request: Request) -> Response:
        try:
            answer = await card(request)
        except HttpError as exc:
            return JSONResponse({"error": exc.message, "code": exc.code}, status_code=exc.status)
        assert isinstance(answer, Response)
        return answer

    return endpoint
