"""The agent itself as MCP tools: ``<name>`` runs one durable turn, ``<name>_resume``
answers a turn that parked for input.

Each call is a turn of the HTTP surface in all but transport: the caller's
principal is the speaker (source ``mcp``), a new session becomes theirs, and an
existing one is used only if the app's ``authorize`` allows it (refusals read as
a session that does not exist).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcp.types import CallToolResult
from mcp.types import Tool as McpTool

from .._access.answerer import answering_as
from .._access.authorize import Action, Authorize, SessionAccess, allowed
from .._access.principal import Principal
from .._channels.channel import ChannelContext, mount_agent
from .._engine.agent import Agent
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
)
from .._runtime.client import RuntimeClient
from .._seams.store import NO_MESSAGES
from .._values.inbound import InboundEvent, User
from .._values.inputs import InputRequest
from .._values.turns import TurnResult
from ..server.frontend import HttpError, identifier
from ._results import failure, success

if TYPE_CHECKING:
    from .._runtime.session_client import SessionClient

#: The inbound source of turns started over MCP (an agent may give it a policy).
SOURCE = "mcp"

log = logging.getLogger("turnkit.mcp")


class _Refused(Exception):
    """A call that cannot go on; its text is the error result."""


class AgentTool:
    """The two tools serving one agent's turns over MCP."""

    def __init__(
        self, runtime: RuntimeClient, agent: Agent, name: str, authorize: Authorize
    ) -> None:
        self.runtime = runtime
        self.agent = agent
        self.name = name
        self.resume_name = f"{name}_resume"
        self.authorize = authorize
        self._ctx: ChannelContext | None = None

    def tools(self) -> list[McpTool]:
        ask = McpTool(
            name=self.name,
            description=(
                f"Ask agent {self.agent.name!r}: runs one turn and returns its answer. "
                "Pass `session` to continue a conversation (its id comes back with every "
                "answer); leave it out to start a new one."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "message": {"type": "string", "description": "What to ask or tell it."},
                    "session": {"type": "string", "description": "A session to continue."},
                },
                "required": ["message"],
            },
        )
        resume = McpTool(
            name=self.resume_name,
            description=(
                f"Answer the question a turn of agent {self.agent.name!r} is waiting on; the "
                "turn then goes on and its answer is returned."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "session": {"type": "string"},
                    "turn_id": {"type": "string"},
                    "input_id": {"type": "string"},
                    "value": {"description": "The answer, as the question's schema asks."},
                },
                "required": ["session", "turn_id", "input_id", "value"],
            },
        )
        return [ask, resume]

    def serves(self, tool: str) -> bool:
        return tool in (self.name, self.resume_name)

    async def call(
        self, tool: str, arguments: Mapping[str, Any], principal: Principal
    ) -> CallToolResult:
        try:
            if tool == self.name:
                return await self._ask(arguments, principal)
            return await self._resume(arguments, principal)
        except _Refused as refused:
            return failure(str(refused))
        except HttpError as exc:
            return failure(exc.message)
        except StoreError as exc:
            # The database's own words may quote stored rows: they go to the log only.
            log.warning("MCP %s: the store failed: %s", tool, exc)
            return failure("the store could not answer; try again later")

    async def _ask(self, arguments: Mapping[str, Any], principal: Principal) -> CallToolResult:
        message = arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            raise _Refused("invalid input: message must be a non-empty string")
        given = arguments.get("session")
        session_id = identifier(given, "session") if given is not None else uuid.uuid4().hex
        owner, exists = await self._allowed(session_id, principal, "turn")
        session = self._session(session_id)
        event = InboundEvent(
            source=SOURCE, text=message, user=User(id=principal.id, attested=principal.attested)
        )
        try:
            turn_id = await session.submit(
                message, event=event, owner=owner if exists else principal.id
            )
        except SessionSuspendedError:
            pending = await self._context().pending(session=session_id)
            if pending is None:
                raise
            return self._parked(session_id, pending, waiting=True)
        except (SessionOwnerError, ConfigurationError):
            raise self._unknown(session_id) from None
        return self._answer(session_id, await session.result(turn_id))

    async def _resume(self, arguments: Mapping[str, Any], principal: Principal) -> CallToolResult:
        session_id = identifier(arguments.get("session"), "session")
        turn_id = identifier(arguments.get("turn_id"), "turn_id")
        input_id = identifier(arguments.get("input_id"), "input_id")
        if "value" not in arguments:
            raise _Refused("invalid input: value is required")
        await self._allowed(session_id, principal, "resume")
        self._session(session_id)
        store = self.runtime.store.session(session_id)
        try:
            stream = await self._context().resume_stream(
                session=session_id,
                turn_id=turn_id,
                input_id=input_id,
                value=arguments["value"],
                by=await answering_as(store, principal, turn_id, input_id),
                principal=principal,
                source="mcp",
            )
        except (ResumeAuthorizationError, ResumeConflictError, InvalidAnswerError) as exc:
            raise _Refused(str(exc)) from None
        async for _ in stream:  # until the turn ends or parks again
            pass
        return self._answer(session_id, await self._context().result(turn_id, session=session_id))

    async def _allowed(
        self, session_id: str, principal: Principal, action: Action
    ) -> tuple[str | None, bool]:
        """The session's owner and whether it exists, once ``authorize`` allows
        ``action`` on it and it is this agent's (or no agent's yet)."""
        snap = await self.runtime.store.session(session_id).load(from_index=NO_MESSAGES)
        exists = snap.agent is not None
        access = SessionAccess(
            agent=self.agent.name,
            session_id=session_id,
            owner=snap.owner,
            action=action,
            exists=exists,
        )
        if not await allowed(self.authorize, principal, access):
            raise self._unknown(session_id)
        if exists and snap.agent != self.agent.name:
            raise self._unknown(session_id)
        return snap.owner, exists

    def _context(self) -> ChannelContext:
        if self._ctx is None:
            self._ctx = mount_agent(self.agent, self.runtime)
        return self._ctx

    def _session(self, session_id: str) -> SessionClient:
        try:
            return self._context().session(session_id)
        except ConfigurationError:
            raise self._unknown(session_id) from None

    def _unknown(self, session_id: str) -> _Refused:
        """One answer for a missing session and for one the caller may not use."""
        return _Refused(f"agent {self.agent.name!r} has no session {session_id!r} for you")

    def _answer(self, session_id: str, result: TurnResult) -> CallToolResult:
        value: dict[str, Any] = {
            "status": result.status,
            "session": session_id,
            "turn_id": result.turn_id,
        }
        if result.status == "completed":
            value["text"] = result.text or ""
            return success(value, text=result.text or "")
        if result.status == "suspended" and result.request is not None:
            return self._parked(session_id, result.request)
        if result.status == "failed":
            value["error"] = result.error
            return failure(f"the turn failed: {result.error}", value)
        value["reason"] = result.reason
        return failure(f"the turn was cancelled ({result.reason})", value)

    def _parked(
        self, session_id: str, request: InputRequest, *, waiting: bool = False
    ) -> CallToolResult:
        """A parked turn's question, and the call that answers it."""
        how = {
            "session": session_id,
            "turn_id": request.turn_id,
            "input_id": request.id,
            "value": "<your answer>",
        }
        value = {
            "status": "suspended",
            "session": session_id,
            "turn_id": request.turn_id,
            "request": request.to_dict(),
            "resume": {"tool": self.resume_name, "arguments": how},
        }
        before = (
            "The session is still waiting for an answer to an earlier question"
            if waiting
            else "The agent is waiting for an answer before it can go on"
        )
        shape = answer_shape(request)
        text = (
            f"{before}: {request.prompt}{shape} To answer, call {self.resume_name} with "
            f"session={session_id!r}, turn_id={request.turn_id!r}, input_id={request.id!r} "
            "and value set to the answer."
        )
        return success(value, text=text)


#: How each decision is written as a resume's value.
_DECISION_FORMS = {
    "approve": '{"decision": "approve"}',
    "edit": '{"decision": "edit", "arguments": {...}}',
    "reject": '{"decision": "reject", "reason": "..."}',
    "respond": '{"decision": "respond", "message": "..."}',
}


def answer_shape(request: InputRequest) -> str:
    """What the answer must look like, said to the client: the decisions a proposed
    call allows (with the proposal), else the question's JSON schema, if any."""
    if request.decision is not None:
        forms = " or ".join(_DECISION_FORMS[k] for k in request.decision.allowed)
        proposal = json.dumps(request.decision.arguments, ensure_ascii=False)
        return (
            f" It is a decision on a proposed call to {request.tool} with the arguments "
            f"{proposal}; the value is one of {forms}."
        )
    if request.schema:
        return f" The answer must match this JSON schema: {request.schema}."
    return ""
