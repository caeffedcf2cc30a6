"""Reminders of open questions, posted in the Slack thread that asked them.

A question with ``remind_every`` gets an ``input.reminder`` event each period
until it is answered or expires. The event is emitted to the event sink of one
process only: the one that fires the store's timers (the elected timer loop, in a
process that runs turns). Posting from that sink is what makes each reminder one
message: every process that merely serves Slack's routes would otherwise post it
too. So ``SlackChannel.post_reminders(runtime)`` subscribes a runtime's sink; the
Slack app does it for its own runtime when it is made, and a deployment whose
timers fire in worker processes calls it there as well (see docs/slack.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from .._errors import ConfigurationError
from .._runtime.runtime import Runtime
from .._seams.store import NO_MESSAGES
from .._values.events import InputReminderEvent, TurnEvent
from ._render import _escape as escape

log = logging.getLogger("turnkit.slack")


def thread_of_session(session_id: str) -> tuple[str, str] | None:
    """The channel and thread ts of a Slack session (``slack:<team>:<channel>:<ts>``,
    as ``session_of`` names them); ``None`` for a session Slack did not open."""
    parts = session_id.split(":")
    if len(parts) != 4 or parts[0] != "slack" or not parts[2] or not parts[3]:
        return None
    return parts[2], parts[3]


def reminder_message(event: InputReminderEvent) -> tuple[str, list[dict[str, Any]]]:
    """The text and blocks of a reminder: the question again, which reminder this
    is, and its deadline (in each reader's time zone) if it has one."""
    nth = "" if event.reminder <= 1 else f" (reminder {event.reminder})"
    text = f"Still waiting for an answer{nth}: {escape(event.prompt)}"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f":alarm_clock: {text}"}}
    ]
    if event.expires_at is not None:
        at = int(event.expires_at)
        due = f"Answer by <!date^{at}^{{date_short_pretty}} at {{time}}|{at}>"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": due}]})
        text = f"{text} (answer by {at})"
    return text, blocks


class ReminderPoster:
    """Subscribed to one runtime's sink: posts each ``input.reminder`` of a Slack
    session of its agents (any agent of the runtime, if ``agents`` is ``None``) in
    the session's thread."""

    def __init__(self, client: AsyncWebClient, runtime: Runtime, agent: str | None) -> None:
        self.client = client
        self.runtime = runtime
        self.agents: set[str] | None = None if agent is None else {agent}
        self.unsubscribe: Callable[[], None] = runtime.sink.subscribe(self._heard)
        #: How many reminders this poster put in Slack (for monitoring and tests).
        self.posted = 0

    def widen(self, agent: str | None) -> None:
        """Post the reminders of ``agent`` too (of every agent, if ``None``)."""
        if agent is None:
            self.agents = None
        elif self.agents is not None:
            self.agents.add(agent)

    def _heard(self, event: TurnEvent) -> None:
        if not isinstance(event, InputReminderEvent):
            return
        where = thread_of_session(event.session_id)
        if where is None:
            return
        try:
            self.runtime.spawn(self._post(event, *where))
        except ConfigurationError:  # the runtime closed meanwhile: nothing to post from
            log.warning("Slack: reminder of %s not posted: the runtime is closed", event.input_id)

    async def _post(self, event: InputReminderEvent, channel: str, thread_ts: str) -> None:
        """Post one reminder; a failure is logged (the question stays open, and the
        next reminder, or the question itself, still says it)."""
        try:
            if self.agents is not None:
                snap = await self.runtime.store.session(event.session_id).load(
                    from_index=NO_MESSAGES
                )
                if snap.agent not in self.agents:
                    return  # another agent's thread: its own Slack app reminds it
            text, blocks = reminder_message(event)
            await self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=text, blocks=blocks
            )
            self.posted += 1
        except Exception as exc:
            log.warning(
                "Slack: could not post reminder %d of question %r in %s: %s",
                event.reminder,
                event.input_id,
                event.session_id,
                exc,
            )
