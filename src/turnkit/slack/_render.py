"""A turn's events as a Slack reply in a thread: a placeholder message edited as the
text streams (as often as the channel's ``EditPacer`` allows), a timeline of tool calls with
their results or errors above the text, and how the turn ended. A parked question
becomes its own message with Approve / Deny buttons. A Web API error that slack_sdk's
retries did not cure stops the reply as a ``DeliveryError`` naming the method and
Slack's error code."""

from __future__ import annotations

import json
import time
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
#: The ``action_id`` of each decision's button on a proposed call; approve answers at
#: once, the others open the decision form (``callback_id`` ``DECISION_FORM``), whose
#: one field is in the same place as the answer form's.
DECIDE = {
    "approve": "turnkit_decide_approve",
    "edit": "turnkit_decide_edit",
    "reject": "turnkit_decide_reject",
    "respond": "turnkit_decide_respond",
}
DECISION_FORM = "turnkit_decision"
#: What each decision is called on the buttons and, once taken, on the question.
_BUTTON = {"approve": "Approve", "edit": "Edit…", "reject": "Reject…", "respond": "Respond…"}
DECIDED = {
    "approve": "Approved",
    "edit": "Approved with edits",
    "reject": "Rejected",
    "respond": "Answered instead",
}
#: The decision form's title, submit button and field label, per decision.
_FORM = {
    "edit": ("Edit the call", "Approve", "The arguments, as JSON"),
    "reject": ("Reject the call", "Reject", "Why (the model reads it)"),
    "respond": ("Answer instead", "Send", "What the model reads instead of the result"),
}


def is_yes_no(request: InputRequest) -> bool:
    """A question two buttons answer: its schema is a plain boolean."""
    return request.schema == {"type": "boolean"}


T = TypeVar("T")

#: The most text one message of a reply holds. Slack takes 40,000 characters in a
#: message's ``text`` (and truncates past them); a longer reply goes on in further
#: messages of the thread, so no text is ever dropped.
MAX_TEXT = 39_000


@dataclass(frozen=True, kw_only=True)
class SlackThread:
    """Where a turn's reply goes: a channel and the thread in it (``None``: post at
    the top of the channel, which starts a thread)."""

    channel: str
    thread_ts: str | None = None


def approval_blocks(session_id: str, request: InputRequest) -> list[dict[str, Any]]:
    """The question and its buttons (Approve / Deny for a yes-or-no question, one per
    allowed decision on a proposed call, Answer opening a form for any other); each
    button's value names what it answers."""
    return [*_asked(session_id, request), *_deadline(request)]


def _deadline(request: InputRequest) -> list[dict[str, Any]]:
    """When a question with a deadline must be answered by, in each reader's time zone."""
    if request.expires_at is None:
        return []
    at = int(request.expires_at)
    text = f"Answer by <!date^{at}^{{date_short_pretty}} at {{time}}|{at}>"
    return [{"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}]


def _asked(session_id: str, request: InputRequest) -> list[dict[str, Any]]:
    value = json.dumps({"session": session_id, "turn": request.turn_id, "input": request.id})
    if request.decision is not None:
        return _decision_blocks(request, value)
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


def _decision_blocks(request: InputRequest, value: str) -> list[dict[str, Any]]:
    """A decision on a proposed call: the question, the proposed arguments, and a
    button per decision the request allows."""
    assert request.decision is not None
    proposal = json.dumps(request.decision.arguments, indent=2, ensure_ascii=False)
    buttons = []
    for kind in request.decision.allowed:
        button: dict[str, Any] = {
            "type": "button",
            "action_id": DECIDE[kind],
            "text": {"type": "plain_text", "text": _BUTTON[kind]},
            "value": value,
        }
        if kind == "approve":
            button["style"] = "primary"
        elif kind == "reject":
            button["style"] = "danger"
        buttons.append(button)
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": _escape(request.prompt)}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": f"```{_escape(proposal)[:2900]}```"},
        },
        {"type": "actions", "block_id": "turnkit_answer", "elements": buttons},
    ]


def decision_form(request: InputRequest, kind: str, metadata: str) -> dict[str, Any]:
    """The modal an Edit…, Reject… or Respond… button opens: one field (the arguments
    as JSON, filled in with the proposal; a reason; a message)."""
    assert request.decision is not None
    title, submit, label = _FORM[kind]
    element: dict[str, Any] = {
        "type": "plain_text_input",
        "action_id": FORM_FIELD,
        "multiline": True,
    }
    if kind == "edit":
        element["initial_value"] = json.dumps(
            request.decision.arguments, indent=2, ensure_ascii=False
        )[:3000]
    return {
        "type": "modal",
        "callback_id": DECISION_FORM,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": submit},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _escape(request.prompt[:2900])},
            },
            {
                "type": "input",
                "block_id": FORM_BLOCK,
                "optional": kind == "reject",
                "label": {"type": "plain_text", "text": label},
                "element": element,
            },
        ],
    }


def decision_value(kind: str, text: str) -> dict[str, Any]:
    """The decision a submitted decision form stands for; ``ValueError`` when an
    edit's text is not a JSON object (the form says so)."""
    if kind == "edit":
        try:
            arguments = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the arguments are not JSON: {exc}") from None
        return {"decision": "edit", "arguments": arguments}
    if kind == "reject":
        return {"decision": "reject", **({"reason": text.strip()} if text.strip() else {})}
    return {"decision": "respond", "message": text}


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
        #: The reply's messages in the thread: the first (the placeholder, edited as
        #: the turn goes on), then one per ``MAX_TEXT`` of text past it.
        self.posted: list[str] = []
        self.text = ""
        self.timeline: list[str] = []
        self.ending: str | None = None
        self._shown: list[str] = []
        #: The text of the reply's committed steps, and the delivery attempt whose
        #: deltas are being shown (a newer one restarts its step: no word twice).
        self._committed = ""
        self._attempt: str | None = None
        #: Whether the turn opened (``turn.started``): a turn replaced before it
        #: ever ran posts nothing at all (see ``render``).
        self._started = False

    @property
    def ts(self) -> str | None:
        """The reply's first message (its placeholder), once posted."""
        return self.posted[0] if self.posted else None

    async def render(self, events: AsyncIterator[TurnEvent]) -> None:
        async for event in events:
            await self.take(event)
        if not self.posted and not self._started:
            # Cancelled before it ran (a newer message replaced it while it queued):
            # nothing of it was shown, and a notice posted now would land below the
            # newer message's reply.
            return
        await self.flush(force=True)

    async def take(self, event: TurnEvent) -> None:
        if event.type == "turn.started":
            self._started = True
        elif event.type == "message.delta":
            if event.attempt is not None and self._attempt not in (None, event.attempt):
                self.text = self._committed  # taken over mid-step: it streams again
            self._attempt = event.attempt or self._attempt
            self.text += event.text
            await self.flush()
        elif event.type == "message.completed":
            self.text = event.message.text or self.text
            self._committed = self.text
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
        return "\n".join(parts) or "…"

    async def flush(self, *, force: bool = False) -> None:
        """Post the placeholder, or edit it when there is something new to show: a
        streamed edit when the channel's pacer allows (Slack limits how often the
        messages of a channel change), a forced one (the timeline, the end) always."""
        pages = pages_of(self.body())
        channel = self.thread.channel
        if not self.posted:
            self.pacer.sent(channel)
            await self._post(pages[0], self.thread.thread_ts)
            if len(pages) == 1:
                return
        if pages == self._shown:
            return
        if force:
            self.pacer.sent(channel)
        elif not self.pacer.take(channel):
            return  # shown by a later edit: the next delta's, or the last one
        for index, page in enumerate(pages):
            if index >= len(self.posted):
                await self._post(page, self._thread_ts())
            elif index >= len(self._shown) or self._shown[index] != page:
                await _slack(
                    "chat.update",
                    self.client.chat_update(channel=channel, ts=self.posted[index], text=page),
                )
                self._shown[index] = page

    async def _post(self, page: str, thread_ts: str | None) -> None:
        posted = await _slack(
            "chat.postMessage",
            self.client.chat_postMessage(
                channel=self.thread.channel, thread_ts=thread_ts, text=page
            ),
        )
        self.posted.append(str(posted["ts"]))
        self._shown.append(page)

    def _thread_ts(self) -> str | None:
        return self.thread.thread_ts or self.ts


def answered_blocks(outcome: str, user: str) -> list[dict[str, Any]]:
    """What a question shows once answered: the outcome, who, and when (Slack's
    date formatting shows it in each reader's time zone)."""
    now = int(time.time())
    return [
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"*{outcome}* by <@{user}> "
                    f"<!date^{now}^{{date_short_pretty}} at {{time}}|at {now}>",
                }
            ],
        }
    ]


def pages_of(text: str, size: int = MAX_TEXT) -> list[str]:
    """``text`` cut into messages of at most ``size`` characters, at a line break
    where one falls in the second half of a page (else at the size); joined back
    with line breaks where they were cut, they give the text whole."""
    pages: list[str] = []
    while len(text) > size:
        cut = text.rfind("\n", size // 2, size)
        if cut == -1:
            pages.append(text[:size])
            text = text[size:]
        else:
            pages.append(text[:cut])
            text = text[cut + 1 :]
    pages.append(text)
    return pages


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
