"""Text output of ``turnkit sessions`` and ``turnkit show``: for people, not parsers.

Long values (a tool's input or result) are cut to one readable line here; ``--json``
carries them whole. Errors are marked ``✗`` as in ``turnkit run``'s timeline. What a
store holds may be anyone's text, so every renderer returns it through ``printable``:
control characters show as escapes and never act on the reader's terminal.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .._channels.local_user import named_answerer
from .._channels.printable import printable
from .._errors import MessageDecodeError
from .._values.answers import AnswerRecord
from .._values.checkpoints import InputAnswer, ToolStepResult
from .._values.inputs import Answerer, InputRequest
from .._values.listed_tools import ListedTools
from .._values.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    ToolMessage,
    TriggerMessage,
)
from .._values.policy import TurnPolicy
from .._values.records import SessionInfo
from .._values.step_ids import (
    HISTORY,
    INPUT,
    MODEL,
    POLICY,
    TOOL,
    TOOLS,
    TRACE,
    WINDOW,
    step_kind,
    step_position,
)
from .._values.usage import Usage
from .._values.windows import SummaryRecord, WindowRecord
from ._show import ArchiveView, SessionView, TurnView, utc

#: Longest a tool input, result or step value is shown in text output.
MAX_VALUE = 200
_ROLE_WIDTH = len("assistant")


def compact(value: Any, limit: int = MAX_VALUE) -> str:
    """``value`` as one line of JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    # Escaped before whitespace is folded, so a control character shows as itself.
    text = printable(text)
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks; cells are made
    ``printable`` first, so an escaped character keeps its column aligned."""
    cells = [[printable(str(c)) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def render_sessions(sessions: Sequence[SessionInfo]) -> str:
    """``turnkit sessions``: newest first, one row each."""
    if not sessions:
        return "no sessions"
    rows = [(s.session_id, s.agent, s.status, utc(s.updated_at)) for s in sessions]
    return printable(table(("SESSION", "AGENT", "STATUS", "UPDATED"), rows))


def render_session(
    view: SessionView,
    *,
    store: str,
    store_flag: str,
    you: Sequence[str] = (),
    now: float | None = None,
) -> str:
    """``turnkit show SESSION``: header, transcript, turns and steps, park, archive.
    ``you`` are the names of the person at this terminal (see ``local_user``): a
    question they may answer says how to answer it here. Deadlines and the ends of
    waits say how far they are from ``now`` (default: the clock)."""
    parts = [
        _header(view, store),
        _transcript(view.messages, view.turns),
        _turns(view.turns),
    ]
    now = time.time() if now is None else now
    for n, request in enumerate(view.requests, start=1):
        if request.kind == "timer":
            parts.append(_waiting(request, view, now))
        else:
            parts.append(_parked(request, view, store_flag, you, now, n, len(view.requests)))
    if view.generations:
        parts.append(_archived(view, store_flag))
    return printable("\n\n".join(parts))


def render_archive(view: ArchiveView, *, store: str) -> str:
    """``turnkit show SESSION#gN``: the archived transcript."""
    head = table(
        ("session", view.session_id),
        [("generation", f"{view.generation} (archived)"), ("store", store)],
    )
    return printable(f"{head}\n\n{_transcript(view.messages, [])}")


def _header(view: SessionView, store: str) -> str:
    rows = [
        ("agent", view.agent or "-"),
        ("owner", view.owner or "none"),
        ("status", view.status),
        ("generation", str(view.generation)),
        ("store", store),
    ]
    usage = view.usage
    if usage:
        rows.append(("usage", describe_usage(usage)))
    if view.writer is not None:
        holder, since = view.writer
        rows.append(("writer", f"{holder} (since {utc(since)})"))
    return table(("session", view.session_id), rows)


def describe_usage(usage: Usage) -> str:
    """``1,220 in (600 cached), 12 out (4 reasoning)``: input with its cache share,
    output with its reasoning share."""
    cache = [f"{usage.cache_read_tokens:,} cached"] if usage.cache_read_tokens else []
    if usage.cache_write_tokens:
        cache.append(f"{usage.cache_write_tokens:,} written to cache")
    text = f"{usage.input_tokens:,} in" + (f" ({', '.join(cache)})" if cache else "")
    text += f", {usage.output_tokens:,} out"
    if usage.reasoning_tokens:
        text += f" ({usage.reasoning_tokens:,} reasoning)"
    return text


def _transcript(messages: Sequence[Message], turns: Sequence[TurnView]) -> str:
    """Every message, under a rule naming its turn each time the turn changes."""
    if not messages:
        return "transcript: empty"
    statuses = {t.turn_id: t.record.status for t in turns if t.record is not None}
    lines = [f"transcript ({len(messages):,} messages)"]
    current: str | None = None
    width = len(str(len(messages) - 1))
    for index, message in enumerate(messages):
        if message.turn_id != current:
            current = message.turn_id
            status = statuses.get(current)
            lines.append(f"── turn {current}" + (f" ({status})" if status else ""))
        lines.extend(_message_lines(index, message, width))
    return "\n".join(lines)


def _message_lines(index: int, message: Message, width: int) -> Iterator[str]:
    prefix = f"  [{index:>{width}}] {message.role:<{_ROLE_WIDTH}}  "
    pad = " " * len(prefix)
    if isinstance(message, ToolMessage):
        mark = "✗" if message.is_error else "←"
        yield f"{prefix}{mark} {message.name}: {compact(message.result)}"
        return
    text = message.text
    if isinstance(message, TriggerMessage):
        text = f"(by {message.by}) {text}"
    body = printable(text).splitlines()  # a lone CR shows as \x0d, not a line break
    if isinstance(message, AssistantMessage):
        body += [f"→ {c.name} {compact(c.input)}  (call {c.id})" for c in message.tool_calls]
        if message.stop is not None and message.stop.abnormal:
            body.append(f"✗ stopped: {message.stop.kind}")
    body = body or ["(empty)"]
    yield (prefix + body[0]).rstrip()
    yield from ((pad + line).rstrip() for line in body[1:])


def _turns(turns: Sequence[TurnView]) -> str:
    """Each turn's status, times, outcome and memoized steps."""
    if not turns:
        return "turns: none"
    lines = [f"turns ({len(turns):,})"]
    for turn in turns:
        lines.extend(_turn_lines(turn))
    return "\n".join(lines)


def _turn_lines(turn: TurnView) -> Iterator[str]:
    record = turn.record
    if record is None:
        yield f"  {turn.turn_id}  (no turn record)"
    else:
        finished = record.finished_at
        ended = f" → {_end_time(record.created_at, finished)}" if finished else ""
        held = " (held)" if record.held_by is not None and record.status == "suspended" else ""
        yield f"  {turn.turn_id}  {record.status}{held}  {utc(record.created_at)}{ended}"
        if record.version is not None:
            yield f"    version: {record.version}"
        if record.held_by is not None and record.status == "suspended":
            yield f"    held by version: {record.held_by.replace(',', ', ')}"
        if record.error:
            yield f"    ✗ error: {compact(record.error)}"
        if record.cancel_reason:
            yield f"    cancel reason: {record.cancel_reason}"
        if record.text:
            yield f"    answer: {compact(record.text)}"
    usage = turn.usage
    if usage:
        yield f"    usage: {describe_usage(usage)}"
    for answered in turn.answers:
        yield _answered(AnswerRecord.of(answered))
    if not turn.steps:
        yield "    steps: none"
        return
    yield f"    steps ({len(turn.steps)})"
    rows = [(f"      {step_id}", _step_summary(step_id, v)) for step_id, v in _ordered(turn.steps)]
    yield table(("", ""), rows).split("\n", 1)[1]


def _answered(record: AnswerRecord) -> str:
    """One answer: who gave it, through which channel, when, and what it was."""
    who = record.by if record.by is not None else "(nobody named)"
    via = f" via {record.source}" if record.source else ""
    when = f" at {utc(record.at)}"
    decision = record.decision
    if decision is None:
        return f"    answered {record.input_id} by {who}{via}{when}: {compact(record.value)}"
    what = {
        "approve": "approved",
        "edit": f"approved with edits {compact(decision.arguments)}",
        "reject": "rejected" + (f": {compact(decision.reason)}" if decision.reason else ""),
        "respond": f"responded instead: {compact(decision.message)}",
    }[decision.kind]
    return f"    decided {record.input_id} by {who}{via}{when}: {what}"


def _end_time(start: float, end: float) -> str:
    """The end of a turn, without the date when it is the start's."""
    full = utc(end)
    return full[len("YYYY-MM-DD ") :] if full[:10] == utc(start)[:10] else full


def _ordered(steps: dict[str, Any]) -> list[tuple[str, Any]]:
    """Steps in the order they happened: the policy, trace context and listed tools,
    then by transcript position."""

    def key(step_id: str) -> tuple[int, int, str]:
        order = {POLICY: 0, TRACE: 0, TOOLS: 0, INPUT: 2}.get(step_kind(step_id), 1)
        return (order, step_position(step_id) or 0, step_id)

    return sorted(steps.items(), key=lambda item: key(item[0]))


def _step_summary(step_id: str, value: Any) -> str:
    """One line saying what a memoized step holds (a form it cannot read, as stored)."""
    try:
        return _summary_of(step_kind(step_id), value)
    except MessageDecodeError:
        return compact(value)


def _summary_of(kind: str, value: Any) -> str:
    if kind == MODEL:
        reply = ModelReply.from_dict(value)
        said = compact(reply.text, 80)
        shown = f'"{said}"' if said else "(no text)"
        calls = ", ".join(c.name or "?" for c in reply.tool_calls)
        used = f"  [{describe_usage(reply.usage)}]" if reply.usage else ""
        return f"reply {shown}" + (f" → {calls}" if calls else "") + used
    if kind == TOOL:
        step = ToolStepResult.from_dict(value)
        return f"✗ {compact(step.error)}" if step.error else f"result {compact(step.result)}"
    if kind == INPUT:
        answer = InputAnswer.from_dict(value)
        return f"answer {compact(answer.value)} by {answer.by}"
    if kind == POLICY:
        policy = TurnPolicy.from_dict(value)
        denied = ", ".join(sorted(policy.deny_tools)) or "none"
        return f"source {policy.source or 'none (started from code)'}, tools denied: {denied}"
    if kind == TRACE and isinstance(value, dict):
        # W3C traceparent: version-traceid-spanid-flags.
        parts = str(value.get("traceparent", "")).split("-")
        if len(parts) == 4:
            return f"opened in trace {parts[1]} (span {parts[2]})"
    if kind == WINDOW:
        window = WindowRecord.from_dict(value)
        after = f", after summary {window.summary.step_id}" if window.summary else ""
        return f"sent messages [{window.start}:]{after}"
    if kind == HISTORY:
        made = SummaryRecord.from_dict(value)
        used = f"  [{describe_usage(made.usage)}]" if made.usage else ""
        return f'summary of messages [:{made.upto}] "{compact(made.text, 80)}"{used}'
    if kind == TOOLS:
        listed = ListedTools.from_dict(value).tools
        return "tools listed: " + (", ".join(f"{t.name} ({t.source})" for t in listed) or "none")
    return compact(value)


def _parked(
    request: InputRequest,
    view: SessionView,
    store_flag: str,
    you: Sequence[str],
    now: float,
    n: int = 1,
    of: int = 1,
) -> str:
    """A pending request and the ways to answer it (one of ``of`` open at once)."""
    rows = [
        ("turn", request.turn_id),
        ("tool", f"{request.tool} (call {request.call_id})"),
        ("input id", request.id),
        ("asks", request.prompt),
        ("schema", compact(request.schema) if request.schema else "any JSON value"),
        ("answerers", _answerers(request.answerers)),
    ]
    if request.decision is not None:
        rows[4:5] = [
            ("proposed", compact(request.decision.arguments)),
            ("decisions", ", ".join(request.decision.allowed)),
            ("to decide", 'e.g. {"decision": "approve"}; see docs/approvals.md'),
        ]
    rows += _deadline(request, now)
    hints = _how_to_answer(request, view.session_id, view.agent or "AGENT", store_flag, you)
    rows += [("to answer" if n == 0 else "", hint) for n, hint in enumerate(hints)]
    body = table(("", ""), [(f"  {k}", v) for k, v in rows]).split("\n", 1)[1]
    if of > 1:
        head = f"parked input {n} of {of} (each answered on its own; the last one resumes)"
    else:
        head = "parked input (the session waits for an answer)"
    return f"{head}\n{body}"


def _deadline(request: InputRequest, now: float) -> list[tuple[str, str]]:
    """A question's deadline, what happens then, and its reminders, if it has them."""
    rows: list[tuple[str, str]] = []
    if request.expires_at is not None:
        rows.append(
            ("answer by", f"{utc(request.expires_at)} ({_from_now(request.expires_at, now)})")
        )
        expiry = request.on_expiry
        if expiry is not None:
            then = {
                "answer": f"answered {compact(expiry.value, 80)} (by deadline)",
                "cancel": "the turn is cancelled",
                "fail": "the turn fails",
            }[expiry.action]
            rows.append(("then", then))
    if request.remind_every and request.remind_at is not None:
        every = _span(request.remind_every)
        rows.append(("reminders", f"every {every}, next {utc(request.remind_at)}"))
    return rows


def _waiting(request: InputRequest, view: SessionView, now: float) -> str:
    """A wait on the clock (``ctx.sleep``, the wait tool, a retry's backoff): when it
    ends, and how to end it sooner."""
    session, agent = view.session_id, view.agent or "AGENT"
    until = request.expires_at
    rows = [
        ("turn", request.turn_id),
        ("tool", f"{request.tool} (call {request.call_id})"),
        ("timer", request.id),
        ("until", "-" if until is None else f"{utc(until)} ({_from_now(until, now)})"),
        (
            "to wake",
            f"await runtime.session({agent!r}, {session!r}).wake({request.turn_id!r})",
        ),
        ("", f"or over HTTP: POST /agents/{agent}/sessions/{session}/wake"),
    ]
    body = table(("", ""), [(f"  {k}", v) for k, v in rows]).split("\n", 1)[1]
    return f"waiting on the clock (the turn goes on by itself then)\n{body}"


def _from_now(at: float, now: float) -> str:
    """``in 2 h 5 min``, or ``passed 3 min ago`` for a time gone by."""
    ahead = at - now
    return f"in {_span(ahead)}" if ahead >= 0 else f"passed {_span(-ahead)} ago"


def _span(seconds: float) -> str:
    """A duration in its two largest units: ``3 d 4 h``, ``2 h 5 min``, ``40 s``."""
    whole = round(seconds)
    units = [("d", 86_400), ("h", 3600), ("min", 60), ("s", 1)]
    parts: list[str] = []
    for name, size in units:
        if whole >= size or (name == "s" and not parts):
            count, whole = divmod(whole, size)
            parts.append(f"{count} {name}")
        if len(parts) == 2:
            break
        if parts and whole == 0:
            break
    return " ".join(parts)


def _answerers(answerers: Sequence[Answerer]) -> str:
    if not answerers:
        return "anyone (no person opened the turn)"
    return " or ".join(a.describe() for a in answerers)


def _how_to_answer(
    request: InputRequest, session: str, agent: str, store_flag: str, you: Sequence[str]
) -> list[str]:
    """How this request can be answered: at this terminal (and on the ``turnkit dev``
    page) when it names nobody or one of ``you``, and always through the Python API
    (or the HTTP server's /resume)."""
    python = (
        f"await runtime.session({agent!r}, {session!r}).resume("
        f"{request.turn_id!r}, {request.id!r}, <value>, by=<verified user id>)"
    )
    if request.answerers and named_answerer(you, request.answerers) is None:
        return [f"in Python: {python}"]
    where = f"--session {shlex.quote(session)}{store_flag}"
    answer = f"turnkit answer <{agent} agent folder> {where}"
    return [f"{answer}  (or on the turnkit dev page)", f"or in Python: {python}"]


def _archived(view: SessionView, store_flag: str) -> str:
    lines = [f"archived generations ({len(view.generations)})"]
    for n in view.generations:
        target = shlex.quote(f"{view.session_id}#g{n}")
        lines.append(f"  g{n}  turnkit show {target}{store_flag}")
    return "\n".join(lines)
