"""``a2a_agent(url)``: a remote A2A agent as a tool, its task followed durably.

The call sends one message and keeps the remote task's id with the call
(``ctx.remember``) before it waits, so a replay of the call (a crash, a takeover,
a resume) follows *the same* remote task, by ``SubscribeToTask`` and ``GetTask``,
instead of sending the message again. Its message and context ids derive from the
call's idempotency key, so even a crash between the send and the remember makes
no second task on a server that deduplicates messages (turnkit's does). A remote
``input-required`` parks this turn on the remote question; the answer given here
is sent on to the remote task, which then goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict

from .._engine.context import ToolContext
from .._engine.tools import Tool, check_tool_name
from .._errors import ToolDefinitionError
from .._seams.model import ToolSpec

#: The note under which a call keeps its remote task.
TASK_NOTE = "a2a-task"
#: Remote states that end a task, and what each reads as.
_ENDED = {
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "was cancelled",
    TaskState.TASK_STATE_REJECTED: "rejected the task",
    TaskState.TASK_STATE_AUTH_REQUIRED: "needs authentication this tool cannot give",
}


class A2AAgentError(Exception):
    """The remote task did not complete; the calling model reads why."""


@dataclass(frozen=True)
class _Question:
    id: str | None
    prompt: str
    schema: dict[str, Any] | None


def a2a_agent(
    url: str,
    *,
    name: str = "remote_agent",
    description: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 3600.0,
    poll: float = 1.0,
) -> Tool:
    """A tool that sends the model's ``message`` to the A2A agent at ``url`` (the base
    its card is served under: ``<url>/.well-known/agent-card.json``) and returns its
    answer: ``{"agent", "task_id", "context_id", "text"}``.

    ``headers`` go with every request (the credentials the agent's card asks for).
    The tool waits up to ``timeout`` seconds for the remote task, following its
    stream when the card offers one and asking for it every ``poll`` seconds
    otherwise; past that it cancels the remote task and the call fails. A remote
    task that fails, is cancelled or rejected fails the call with its reason. See
    docs/a2a.md.
    """
    tool_name = check_tool_name(name)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ToolDefinitionError(f"a2a_agent: url must be an http(s) URL, got {url!r}")
    for number, label in ((timeout, "timeout"), (poll, "poll")):
        if isinstance(number, bool) or not isinstance(number, int | float) or number <= 0:
            raise ToolDefinitionError(f"a2a_agent: {label} must be positive seconds")
    given_headers = dict(headers or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in given_headers.items()):
        raise ToolDefinitionError("a2a_agent: headers must map str to str")
    spec = ToolSpec(
        name=tool_name,
        description=description or f"Ask the remote agent at {url} and wait for its answer.",
        input_schema={
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": "What to ask the remote agent, with everything it needs.",
                }
            },
            "required": ["message"],
            "additionalProperties": False,
        },
    )
    remote = _Remote(url.rstrip("/"), given_headers, float(timeout), float(poll))

    async def run(data: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        text = data.get("message")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("message must be a non-empty string")
        return await remote.call(text, ctx)

    return Tool(spec, run)


class _Remote:
    def __init__(self, url: str, headers: dict[str, str], timeout: float, poll: float) -> None:
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self.poll = poll
        self._card: AgentCard | None = None

    async def call(self, text: str, ctx: ToolContext) -> dict[str, Any]:
        async with httpx.AsyncClient(headers=self.headers, timeout=self.timeout) as http:
            card = await self._resolve(http)
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            streaming = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
            deadline = time.monotonic() + self.timeout
            held = ctx.recall(TASK_NOTE)
            if held is None:
                sent = await self._send(client, text, ctx)
                if isinstance(sent, Message):
                    # The remote answered at once, with no task to follow.
                    return {
                        "agent": card.name,
                        "task_id": None,
                        "context_id": sent.context_id or None,
                        "text": _text_of(sent.parts),
                    }
                held = {"task_id": sent.id, "context_id": sent.context_id}
                # Kept before waiting: a replay follows this task, never sends again.
                await ctx.remember(TASK_NOTE, held)
            task_id = str(held["task_id"])
            while True:
                task = await self._settled(client, streaming, card, task_id, deadline)
                state = task.status.state
                if state == TaskState.TASK_STATE_COMPLETED:
                    return {
                        "agent": card.name,
                        "task_id": task.id,
                        "context_id": task.context_id,
                        "text": _answer_text(task),
                    }
                if state in _ENDED:
                    said = _text_of(task.status.message.parts) or "no reason given"
                    raise A2AAgentError(f"{card.name} {_ENDED[state]}: {said}")
                await self._answer(client, task, ctx)

    async def _resolve(self, http: httpx.AsyncClient) -> AgentCard:
        if self._card is None:
            try:
                self._card = await A2ACardResolver(http, self.url).get_agent_card()
            except A2AClientError as exc:
                raise A2AAgentError(
                    f"the agent card at {self.url} could not be read: {exc}"
                ) from None
        return self._card

    async def _send(self, client: Client, text: str, ctx: ToolContext) -> Task | Message:
        """Open the remote task; returns as soon as the remote has it (or the remote's
        reply, for an agent that answers without a task)."""
        key = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:32]
        message = Message(
            role=Role.ROLE_USER,
            message_id=f"tk-{key}",
            context_id=f"tk-{key}",
            parts=[new_text_part(text)],
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        async for response in client.send_message(request):
            if response.HasField("task"):
                return response.task
            if response.HasField("message"):
                return response.message
        raise A2AAgentError("the remote agent answered the message with nothing")

    async def _settled(
        self, client: Client, streaming: Client, card: AgentCard, task_id: str, deadline: float
    ) -> Task:
        """The task once it has ended or asks for input: followed by its stream when
        the card offers one (until it ends, then read again), polled otherwise; a
        passing failure to reach the agent is retried until ``deadline``."""
        while True:
            try:
                task = await client.get_task(GetTaskRequest(id=task_id))
                if _waiting_on_us(task):
                    return task
                if card.capabilities.streaming:
                    await _follow(streaming, task_id, deadline)
                    task = await client.get_task(GetTaskRequest(id=task_id))
                    if _waiting_on_us(task):
                        return task
            except TaskNotFoundError:
                raise A2AAgentError(
                    f"{card.name} no longer knows task {task_id} (it kept no record of it)"
                ) from None
            except (A2AClientError, A2AError, httpx.HTTPError):
                pass  # the agent is not reachable now (a node restarting): again, later
            if time.monotonic() >= deadline:
                await _cancel_quietly(client, task_id)
                raise A2AAgentError(
                    f"{card.name} did not finish task {task_id} in {self.timeout:g} s; "
                    "it was asked to cancel"
                )
            await asyncio.sleep(self.poll)

    async def _answer(self, client: Client, task: Task, ctx: ToolContext) -> None:
        """Ask this turn the remote task's open question (parking it the first
        time), then send the answer on to the remote task."""
        answered = 0
        while ctx.recall(f"a2a-answer-{answered}") is not None:
            answered += 1
        question = _questions(task)[0]
        input_id = f"a2a-{question.id or 'input'}-{answered}"
        value = await ctx.request_input(input_id, question.prompt, schema=question.schema)
        if question.id is not None:
            parts = [new_data_part({"answers": {question.id: value}})]
        elif isinstance(value, str):
            parts = [new_text_part(value)]
        else:
            parts = [new_data_part(value)]
        key = hashlib.sha256(f"{ctx.idempotency_key}:{answered}".encode()).hexdigest()[:32]
        message = Message(
            role=Role.ROLE_USER,
            message_id=f"tk-{key}",
            task_id=task.id,
            context_id=task.context_id,
            parts=parts,
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        async for _ in client.send_message(request):
            pass
        await ctx.remember(f"a2a-answer-{answered}", question.id or "input")


async def _follow(client: Client, task_id: str, deadline: float) -> None:
    """Follow the task's stream until it ends (or ``deadline``)."""
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.01)):
            async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                pass
    except (TimeoutError, UnsupportedOperationError):
        return  # past the deadline, or ended already: the caller reads it


def _waiting_on_us(task: Task) -> bool:
    return task.status.state not in (
        TaskState.TASK_STATE_SUBMITTED,
        TaskState.TASK_STATE_WORKING,
        TaskState.TASK_STATE_UNSPECIFIED,
    )


def _questions(task: Task) -> list[_Question]:
    """What an ``input-required`` task asks: turnkit's question list when its status
    message carries one, else the message's text as one question."""
    message = task.status.message
    for part in message.parts:
        if part.HasField("data"):
            data = MessageToDict(part.data)
            listed = data.get("questions") if isinstance(data, dict) else None
            if isinstance(listed, list) and listed:
                return [
                    _Question(
                        id=str(q.get("id")),
                        prompt=str(q.get("prompt", "")),
                        schema=q.get("schema") if isinstance(q.get("schema"), dict) else None,
                    )
                    for q in listed
                    if isinstance(q, dict) and q.get("id")
                ]
    prompt = _text_of(message.parts) or "The remote agent asks for input."
    return [_Question(id=None, prompt=prompt, schema=None)]


def _answer_text(task: Task) -> str:
    for artifact in task.artifacts:
        text = _text_of(artifact.parts)
        if text:
            return text
    return _text_of(task.status.message.parts)


def _text_of(parts: Any) -> str:
    pieces: list[str] = []
    for part in parts:
        if part.HasField("text"):
            pieces.append(part.text)
        elif part.HasField("data"):
            pieces.append(json.dumps(MessageToDict(part.data), sort_keys=True))
    return "\n".join(pieces)


async def _cancel_quietly(client: Client, task_id: str) -> None:
    with contextlib.suppress(A2AClientError, A2AError, httpx.HTTPError):
        await client.cancel_task(CancelTaskRequest(id=task_id))
