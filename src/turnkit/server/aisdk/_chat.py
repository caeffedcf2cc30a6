"""The AI SDK's chat endpoints for each agent: send, reconnect, stop.

``POST /agents/{agent}/ai-sdk/chat`` takes what ``DefaultChatTransport`` sends
(``{"id", "messages", "trigger", …}``): a last message from the user opens a turn
in the session named by ``id``; a last assistant message whose tool parts carry
approval responses answers the parked questions they name. ``GET …/{id}/stream``
replays the session's unfinished turn from the durable log and follows it (204
when there is none, or the caller may not read it); ``POST …/{id}/stop`` cancels
the session's turns durably.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from ..._access.principal import Principal
from ..._errors import TurnError
from ..._runtime.observe import TurnStream
from ..._values.inputs import InputRequest
from .._bodies import HttpError, identifier
from .._feed import EventFeed
from .._frontend import FrontendHost, followed, unknown_session
from .._sse import KEEPALIVE
from .._story import Story
from ._parts import DONE, HEADERS, encode, parts_of, start


class AiSdk:
    """The AI SDK UI message stream endpoints (``create_app(frontends=[ai_sdk()])``)."""

    def __init__(self, prefix: str = "/agents/{agent}/ai-sdk/chat") -> None:
        self.prefix = prefix

    def routes(self, host: FrontendHost) -> Sequence[BaseRoute]:
        chat = _Chat(host)
        return [
            Route(self.prefix, host.endpoint(chat.send), methods=["POST"]),
            Route(f"{self.prefix}/{{chat}}/stream", host.endpoint(chat.reconnect), methods=["GET"]),
            Route(f"{self.prefix}/{{chat}}/stop", host.endpoint(chat.stop), methods=["POST"]),
        ]


def ai_sdk() -> AiSdk:
    """The AI SDK's chat endpoints, for ``create_app(frontends=[...])``."""
    return AiSdk()


class _Chat:
    def __init__(self, host: FrontendHost) -> None:
        self.host = host

    async def send(self, request: Request, principal: Principal) -> Response:
        agent = self.host.agent_name(request.path_params["agent"])
        body = await self.host.body(request)
        chat_id = identifier(body.get("id"), "id")
        trigger = body.get("trigger", "submit-message")
        if trigger != "submit-message":
            raise HttpError(
                400,
                "unsupported_trigger",
                f"trigger {trigger!r} is not served: turnkit keeps every turn it ran, so "
                "it regenerates nothing; send a new message instead",
            )
        last = _last_message(body)
        if last.get("role") == "user":
            text = _text_of(last)
            target = await self.host.target(principal, agent, chat_id, "turn", refuse=True)
            session, turn_id = await self.host.start_turn(principal, target, text, turn_id=None)
            return self._respond(turn_id, session.observe(turn_id), late=False)
        if last.get("role") == "assistant":
            return await self._approve(principal, agent, chat_id, last)
        raise HttpError(
            400,
            "invalid_body",
            f"the last message must be the user's or the assistant's, not {last.get('role')!r}",
        )

    async def _approve(
        self, principal: Principal, agent: str, chat_id: str, message: dict[str, Any]
    ) -> Response:
        """Answer every parked question the message's approval responses name."""
        target = await self.host.target(principal, agent, chat_id, "resume", refuse=False)
        responses = _approval_responses(message)
        pending = {r.id: r for r in await self.host.pending(target)} if target.exists else {}
        answered = [(pending[i], ok, why) for i, ok, why in responses if i in pending]
        if not answered:
            if not target.allowed:
                raise unknown_session(agent, chat_id)  # as /resume: nothing to tell
            raise HttpError(
                409,
                "resume_conflict",
                "the last message answers no question the session waits on "
                f"(approval ids {[i for i, _, _ in responses]})",
            )
        stream: TurnStream | None = None
        turn_id = answered[0][0].turn_id
        for question, approved, reason in answered:
            value = approval_value(question, approved, reason)
            if stream is not None:
                await stream.aclose()
            stream = await self.host.answer(
                principal, target, question.turn_id, question.id, value, source="aisdk"
            )
        if stream is None:
            # A named answerer who may not read the session: the answer was taken.
            return StreamingResponse(
                _nothing_more(turn_id), headers=HEADERS, media_type="text/event-stream"
            )
        return self._respond(turn_id, stream, late=False)

    async def reconnect(self, request: Request, principal: Principal) -> Response:
        agent = self.host.agent_name(request.path_params["agent"])
        chat_id = identifier(request.path_params["chat"], "chat id")
        target = await self.host.target(principal, agent, chat_id, "read", refuse=False)
        # A session the caller may not read and one with nothing running answer alike.
        if not target.allowed or not target.exists:
            return Response(status_code=204)
        unfinished = await target.store.unfinished()
        if not unfinished:
            return Response(status_code=204)
        turn = max(unfinished, key=lambda record: record.created_at)
        return self._respond(turn.turn_id, self.host.feed(target, turn_id=turn.turn_id), late=True)

    async def stop(self, request: Request, principal: Principal) -> Response:
        agent = self.host.agent_name(request.path_params["agent"])
        chat_id = identifier(request.path_params["chat"], "chat id")
        target = await self.host.target(principal, agent, chat_id, "turn", refuse=True)
        return JSONResponse({"cancelled": await self.host.cancel(target)})

    def _respond(self, turn_id: str, source: TurnStream | EventFeed, *, late: bool) -> Response:
        frames = _frames(
            Story(turn_id, joined_late=late),
            source,
            idle=self.host.keepalive_seconds,
            poll=self.host.feed_poll_seconds,
        )
        return StreamingResponse(frames, headers=HEADERS, media_type="text/event-stream")


async def _frames(
    story: Story, source: TurnStream | EventFeed, *, idle: float, poll: float | None
) -> AsyncIterator[bytes]:
    yield encode(start(story.turn_id))
    error: TurnError | None = None
    async for item in followed(source, idle=idle, poll=poll):
        if item is None:
            yield KEEPALIVE
        elif isinstance(item, TurnError):
            error = item
        else:
            for told in story.tell(item):
                for part in parts_of(told):
                    yield encode(part)
    for told in story.end(error):
        for part in parts_of(told):
            yield encode(part)
    yield DONE


async def _nothing_more(turn_id: str) -> AsyncIterator[bytes]:
    yield encode(start(turn_id))
    yield encode({"type": "finish"})
    yield DONE


def _last_message(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "invalid_body", "messages must be a non-empty array")
    last = messages[-1]
    if not isinstance(last, dict):
        raise HttpError(400, "invalid_body", "messages[-1] must be an object")
    return last


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise HttpError(400, "invalid_body", "messages[-1].parts must be an array")
    return [p for p in parts if isinstance(p, dict)]


def _text_of(message: dict[str, Any]) -> str:
    texts = [p.get("text") for p in _parts(message) if p.get("type") == "text"]
    text = "\n".join(t for t in texts if isinstance(t, str))
    if not text.strip():
        raise HttpError(400, "invalid_body", "the user's message has no text part")
    return text


def _approval_responses(message: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    """``(approval id, approved, reason)`` for each tool part the client answered."""
    found: list[tuple[str, bool, str | None]] = []
    for part in _parts(message):
        approval = part.get("approval")
        if part.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        approved = approval.get("approved")
        if not isinstance(approved, bool):
            raise HttpError(
                400, "invalid_body", "an approval response's approved must be a boolean"
            )
        reason = approval.get("reason")
        found.append(
            (
                identifier(approval.get("id"), "approval id"),
                approved,
                reason if isinstance(reason, str) else None,
            )
        )
    if not found:
        raise HttpError(
            400, "invalid_body", "the last message is the assistant's but answers no approval"
        )
    return found


def approval_value(request: InputRequest, approved: bool, reason: str | None) -> Any:
    """The answer a tool approval gives ``request``: the boolean itself for a yes-or-no
    question (or one with no schema), ``{"approved": …}`` for an object that asks for
    a boolean ``approved`` (with the reason as its ``reason`` or ``note``, if it has
    one); anything else cannot be answered by an approval."""
    if request.decision is not None:
        return _decision_of(request, approved, reason)
    schema = request.schema
    if schema is None or schema.get("type") == "boolean":
        return approved
    properties = schema.get("properties") if schema.get("type") == "object" else None
    if isinstance(properties, dict) and (properties.get("approved") or {}).get("type") == "boolean":
        value: dict[str, Any] = {"approved": approved}
        slot = next((k for k in ("reason", "note") if k in properties), None)
        if reason and slot is not None:
            value[slot] = reason
        return value
    raise HttpError(
        422,
        "not_an_approval",
        f"question {request.id!r} asks for an answer a tool approval cannot give "
        "(its schema is neither a boolean nor an object with a boolean 'approved'); "
        "answer it with POST /agents/{agent}/sessions/{session}/resume",
    )


def _decision_of(request: InputRequest, approved: bool, reason: str | None) -> Any:
    """A tool approval as a decision on the proposed call: approve; or reject (with the
    reason), else respond with the reason as the model's message, whichever the
    request allows. Edits cannot be told this way (``/resume`` takes them)."""
    assert request.decision is not None
    allowed = request.decision.allowed
    if approved and "approve" in allowed:
        return {"decision": "approve"}
    if not approved and "reject" in allowed:
        return {"decision": "reject", **({"reason": reason} if reason else {})}
    if not approved and "respond" in allowed and reason:
        return {"decision": "respond", "message": reason}
    raise HttpError(
        422,
        "not_an_approval",
        f"question {request.id!r} allows the decisions {', '.join(allowed)}, which this "
        "approval response cannot give; answer it with "
        "POST /agents/{agent}/sessions/{session}/resume",
    )
