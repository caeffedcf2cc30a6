"""The AG-UI endpoint for each agent: a ``RunAgentInput`` in, a run's events out.

``POST /agents/{agent}/ag-ui`` opens a turn with the input's last user message in
the session named by ``threadId``, or, when the input carries ``resume[]``,
answers the parked questions its entries name (checked exactly as ``/resume``
checks an answer) and follows the resumed turn. ``GET …/ag-ui/capabilities``
declares what turnkit serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ag_ui.core import (
    AgentCapabilities,
    HumanInTheLoopCapabilities,
    IdentityCapabilities,
    ReasoningCapabilities,
    ResumeEntry,
    RunAgentInput,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    TextPart,
    Tool,
    ToolsCapabilities,
    TransportCapabilities,
)
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from ..._access.principal import Principal
from ..._engine.tools import Tool as TurnkitTool
from ..._errors import TurnError
from ..._runtime.observe import TurnStream
from .._bodies import HttpError, identifier
from .._frontend import FrontendHost, followed, unknown_session
from .._sse import KEEPALIVE
from .._story import Story
from ._decisions import decision_value
from ._events import Run, encode

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class AgUi:
    """The AG-UI endpoints (``create_app(frontends=[ag_ui()])``)."""

    def __init__(self, prefix: str = "/agents/{agent}/ag-ui") -> None:
        self.prefix = prefix

    def routes(self, host: FrontendHost) -> Sequence[BaseRoute]:
        runs = _Runs(host)
        return [
            Route(self.prefix, host.endpoint(runs.run), methods=["POST"]),
            Route(f"{self.prefix}/capabilities", host.endpoint(runs.capabilities), methods=["GET"]),
        ]


def ag_ui() -> AgUi:
    """The AG-UI endpoints, for ``create_app(frontends=[...])``."""
    return AgUi()


class _Runs:
    def __init__(self, host: FrontendHost) -> None:
        self.host = host

    async def run(self, request: Request, principal: Principal) -> Response:
        agent = self.host.agent_name(request.path_params["agent"])
        given = _run_input(await self.host.body(request))
        thread_id = identifier(given.thread_id, "threadId")
        run = Run(thread_id, identifier(given.run_id, "runId"))
        if given.resume:
            return await self._resume(principal, agent, run, given.resume)
        text = _last_user_text(given)
        target = await self.host.target(principal, agent, thread_id, "turn", refuse=True)
        session, turn_id = await self.host.start_turn(principal, target, text, turn_id=None)
        return self._respond(run, Story(turn_id), session.observe(turn_id))

    async def _resume(
        self, principal: Principal, agent: str, run: Run, entries: list[ResumeEntry]
    ) -> Response:
        """Answer the interrupts ``entries`` name, in order, each as ``/resume`` would;
        entries that all say ``cancelled`` cancel the parked turn instead."""
        statuses = {entry.status for entry in entries}
        if statuses == {"cancelled"}:
            target = await self.host.target(principal, agent, run.thread_id, "turn", refuse=True)
            await self.host.cancel(target)
            ended = RunFinishedEvent(
                thread_id=run.thread_id, run_id=run.run_id, outcome=RunFinishedCancelledOutcome()
            )
            return _events_response([run.started(), ended])
        if statuses != {"resolved"}:
            raise HttpError(
                400,
                "invalid_body",
                "resume entries must all be resolved, or all cancelled (which cancels the "
                "parked turn: turnkit abandons its questions together)",
            )
        target = await self.host.target(principal, agent, run.thread_id, "resume", refuse=False)
        pending = {r.id: r for r in await self.host.pending(target)} if target.exists else {}
        unknown = [e.interrupt_id for e in entries if e.interrupt_id not in pending]
        if unknown:
            if not target.allowed:
                raise unknown_session(agent, run.thread_id)  # as /resume: nothing to tell
            raise HttpError(
                409, "resume_conflict", f"the thread waits on no interrupt(s) {unknown}"
            )
        stream: TurnStream | None = None
        for entry in entries:
            question = pending[entry.interrupt_id]
            if stream is not None:
                await stream.aclose()
            payload = entry.payload
            if question.decision is not None:
                payload = decision_value(payload)
            stream = await self.host.answer(
                principal, target, question.turn_id, question.id, payload, source="agui"
            )
        turn_id = pending[entries[-1].interrupt_id].turn_id
        if stream is None:
            # A named answerer who may not read the thread: the answer was taken.
            return _events_response([run.started(), run.finished()])
        return self._respond(run, Story(turn_id), stream)

    async def capabilities(self, request: Request, principal: Principal) -> Response:
        name = self.host.agent_name(request.path_params["agent"])
        declared = capabilities_of(name, self.host.agent_tools(name))
        return JSONResponse(declared.model_dump(mode="json", by_alias=True))

    def _respond(self, run: Run, story: Story, source: TurnStream) -> Response:
        frames = _frames(
            run,
            story,
            source,
            idle=self.host.keepalive_seconds,
            poll=self.host.feed_poll_seconds,
        )
        return StreamingResponse(frames, headers=HEADERS, media_type="text/event-stream")


def capabilities_of(agent: str, tools: Sequence[TurnkitTool]) -> AgentCapabilities:
    """What turnkit serves over AG-UI, and nothing it does not: streamed runs, the
    agent's own tools (run on the server, several at once), streamed reasoning, and
    interrupts (approvals and other questions) answered through ``resume``."""
    return AgentCapabilities(
        identity=IdentityCapabilities(name=agent, type="turnkit"),
        transport=TransportCapabilities(streaming=True),
        tools=ToolsCapabilities(
            supported=True,
            items=[
                Tool(
                    name=t.spec.name,
                    description=t.spec.description,
                    parameters=t.spec.input_schema,
                )
                for t in tools
            ],
            parallel_calls=True,
            client_provided=False,
        ),
        reasoning=ReasoningCapabilities(supported=True, streaming=True),
        human_in_the_loop=HumanInTheLoopCapabilities(
            supported=True, approvals=True, interrupts=True, approve_with_edits=True
        ),
    )


async def _frames(
    run: Run, story: Story, source: TurnStream, *, idle: float, poll: float | None
) -> AsyncIterator[bytes]:
    yield encode(run.started())
    error: TurnError | None = None
    async for item in followed(source, idle=idle, poll=poll):
        if item is None:
            yield KEEPALIVE
        elif isinstance(item, TurnError):
            error = item
        else:
            for told in story.tell(item):
                for event in run.events(told):
                    yield encode(event)
    for told in story.end(error):
        for event in run.events(told):
            yield encode(event)


def _events_response(events: list[Any]) -> Response:
    async def frames() -> AsyncIterator[bytes]:
        for event in events:
            yield encode(event)

    return StreamingResponse(frames(), headers=HEADERS, media_type="text/event-stream")


def _run_input(body: dict[str, Any]) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HttpError(
            400, "invalid_body", f"not an AG-UI RunAgentInput: {where}: {first['msg']}"
        ) from None


def _last_user_text(given: RunAgentInput) -> str:
    for message in reversed(given.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(p.text for p in content if isinstance(p, TextPart))
        if text.strip():
            return text
        break
    raise HttpError(
        400, "invalid_body", "the run has no resume entries and its last user message no text"
    )
