"""``replay``: a recorded session as a regression test for a changed agent.

The recording (a session in a store, or a file ``turnkit export`` wrote) is played
again, turn by turn, through a fresh in-memory runtime running the agent under
test: the recorded model replies are its model (``model="recorded"``), its tools
run for real (``tools="run"``) or answer with the recorded results
(``tools="recorded"``), and each question a tool asks gets the answer recorded for
it. After each turn the new transcript is compared with the recorded one, step by
step; the first difference is the report's ``divergence``: which turn, which step
(``model:<n>``, ``tool:<n>:<call_id>``), what was expected and what came.

Before a recorded reply is handed to the engine its tool calls are checked against
the tools the agent offers now, so a tool renamed or removed, or a schema that no
longer takes the recorded arguments, is named at the call, not later as a
different result.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

import jsonschema

from .._engine.agent import Agent
from .._engine.tools import Tool
from .._runtime.exported import recorded_from_json
from .._runtime.recorded import RecordedSession, read_recorded
from .._runtime.runtime import Runtime
from .._seams.model import Model, ModelDelta, ModelDone, TextDelta, ToolSpec
from .._seams.store import Store
from .._values.events import InputAnsweredEvent
from .._values.inbound import Proactive
from .._values.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    ToolMessage,
    TriggerMessage,
)
from .._values.step_ids import input_step_id, model_step_id, tool_step_id
from .._values.turns import TurnResult
from ..stores.memory import MemoryStore

DivergenceKind: TypeAlias = Literal[
    "tool_call", "arguments", "tool_result", "answer", "message", "status", "park"
]


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """Where the replay first differed from the recording.

    ``kind``: ``tool_call`` (another tool, or one the agent no longer has),
    ``arguments`` (other arguments, or recorded ones the tool's schema now refuses),
    ``tool_result``, ``answer`` (the final text), ``message`` (a message missing,
    extra or of another kind), ``status`` (the turn ended otherwise) or ``park``
    (a question the recording has no answer for)."""

    turn_id: str
    step_id: str
    kind: DivergenceKind
    expected: Any
    actual: Any
    detail: str

    def __str__(self) -> str:
        return f"turn {self.turn_id}, step {self.step_id} ({self.kind}): {self.detail}"


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    """What a replay compared: the recording (``source``), how many turns and steps
    it played, and the first ``divergence`` (``None``: the agent did as recorded)."""

    source: str
    turns: int
    steps: int
    divergence: Divergence | None

    @property
    def same(self) -> bool:
        return self.divergence is None

    def check(self) -> None:
        """Raise ``ReplayDivergenceError`` (an ``AssertionError``) if it diverged."""
        if self.divergence is not None:
            raise ReplayDivergenceError(self)

    def __str__(self) -> str:
        if self.divergence is None:
            return (
                f"replay of {self.source}: {self.turns} turn(s), {self.steps} step(s) as recorded"
            )
        return f"replay of {self.source} diverged at {self.divergence}"


class ReplayDivergenceError(AssertionError):
    """A replay that did not do what was recorded; ``report`` says where."""

    def __init__(self, report: ReplayReport) -> None:
        super().__init__(str(report))
        self.report = report


Recording: TypeAlias = "str | os.PathLike[str] | dict[str, Any] | Store | RecordedSession"


async def replay(
    recorded: Recording,
    agent: Agent,
    *,
    session: str | None = None,
    tools: Literal["run", "recorded"] = "run",
    model: Literal["recorded", "agent"] = "recorded",
) -> ReplayReport:
    """Play ``recorded`` again with ``agent`` and report the first divergence.

    ``recorded`` is an exported file's path, its parsed JSON, or a ``Store`` with
    ``session`` naming the session (``"s1"``, or ``"s1#g0"`` for an archived
    generation). ``tools="recorded"`` answers every call of a ``Tool`` with the
    recorded result instead of running it (tool sources still run);
    ``model="agent"`` asks the agent's own model instead of replaying the recorded
    replies, to see where a new model or prompt departs from the recording.
    """
    source = await _recording(recorded, session)
    check = _Checks(source)
    run_model: Model = agent.model if model == "agent" else _RecordedModel(source, check)
    run_tools = _recorded_tools(agent, source) if tools == "recorded" else list(agent.tools)
    under_test = replace(agent, model=run_model, tools=run_tools)
    async with Runtime([under_test], store=MemoryStore()) as runtime:
        return await _Replayer(source, runtime, under_test, check).run()


async def _recording(recorded: Recording, session: str | None) -> RecordedSession:
    if isinstance(recorded, RecordedSession):
        return recorded
    if isinstance(recorded, dict):
        return recorded_from_json(recorded)
    if isinstance(recorded, str | os.PathLike):
        return recorded_from_json(json.loads(Path(recorded).read_text(encoding="utf-8")))
    if session is None:
        raise TypeError("replay from a store needs session= (a session id, or SESSION#gN)")
    name, _, generation = session.partition("#g")
    gen = int(generation) if generation.isdigit() else None
    return await read_recorded(recorded.session(name), gen)


def _replies(source: RecordedSession) -> list[tuple[int, ModelReply]]:
    """Each recorded model step, in order: its position and reply (the step's memo,
    else the assistant message it wrote)."""
    steps: dict[str, Any] = {}
    for turn in source.turns:
        steps.update(turn.steps)
    found = []
    for i, m in enumerate(source.messages):
        if isinstance(m, AssistantMessage):
            memo = steps.get(model_step_id(i))
            reply = (
                ModelReply.from_dict(memo)
                if isinstance(memo, dict)
                else ModelReply(
                    text=m.text,
                    tool_calls=m.tool_calls,
                    stop=m.stop,
                    provider_state=m.provider_state,
                    usage=m.usage,
                )
            )
            found.append((i, reply))
    return found


class _Checks:
    """Divergences found while the turn runs (a recorded call the current tools
    refuse), ordered by where they happened."""

    def __init__(self, source: RecordedSession) -> None:
        self.source = source
        self.found: list[tuple[tuple[int, int], Divergence]] = []

    def calls(self, position: int, reply: ModelReply, specs: Sequence[ToolSpec]) -> None:
        offered = {s.name: s for s in specs}
        turn_id = self.source.messages[position].turn_id
        for k, call in enumerate(reply.tool_calls):
            step = tool_step_id(position, call.id)
            spec = offered.get(call.name)
            if spec is None:
                detail = (
                    f"the recording calls tool {call.name!r}, which the agent no longer "
                    f"offers (it offers {sorted(offered)})"
                )
                self._add((position, k), turn_id, step, "tool_call", call.name, None, detail)
                continue
            validator = jsonschema.validators.validator_for(spec.input_schema)(spec.input_schema)
            errors = sorted(e.message for e in validator.iter_errors(call.input))
            if errors:
                detail = (
                    f"the recorded arguments {call.input!r} no longer fit the schema of tool "
                    f"{call.name!r}: {'; '.join(errors)}"
                )
                self._add(
                    (position, k), turn_id, step, "arguments", call.input, spec.input_schema, detail
                )

    def _add(
        self,
        where: tuple[int, int],
        turn_id: str,
        step_id: str,
        kind: DivergenceKind,
        expected: Any,
        actual: Any,
        detail: str,
    ) -> None:
        self.found.append(
            (
                where,
                Divergence(
                    turn_id=turn_id,
                    step_id=step_id,
                    kind=kind,
                    expected=expected,
                    actual=actual,
                    detail=detail,
                ),
            )
        )


class _RecordedModel:
    """The recorded replies, in the order they were made, as a ``Model``."""

    def __init__(self, source: RecordedSession, check: _Checks) -> None:
        self._replies = _replies(source)
        self._next = 0
        self._check = check

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        if self._next >= len(self._replies):
            raise _Exhausted(f"the recording has {len(self._replies)} model replies, no more")
        position, reply = self._replies[self._next]
        self._next += 1
        self._check.calls(position, reply, tools)
        if reply.text:
            yield TextDelta(text=reply.text)
        yield ModelDone(reply=reply)


class _Exhausted(Exception):
    """The replay asked the model more often than the recording did (the turn
    fails with this, which the replay reports as a divergence)."""


def _recorded_tools(agent: Agent, source: RecordedSession) -> list[Any]:
    """The agent's tools, each ``Tool`` answering with the recorded result of the
    call at the same step (``ctx.step_id``) instead of running."""
    results: dict[str, ToolMessage] = {}
    reply = -1
    for i, m in enumerate(source.messages):
        if isinstance(m, AssistantMessage):
            reply = i
        elif isinstance(m, ToolMessage):
            results[tool_step_id(reply, m.call_id)] = m

    def stub(tool: Tool) -> Tool:
        async def run(input: Any, ctx: Any) -> Any:
            recorded = results.get(ctx.step_id)
            if recorded is None:
                raise RuntimeError(f"the recording has no result for {ctx.step_id}")
            if recorded.is_error:
                raise RuntimeError(str(recorded.result))
            return recorded.result

        return Tool(spec=tool.spec, run=run, needs_store=False)

    return [stub(t) if isinstance(t, Tool) else t for t in agent.tools]


class _Replayer:
    def __init__(
        self, source: RecordedSession, runtime: Runtime, agent: Agent, check: _Checks
    ) -> None:
        self.source = source
        self.runtime = runtime
        self.session = runtime.session(agent.name, source.session_id)
        self.check = check
        self.expected = source.messages
        self.records = {t.turn_id: t for t in source.turns}
        self.steps = 0
        self.turns = 0

    def _report(self, divergence: Divergence | None) -> ReplayReport:
        return ReplayReport(
            source=self.source.source, turns=self.turns, steps=self.steps, divergence=divergence
        )

    async def run(self) -> ReplayReport:
        order = list(dict.fromkeys(m.turn_id for m in self.expected))
        for turn_id in order:
            self.turns += 1
            end = max(i for i, m in enumerate(self.expected) if m.turn_id == turn_id) + 1
            result, problem = await self._play(turn_id)
            actual = await self.session.messages()
            found = self._compare(turn_id, actual, end)
            if problem is not None and found is None:
                found = problem
            found = self._earliest(found)
            if found is not None:
                return self._report(found)
            if result is not None:
                status = self._status(turn_id, result)
                if status is not None:
                    return self._report(status)
        return self._report(self._earliest(None))

    async def _play(self, turn_id: str) -> tuple[TurnResult | None, Divergence | None]:
        opening = next(m for m in self.expected if m.turn_id == turn_id)
        recorded = self.records.get(turn_id)
        event = recorded.record.event if recorded is not None and recorded.record else None
        trigger = (
            Proactive(by=opening.by, source=event.source if event is not None else None)
            if isinstance(opening, TriggerMessage)
            else None
        )
        event = event if trigger is None else None
        text = getattr(opening, "text", "")
        tid = self.session.start(text, turn_id=turn_id, trigger=trigger, event=event)
        result = await self.session.result(tid)
        while result.status == "suspended":
            answered = await self._answer(turn_id, result)
            if isinstance(answered, Divergence) or answered is None:
                return result, answered
            result = answered
        return result, None

    async def _answer(self, turn_id: str, result: TurnResult) -> TurnResult | Divergence | None:
        """Answer the park with the recorded answers; ``None`` when the recording
        ends parked on the same questions (nothing more to play)."""
        steps = self.records[turn_id].steps if turn_id in self.records else {}
        answers = {
            e.input_id: e
            for e in self.source.events
            if isinstance(e, InputAnsweredEvent) and e.turn_id == turn_id
        }
        record = self.records[turn_id].record if turn_id in self.records else None
        for request in result.requests:
            memo = steps.get(input_step_id(turn_id, request.id))
            if isinstance(memo, dict) and "value" in memo:
                value, by = memo["value"], memo.get("by")
            elif request.id in answers:
                value, by = answers[request.id].value, answers[request.id].by
            else:
                pending = record.pending if record is not None else None
                asked = {r.id for r in pending.requests} if pending is not None else set()
                if record is not None and record.status == "suspended" and request.id in asked:
                    return None
                detail = (
                    f"the turn asked {request.id!r} ({request.prompt!r}), which the "
                    "recording never answered"
                )
                step = f"input:{turn_id}:{request.id}"
                return self._divergence(turn_id, "park", None, request.to_dict(), detail, step)
            await self.session.resume(turn_id, request.id, value, by=by)
        return await self.session.result(turn_id)

    def _status(self, turn_id: str, result: TurnResult) -> Divergence | None:
        record = self.records.get(turn_id)
        if record is None or record.record is None:
            return None
        expected = record.record.status
        if expected in ("running", "queued") or result.status == expected:
            return None
        detail = f"the turn ended {result.status}, the recording {expected}"
        if result.error:
            detail += f" ({result.error})"
        return self._divergence(turn_id, "status", expected, result.status, detail, "turn")

    def _compare(self, turn_id: str, actual: list[Message], end: int) -> Divergence | None:
        start = next(i for i, m in enumerate(self.expected) if m.turn_id == turn_id)
        reply = -1
        for i in range(start, max(end, len(actual))):
            want = self.expected[i] if i < end else None
            got = actual[i] if i < len(actual) else None
            if isinstance(want, AssistantMessage):
                reply = i
                self.steps += 1
                found = self._compare_reply(turn_id, i, want, got)
            elif isinstance(want, ToolMessage):
                self.steps += 1
                found = self._compare_result(turn_id, reply, want, got)
            elif want is None or got is None or want.to_dict() != got.to_dict():
                found = self._divergence(
                    turn_id,
                    "message",
                    None if want is None else want.to_dict(),
                    None if got is None else got.to_dict(),
                    f"message {i}: expected {_kind(want)}, got {_kind(got)}",
                    f"message:{i}",
                )
            else:
                found = None
            if found is not None:
                return found
        return None

    def _compare_reply(
        self, turn_id: str, i: int, want: AssistantMessage, got: Message | None
    ) -> Divergence | None:
        step = model_step_id(i)
        if not isinstance(got, AssistantMessage):
            detail = f"expected a model reply at {i}, got {_kind(got)}"
            return self._divergence(turn_id, "message", want.to_dict(), _dict(got), detail, step)
        names = [c.name for c in want.tool_calls]
        if names != [c.name for c in got.tool_calls]:
            detail = f"expected calls {names}, got {[c.name for c in got.tool_calls]}"
            return self._divergence(
                turn_id, "tool_call", names, [c.name for c in got.tool_calls], detail, step
            )
        for a, b in zip(want.tool_calls, got.tool_calls, strict=True):
            if a.input != b.input:
                detail = f"tool {a.name!r} called with {b.input!r}, recorded {a.input!r}"
                return self._divergence(
                    turn_id, "arguments", a.input, b.input, detail, tool_step_id(i, b.id)
                )
        if not want.tool_calls and want.text != got.text:
            detail = f"answered {got.text!r}, recorded {want.text!r}"
            return self._divergence(turn_id, "answer", want.text, got.text, detail, step)
        return None

    def _compare_result(
        self, turn_id: str, reply: int, want: ToolMessage, got: Message | None
    ) -> Divergence | None:
        step = tool_step_id(reply, want.call_id)
        if not isinstance(got, ToolMessage) or got.call_id != want.call_id:
            detail = f"expected the result of {want.name!r} ({want.call_id}), got {_kind(got)}"
            return self._divergence(turn_id, "message", want.to_dict(), _dict(got), detail, step)
        if (want.result, want.is_error) != (got.result, got.is_error):
            kind = "an error" if got.is_error else "a result"
            detail = f"tool {want.name!r} returned {kind} {got.result!r}, recorded {want.result!r}"
            return self._divergence(turn_id, "tool_result", want.result, got.result, detail, step)
        return None

    def _earliest(self, found: Divergence | None) -> Divergence | None:
        """``found`` or a divergence the checks saw before it (at the same step, the
        check's, which says why)."""
        if not self.check.found:
            return found
        where, first = min(self.check.found, key=lambda f: f[0])
        if found is None or where <= _where(found.step_id, self.expected):
            return first
        return found

    def _divergence(
        self,
        turn_id: str,
        kind: DivergenceKind,
        expected: Any,
        actual: Any,
        detail: str,
        step_id: str = "turn",
    ) -> Divergence:
        return Divergence(
            turn_id=turn_id,
            step_id=step_id,
            kind=kind,
            expected=expected,
            actual=actual,
            detail=detail,
        )


def _where(step_id: str, messages: list[Message]) -> tuple[int, int]:
    """A step's place, to order divergences: ``(position, call index)``."""
    kind, _, rest = step_id.partition(":")
    if kind == "model" and rest.isdigit():
        return int(rest), -1
    if kind == "tool":
        n, _, call = rest.partition(":")
        if n.isdigit():
            reply = messages[int(n)] if int(n) < len(messages) else None
            ids = [c.id for c in reply.tool_calls] if isinstance(reply, AssistantMessage) else []
            return int(n), ids.index(call) if call in ids else len(ids)
    if kind == "message" and rest.isdigit():
        return int(rest), -1
    return len(messages), 0


def _kind(message: Message | None) -> str:
    if message is None:
        return "nothing"
    if isinstance(message, ToolMessage):
        return f"the result of {message.name!r} ({message.call_id})"
    return f"a {message.role} message"


def _dict(message: Message | None) -> Any:
    return None if message is None else message.to_dict()
