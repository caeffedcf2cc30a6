"""A turn's events as a Slack reply in a thread: a placeholder message edited as the
text streams (as often as the channel's ``EditPacer`` allows), a timeline of tool calls with
their results or errors above the text, and how the turn ended. A parked question
becomes its own message with Approve / Deny buttons. A Web API error that slack_sdk's
retries did not cure stops the reply as a ``DeliveryError`` naming the method and
Slack's error code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from .._errors import DeliveryError
from .._values.events import TurnEvent
from .._values.inputs import InputRequest
from ._pacing import EditPacer

#: The ``action_id`` of the two buttons of a yes-or-no question.
APPROVE = "turnkit_approve"
DENY = "turnkit_deny"
#: The ``action_id`` of the button that opens the form of any other question, and
#: the ``callback_id`` of that form (a modal).
OPEN_FORM = "turnkit_answer_open"
FORM = "turnkit_answer"
#: Where the form's one field is, in the modal's state.
FORM_BLOCK, FORM_FIELD = "turnkit_answer_block", "answer"


def is_yes_no(request: InputRequest) -> bool:
    """A question two buttons answer: its schema is a plain boolean."""
    return request.schema == {"type": "boolean"}


T = TypeVar("T")

#: The longest text one Slack message takes; a longer reply is cut, marked so.
MAX_TEXT = 3900


@dataclass(frozen=True, kw_only=True)
class SlackThread:
    """Where a turn's reply goes: a channel and the thread in it (``None``: post at
    the top of the channel, which starts a thread)."""

    channel: str
    thread_ts: str | None = None


def approval_blocks(session_id: str, request: InputRequest) -> list[dict[str, Any]]:
    """The question and its buttons (Approve / Deny for a yes-or-no question, Answer
    opening a form for any other); each button's value names what it answers."""
    value = json.dumps({"session": session_id, "turn": request.turn_id, "input": request.id})
    if not is_yes_no(request):
        return [
            {"type": "section", "text": {"type": "mrkdwn", "text": _escape(request.prompt)}},
            {
                "type": "actions",
                "block_id": "turnkit_answer",
                "elements": [
                    {
                        "type": "button",
                        "action_id": OPEN_FORM,
                        "text": {"type": "plain_text", "text": "Answer"},
                        "value": value,
                    }
                ],
            },
        ]
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": _escape(request.prompt)}},
        {
            "type": "actions",
            "block_id": "turnkit_answer",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE,
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": value,
                },
                {
                    "type": "button",
                    "action_id": DENY,
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "value": value,
                },
            ],
        },
    ]


def answer_form(request: InputRequest, metadata: str) -> dict[str, Any]:
    """The modal a question's Answer button opens: the prompt and one text field.
    ``metadata`` (what it answers, and the thread) comes back with the submission."""
    return {
        "type": "modal",
        "callback_id": FORM,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": "Answer"},
        "submit": {"type": "plain_text", "text": "Send"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "input",
                "block_id": FORM_BLOCK,
                "label": {"type": "plain_text", "text": request.prompt[:2000] or "Answer"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": FORM_FIELD,
                    "multiline": not _wants_json(request),
                },
            }
        ],
    }


def form_value(request: InputRequest, text: str) -> Any:
    """The answer a form's text stands for: JSON when the schema wants something
    other than a string (``12``, ``["a"]``), else the text itself."""
    if not _wants_json(request):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text  # the schema check then says what was expected


def _wants_json(request: InputRequest) -> bool:
    schema = request.schema
    return isinstance(schema, dict) and schema.get("type") not in (None, "string")


class SlackReply:
    """Renders one turn's events into one thread (see the module docstring)."""

    def __init__(self, client: AsyncWebClient, thread: SlackThread, pacer: EditPacer) -> None:
        self.client = client
        self.thread = thread
        self.pacer = pacer
        self.ts: str | None = None
        self.text = ""
        self.timeline: list[str] = []
        self.ending: str | None = None
        self._shown = ""

    async def render(self, events: AsyncIterator[TurnEvent]) -> None:
        async for event in events:
            await self.take(event)
        await self.flush(force=True)

    async def take(self, event: TurnEvent) -> None:
        if event.type == "message.delta":
            self.text += event.text
            await self.flush()
        elif event.type == "message.completed":
            self.text = event.message.text or self.text
        elif event.type == "action.requested":
            self.timeline.append(f"• `{event.call.name}` …")
            await self.flush(force=True)
        elif event.type == "action.completed":
            mark = f"✗ `{event.name}` failed: {event.error}" if event.error else f"✓ `{event.name}`"
            self._complete(event.name, mark)
            await self.flush(force=True)
        elif event.type == "input.requested":
            await self.flush(force=True)
            # One message with its buttons per question (several calls may ask at
            # once); those still open after an answer were posted when they were asked.
            for request in () if event.still_open else event.requests:
                await _slack(
                    "chat.postMessage",
                    self.client.chat_postMessage(
                        channel=self.thread.channel,
                        thread_ts=self._thread_ts(),
                        text=request.prompt,
                        blocks=approval_blocks(event.session_id, request),
                    ),
                )
        elif event.type == "turn.failed":
            self.ending = f":warning: The turn failed: {event.error}"
        elif event.type == "turn.cancelled":
            self.ending = (
                "_superseded by a newer message_"
                if event.reason == "replaced"
                else f"_cancelled ({event.reason})_"
            )

    def _complete(self, name: str, mark: str) -> None:
        for index, line in enumerate(self.timeline):
            if line == f"• `{name}` …":
                self.timeline[index] = mark
                return
        self.timeline.append(mark)

    def body(self) -> str:
        parts = [*self.timeline]
        if self.text:
            parts.append(_escape(self.text))
        if self.ending:
            parts.append(self.ending)
        shown = "\n".join(parts) or "…"
        if len(shown) > MAX_TEXT:
            shown = shown[: MAX_TEXT - 1] + "…"
        return shown

    async def flush(self, *, force: bool = False) -> None:
        """Post the placeholder, or edit it when there is something new to show: a
        streamed edit when the channel's pacer allows (Slack limits how often the
        messages of a channel change), a forced one (the timeline, the end) always."""
        shown = self.body()
        channel = self.thread.channel
        if self.ts is None:
            self.pacer.sent(channel)
            posted = await _slack(
                "chat.postMessage",
                self.client.chat_postMessage(
                    channel=channel, thread_ts=self.thread.thread_ts, text=shown
                ),
            )
            self.ts = str(posted["ts"])
            self._shown = shown
            return
        if shown == self._shown:
            return
        if force:
            self.pacer.sent(channel)
        elif not self.pacer.take(channel):
            return  # shown by a later edit: the next delta's, or the last one
        await _slack(
            "chat.update", self.client.chat_update(channel=channel, ts=self.ts, text=shown)
        )
        self._shown = shown

    def _thread_ts(self) -> str | None:
        return self.thread.thread_ts or self.ts


async def _slack(method: str, call: Awaitable[T]) -> T:
    """Await a Web API call; an error slack_sdk's retry handlers did not cure (they
    retry a 429 after its ``Retry-After`` and a dropped connection) becomes a
    ``DeliveryError`` naming ``method`` and Slack's error code (``channel_not_found``,
    ``token_revoked``), or the exception itself when Slack never answered."""
    try:
        return await call
    except SlackApiError as exc:
        code = str(exc.response.get("error") or f"HTTP {exc.response.status_code}")
        raise DeliveryError(f"Slack's {method} failed: {code}", method=method, code=code) from exc
    except Exception as exc:
        code = f"{type(exc).__name__}: {exc}"
        raise DeliveryError(f"Slack's {method} failed: {code}", method=method, code=code) from exc


def _escape(text: str) -> str:
    """Slack's three control characters, so text cannot ping or link by itself."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
