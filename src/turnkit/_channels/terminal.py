"""The built-in terminal channel (source ``cli``), used by ``turnkit run``.

It renders a turn as it happens (reply text inline, each tool call and its result
as a timeline line) and, when the turn parks, asks the question at the prompt and
resumes the turn with the answer. The person at the terminal is the local user
(``local_user``: the one the ``turnkit dev`` page also serves), authenticated by the
operating system, so their identity counts as attested. Everything it writes
passes through ``printable``: a reply, a tool result or a question never gets to
send the terminal a control sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

from .._errors import InvalidAnswerError, ResumeAuthorizationError
from .._seams.store import NO_MESSAGES
from .._values.events import SubagentEvent, TurnEvent
from .._values.inbound import InboundEvent, User
from .._values.inputs import InputRequest
from .._values.turns import TurnResult
from .channel import ChannelContext
from .local_user import local_user, named_answerer
from .printable import printable

SOURCE = "cli"


class TerminalRenderer:
    """Prints a turn's events as they arrive: text inline, tool calls as a timeline."""

    def __init__(self, out: TextIO, *, asks: bool = False) -> None:
        self.out = out
        #: The question of a park is asked at the prompt right after, so it is not
        #: also printed as a timeline line.
        self.asks = asks
        self._mid_line = False
        #: A streamed carriage return, held until the next delta says whether it
        #: starts a CRLF (kept) or stands alone (shown escaped).
        self._held_cr = False

    def _text(self, text: str) -> None:
        """Write streamed reply text, escaped; a CRLF split across deltas stays one."""
        if self._held_cr:
            text, self._held_cr = "\r" + text, False
        if text.endswith("\r"):
            text, self._held_cr = text[:-1], True
        self.out.write(printable(text))

    def _end_text(self) -> None:
        """Close the streamed text's line (a carriage return still held stood alone)."""
        if self._held_cr:
            self.out.write(printable("\r"))
            self._held_cr = False
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False

    def _line(self, text: str) -> None:
        self._end_text()
        self.out.write(printable(text) + "\n")

    def render(self, event: TurnEvent, indent: str = "") -> None:
        if isinstance(event, SubagentEvent):
            if event.event.type != "message.delta":
                self.render(event.event, indent=indent + f"  [{event.agent}] ")
            return
        if event.type == "message.delta":
            if not indent:
                self._text(event.text)
                self._mid_line = True
        elif event.type == "message.completed" and indent and event.message.text:
            self._line(f"{indent}{event.message.text}")
        elif event.type == "action.requested":
            shown = json.dumps(event.call.input, ensure_ascii=False)
            self._line(f"{indent}  → {event.call.name} {shown}")
        elif event.type == "action.completed":
            mark = "✗" if event.error else "←"
            shown = event.error if event.error else json.dumps(event.result, ensure_ascii=False)
            self._line(f"{indent}  {mark} {event.name}: {shown}")
        elif event.type == "input.requested":
            for request in event.requests:
                if request.kind == "timer":  # a wait on the clock: nobody is asked
                    self._line(f"{indent}  … {request.prompt}")
                elif indent or not self.asks:
                    self._line(f"{indent}  ? {request.prompt}")
            if not indent and self.asks:
                self._end_text()
        elif event.type == "turn.failed" and not indent:
            self._line(f"  ✗ turn failed: {event.error}")
        elif event.type == "turn.cancelled" and not indent:
            self._line(f"  ✗ turn cancelled: {event.reason}")
        elif event.type == "delivery.failed" and not indent:
            at = f" ({event.method})" if event.method else ""
            self._line(f"  ✗ {event.channel} reply to {event.target} failed{at}: {event.error}")
        elif event.type == "turn.completed":
            self._end_text()
        self.out.flush()


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed or detached
        return False


def parse_answer(request: InputRequest, raw: str) -> Any:
    """What a typed answer means for the request's schema: yes/no for a boolean, the
    text itself for a string (or no schema), JSON otherwise."""
    schema = request.schema or {}
    kind = schema.get("type")
    text = raw.strip()
    if request.decision is not None:
        return _decision(text)
    if kind == "boolean":
        lowered = text.lower()
        if lowered in ("y", "yes", "true", "approve", "ok"):
            return True
        if lowered in ("n", "no", "false", "deny"):
            return False
        raise ValueError("answer yes or no")
    if kind in (None, "string") and "enum" not in schema:
        return raw.rstrip("\n")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if "enum" in schema and text in schema["enum"]:
            return text
        raise ValueError('answer in JSON (for example 3, "text" or {"a": 1})') from None


def _decision(text: str) -> Any:
    """A typed decision on a proposed call: ``yes`` / ``approve``, ``edit {json}``,
    ``no`` / ``reject [why]``, ``respond <text>``, or a decision's JSON form. Whether
    the request allows it is the resume's check (it says what is allowed)."""
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError('a decision in JSON looks like {"decision": "approve"}') from None
    word, _, rest = text.partition(" ")
    word, rest = word.lower(), rest.strip()
    if word in ("y", "yes", "ok", "approve") and not rest:
        return {"decision": "approve"}
    if word in ("n", "no", "deny", "reject"):
        return {"decision": "reject", **({"reason": rest} if rest else {})}
    if word == "edit":
        try:
            return {"decision": "edit", "arguments": json.loads(rest)}
        except json.JSONDecodeError:
            raise ValueError('edit takes the arguments in JSON: edit {"a": 1}') from None
    if word == "respond" and rest:
        return {"decision": "respond", "message": rest}
    raise ValueError("answer approve, edit {json}, reject [why] or respond <text>")


def _decision_hint(request: InputRequest) -> str:
    """What a decision prompt offers: the allowed decisions, as they are typed."""
    assert request.decision is not None
    typed = {
        "approve": "approve",
        "edit": "edit {json}",
        "reject": "reject [why]",
        "respond": "respond <text>",
    }
    return " (" + " | ".join(typed[k] for k in request.decision.allowed) + ")"


class TerminalChannel:
    """A channel whose platform is this terminal: ``source == "cli"``."""

    source = SOURCE

    def __init__(
        self,
        *,
        out: TextIO | None = None,
        ask: Callable[[str], str] | None = None,
        user: str | None = None,
    ) -> None:
        self.out = out if out is not None else sys.stdout
        self._ask = ask if ask is not None else input
        #: ``input()`` from a pipe or a file: no Enter is echoed to end the prompt's line.
        self._unechoed = ask is None and not _is_terminal(sys.stdin)
        #: Who is at the terminal: ``user`` (a user id) or the local identity.
        self.user = local_user(user)
        self.user_id = self.user.id

    def to_event(self, payload: Any) -> InboundEvent:
        """A line typed at the terminal, spoken by its user (attested)."""
        if not isinstance(payload, str):
            raise TypeError(f"the terminal channel takes text, got {type(payload).__name__}")
        return InboundEvent(
            source=SOURCE, text=payload, user=User(id=self.user_id, attested=True), kind="message"
        )

    async def deliver(self, target: Any, events: AsyncIterator[TurnEvent]) -> TurnEvent | None:
        """Render ``events`` to the terminal (``target`` is unused); return the last one."""
        del target
        return await self._show(events, asks=False)

    async def _show(self, events: AsyncIterator[TurnEvent], *, asks: bool) -> TurnEvent | None:
        renderer = TerminalRenderer(self.out, asks=asks)
        last: TurnEvent | None = None
        async for event in events:
            renderer.render(event)
            last = event
        return last

    async def _prompt(self, text: str) -> str:
        """Ask on a daemon thread: a blocked ``input()`` must not keep Ctrl-C (or the
        end of the program) waiting, as a thread of asyncio's executor would."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()

        def settle(value: str | None, exc: BaseException | None) -> None:
            if answer.done():
                return
            if exc is not None:
                answer.set_exception(exc)
            else:
                answer.set_result(value or "")

        def read() -> None:
            try:
                value, exc = self._ask(text), None
            except BaseException as error:  # EOFError, KeyboardInterrupt: the caller's
                value, exc = None, error
            with contextlib.suppress(RuntimeError):  # the loop closed while we waited
                loop.call_soon_threadsafe(settle, value, exc)

        threading.Thread(target=read, name="turnkit-prompt", daemon=True).start()
        return await answer

    async def converse(self, ctx: ChannelContext, text: str, *, session: str) -> TurnResult:
        """Run one turn to its end, answering each park at the prompt.

        If the session is already parked (an earlier run stopped at a question), that
        question is asked and answered first.
        """
        pending = await ctx.pending(session=session)
        if pending is not None:
            waiting = f"(session {session!r} is waiting on turn {pending.turn_id})"
            self.out.write(printable(waiting) + "\n")
            earlier = await self._settle(ctx, session, pending.turn_id)
            if earlier.status == "suspended":
                return earlier
        # A session the terminal opens is its user's; one that exists keeps its owner
        # (the terminal, like code, may use any session of the store it was given).
        new = (await ctx.runtime.store.session(session).load(from_index=NO_MESSAGES)).agent is None
        stream = await ctx.submit_stream(
            text,
            session=session,
            event=self.to_event(text),
            owner=self.user_id if new else None,
        )
        await self._show(stream, asks=True)
        return await self._settle(ctx, session, stream.turn_id)

    async def answer(
        self, ctx: ChannelContext, *, session: str, given: str | None = None
    ) -> TurnResult | None:
        """Answer the question ``session`` is parked on, and nothing more: the turn
        goes on to its end (or its next question, asked at the prompt), and no new
        turn starts. ``given`` answers the first question without asking. ``None``
        if the session is not waiting for an answer."""
        pending = await ctx.pending(session=session)
        if pending is None:
            return None
        if given is not None:
            result = await ctx.result(pending.turn_id, session=session)
            if result.request is not None:
                request = result.requests[0] if result.requests else result.request
                resumed = await ctx.resume_stream(
                    session=session,
                    turn_id=pending.turn_id,
                    input_id=request.id,
                    value=parse_answer(request, given),
                    by=self._answering_as(request),
                    source=self.source,
                )
                await self._show(resumed, asks=True)
        return await self._settle(ctx, session, pending.turn_id)

    def _answering_as(self, request: InputRequest) -> str:
        """The name to answer ``request`` by: the one of this user's names it asks
        for (``cli:<login>`` for a question an older ``turnkit run`` parked), else
        the user's id."""
        return named_answerer(self.user.names, request.answerers) or self.user_id

    async def _ask_for(self, request: InputRequest) -> str:
        """The typed answer to ``request``. At the end of input the prompt's line is
        ended before ``EOFError`` goes on, so what is written next starts a line."""
        hint = " (yes/no)" if (request.schema or {}).get("type") == "boolean" else ""
        if request.decision is not None:
            proposal = json.dumps(request.decision.arguments, ensure_ascii=False)
            self.out.write(printable(f"  proposed: {request.tool} {proposal}\n"))
            hint = _decision_hint(request)
        try:
            answer = await self._prompt(printable(f"  ? {request.prompt}{hint} > "))
        except EOFError:
            self._end_prompt_line()
            raise
        if self._unechoed:
            self._end_prompt_line()
        return answer

    def _end_prompt_line(self) -> None:
        self.out.write("\n")
        self.out.flush()

    async def _settle(self, ctx: ChannelContext, session: str, turn_id: str) -> TurnResult:
        """Ask and resume until the turn is no longer parked: each of its questions in
        turn (several calls of one step may ask at once), leaving those this user
        may not answer to their answerers."""
        refused: set[str] = set()
        while True:
            result = await ctx.result(turn_id, session=session)
            if result.status != "suspended" or result.request is None:
                return result
            # A wait on the clock is nobody's to answer: the turn stays parked on it.
            mine = [r for r in result.requests if r.id not in refused and r.kind != "timer"]
            if not mine:
                return result
            request = mine[0]
            raw = await self._ask_for(request)
            try:
                value = parse_answer(request, raw)
                resumed = await ctx.resume_stream(
                    session=session,
                    turn_id=turn_id,
                    input_id=request.id,
                    value=value,
                    by=self._answering_as(request),
                    source=self.source,
                )
                await self._show(resumed, asks=True)
            except (ValueError, InvalidAnswerError) as exc:
                self.out.write(printable(f"  ! {exc}\n"))  # ask again
            except ResumeAuthorizationError as exc:
                self.out.write(printable(f"  ! {exc}\n"))
                refused.add(request.id)
