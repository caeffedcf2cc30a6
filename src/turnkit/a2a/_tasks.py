"""A turn as an A2A task: its id, its state, the questions it waits on, its answer.

A task id *is* a turn id. Turns opened over A2A get ids that name their session
(``<session>~<token>``), so ``tasks/get`` and ``tasks/cancel``, which carry only the
task id, find the session (the task's context) without a second index; the token is
derived from the caller and the message id, so a message sent twice opens one turn.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict

from .._values.inputs import InputRequest
from .._values.records import TurnRecord, TurnStatus
from .._values.turns import result_from_record
from ..server.frontend import MAX_ID_LENGTH

#: Between a task id's session and its token; the token is hex, so the last one splits.
SEPARATOR = "~"
_TOKEN_CHARS = 32

#: A turn's status as the task state it reads as.
STATES: dict[TurnStatus, TaskState] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "suspended": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
#: States no message can move on (A2A's terminal states).
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
#: The name of the artifact holding a completed task's answer.
ANSWER = "answer"


def task_id_for(session_id: str, principal_id: str, message_id: str) -> str:
    """The turn (task) a message opens: the same caller sending the same message id
    into the same session gets the same id back, so a resend is a retry."""
    seed = f"{session_id}\0{principal_id}\0{message_id}".encode()
    token = hashlib.sha256(seed).hexdigest()[:_TOKEN_CHARS]
    return f"{session_id}{SEPARATOR}{token}"


def session_of(task_id: str) -> str:
    """The session (context) a task id names; an id no A2A call made is unknown."""
    session, sep, token = task_id.rpartition(SEPARATOR)
    if (
        not sep
        or not session
        or len(token) != _TOKEN_CHARS
        or any(c not in "0123456789abcdef" for c in token)
        or len(task_id) > MAX_ID_LENGTH
    ):
        raise TaskNotFoundError(f"no task {task_id[:80]!r}")
    return session


def max_context_length() -> int:
    """The longest context id that still leaves room for a task id's token."""
    return MAX_ID_LENGTH - len(SEPARATOR) - _TOKEN_CHARS


def task_of(record: TurnRecord, *, history_length: int | None = None) -> Task:
    """The task a stored turn reads as (``tasks/get``, and a blocking send's answer)."""
    state = STATES[record.status]
    status = TaskStatus(state=state)
    artifacts: list[Artifact] = []
    said = status_message(record)
    if said is not None:
        status.message.CopyFrom(said)
    if record.status == "completed":
        artifacts.append(
            Artifact(
                artifact_id=f"{record.turn_id}:{ANSWER}",
                name=ANSWER,
                parts=[new_text_part(record.text or "")],
            )
        )
    history = [opening_message(record)]
    if said is not None:
        history.append(said)
    if history_length is not None:
        history = history[-history_length:] if history_length > 0 else []
    return Task(
        id=record.turn_id,
        context_id=record.session_id,
        status=status,
        artifacts=artifacts,
        history=history,
    )


def opening_message(record: TurnRecord) -> Message:
    """The message that opened the turn, as the user's."""
    return Message(
        message_id=f"{record.turn_id}:opening",
        role=Role.ROLE_USER,
        context_id=record.session_id,
        task_id=record.turn_id,
        parts=[new_text_part(record.opening.text)],
    )


def status_message(record: TurnRecord) -> Message | None:
    """What the agent says with the task's state: its answer, its error, why it was
    cancelled, or every question it waits on; nothing while it works."""
    if record.status in ("queued", "running"):
        return None
    if record.status == "suspended":
        result = result_from_record(record)
        return questions_message(record.session_id, record.turn_id, result.requests)
    result = result_from_record(record)
    text = {
        "completed": result.text,
        "failed": result.error,
        "cancelled": f"cancelled ({result.reason})",
    }.get(record.status, "")
    return agent_message(record, [new_text_part(text or "")], suffix=record.status)


def agent_message(record: TurnRecord, parts: Sequence[Part], *, suffix: str) -> Message:
    return Message(
        message_id=f"{record.turn_id}:{suffix}",
        role=Role.ROLE_AGENT,
        context_id=record.session_id,
        task_id=record.turn_id,
        parts=list(parts),
    )


def questions_message(session_id: str, turn_id: str, requests: Sequence[InputRequest]) -> Message:
    """An ``input-required`` status message: every open question, as text to read and
    as data to answer by (``{"questions": [{"id", "prompt", "schema", "tool", "kind",
    "decision"}]}``; a decision's answer is its JSON form, ``{"decision": "approve"}``)."""
    lines = [f"- {r.prompt} (question {r.id!r})" for r in requests]
    noun = "question" if len(requests) == 1 else "questions"
    text = f"Waiting for an answer to {len(requests)} {noun}:\n" + "\n".join(lines)
    data = {
        "questions": [
            {
                "id": r.id,
                "prompt": r.prompt,
                "schema": r.schema,
                "tool": r.tool,
                "kind": r.kind,
                "decision": r.decision.to_dict() if r.decision is not None else None,
            }
            for r in requests
        ]
    }
    ids = ",".join(r.id for r in requests)
    return Message(
        message_id=f"{turn_id}:asked:{hashlib.sha256(ids.encode()).hexdigest()[:12]}",
        role=Role.ROLE_AGENT,
        context_id=session_id,
        task_id=turn_id,
        parts=[new_text_part(text), new_data_part(data)],
    )


def message_text(message: Message) -> str:
    """The text a message opens a turn with: its text parts, then its data parts as
    JSON; a message with neither is refused."""
    pieces: list[str] = []
    for part in message.parts:
        if part.HasField("text"):
            pieces.append(part.text)
        elif part.HasField("data"):
            pieces.append(json.dumps(_data(part), ensure_ascii=False, sort_keys=True))
    text = "\n".join(p for p in pieces if p)
    if not text.strip():
        raise InvalidParamsError("the message has no text or data part to open a turn with")
    return text


def answers_in(message: Message, open_questions: Sequence[InputRequest]) -> list[tuple[str, Any]]:
    """The answers a message gives a parked task, as (question id, value), in order.

    A data part ``{"answers": {<question id>: <value>, ...}}`` answers the questions
    it names, in the order the task lists them. Otherwise the message answers the
    task's only open question: with its first data part's value, else its text (read
    as JSON when the question has a schema and the text is JSON, so ``true`` answers
    a yes-or-no question)."""
    for part in message.parts:
        if part.HasField("data"):
            data = _data(part)
            if isinstance(data, dict) and set(data) == {"answers"}:
                given = data["answers"]
                if not isinstance(given, dict) or not given:
                    raise InvalidParamsError(
                        '"answers" must be an object from question ids to answers'
                    )
                # In the order the task asks them (a data part's object keeps none).
                order = {q.id: n for n, q in enumerate(open_questions)}
                return sorted(given.items(), key=lambda kv: order.get(kv[0], len(order)))
    if len(open_questions) != 1:
        ids = ", ".join(repr(q.id) for q in open_questions)
        raise InvalidParamsError(
            f"the task waits on {len(open_questions)} questions ({ids}): answer them with a "
            'data part {"answers": {<question id>: <answer>, ...}}'
        )
    question = open_questions[0]
    for part in message.parts:
        if part.HasField("data"):
            return [(question.id, _data(part))]
    text = "\n".join(p.text for p in message.parts if p.HasField("text"))
    if not text:
        raise InvalidParamsError(
            f"the message has no text or data part to answer question {question.id!r} with"
        )
    if question.schema is not None:
        try:
            return [(question.id, json.loads(text))]
        except ValueError:
            pass
    return [(question.id, text)]


def _data(part: Part) -> Any:
    """A data part's value, whole numbers as ints (protobuf keeps every number as a
    double, so ``3`` arrives as ``3.0``)."""
    return _ints(MessageToDict(part.data))


def _ints(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
