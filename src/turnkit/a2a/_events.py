"""A turn's story as A2A stream events: status updates while it works, and the
answer artifact and final status when it ends.

Text streams as ``working`` status updates whose message carries the new words
(metadata ``{"turnkit": "text-delta"}``): status messages are what a client shows
and then replaces, so partial text never piles up as artifacts. The turn's answer
is one artifact, ``answer``, sent once the turn completes, the same artifact
``tasks/get`` shows.
"""

from __future__ import annotations

import itertools
from typing import Any

from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InternalError
from google.protobuf.struct_pb2 import Struct
from pydantic_core import to_jsonable_python

from ..server.frontend import (
    Answered,
    Asked,
    Ended,
    Item,
    TextAdded,
    TextClosed,
    ToolCalled,
    ToolReturned,
)
from ._tasks import ANSWER, questions_message

Event = TaskStatusUpdateEvent | TaskArtifactUpdateEvent

_ENDINGS = {
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}


class Updates:
    """Spells one task's story items as A2A events."""

    def __init__(self, task_id: str, context_id: str) -> None:
        self.task_id = task_id
        self.context_id = context_id
        self._numbers = itertools.count(1)

    def events(self, item: Item) -> list[Event]:
        if isinstance(item, TextAdded):
            if item.kind != "text":
                return []  # reasoning is the model's own, not the task's to show
            meta = {"turnkit": "text-delta", "part": item.part, "step": item.message_id}
            return [self._status(TaskState.TASK_STATE_WORKING, [new_text_part(item.text)], meta)]
        if isinstance(item, TextClosed):
            if item.kind != "text" or not item.superseded:
                return []
            # Taken over mid-reply: the words sent for this part are void.
            meta = {"turnkit": "text-superseded", "part": item.part, "step": item.message_id}
            return [self._status(TaskState.TASK_STATE_WORKING, [], meta)]
        if isinstance(item, ToolCalled):
            call = {"id": item.call.id, "name": item.call.name, "input": item.call.input}
            return [self._data(TaskState.TASK_STATE_WORKING, {"tool_call": call})]
        if isinstance(item, ToolReturned):
            result = {
                "call_id": item.call_id,
                "name": item.name,
                "result": item.result,
                "error": item.error,
            }
            return [self._data(TaskState.TASK_STATE_WORKING, {"tool_result": result})]
        if isinstance(item, Asked):
            asked = questions_message(self.context_id, self.task_id, item.requests)
            return [self._event(TaskStatus(state=TaskState.TASK_STATE_INPUT_REQUIRED), asked)]
        if isinstance(item, Answered):
            answered = {"input_id": item.input_id, "call_id": item.call_id}
            return [self._data(TaskState.TASK_STATE_WORKING, {"answered": answered})]
        if isinstance(item, Ended):
            return self._ended(item)
        return []

    def _ended(self, item: Ended) -> list[Event]:
        if item.how == "broke":
            raise InternalError(
                f"following task {self.task_id} broke ({item.detail}); the task goes on: "
                "subscribe to it again or get it"
            )
        state = _ENDINGS.get(item.how)
        if state is None:
            return []  # parked: its input-required update was sent already
        events: list[Event] = []
        text = item.detail if item.how != "cancelled" else f"cancelled ({item.detail})"
        if item.how == "completed":
            events.append(
                TaskArtifactUpdateEvent(
                    task_id=self.task_id,
                    context_id=self.context_id,
                    artifact=Artifact(
                        artifact_id=f"{self.task_id}:{ANSWER}",
                        name=ANSWER,
                        parts=[new_text_part(item.detail)],
                    ),
                    last_chunk=True,
                )
            )
        message = Message(
            message_id=f"{self.task_id}:{item.how}",
            role=Role.ROLE_AGENT,
            context_id=self.context_id,
            task_id=self.task_id,
            parts=[new_text_part(text)],
        )
        events.append(self._event(TaskStatus(state=state), message))
        return events

    def _data(self, state: TaskState, data: dict[str, Any]) -> TaskStatusUpdateEvent:
        return self._status(state, [new_data_part(to_jsonable_python(data))], None)

    def _status(
        self, state: TaskState, parts: list[Part], meta: dict[str, Any] | None
    ) -> TaskStatusUpdateEvent:
        message = Message(
            message_id=f"{self.task_id}:update:{next(self._numbers)}",
            role=Role.ROLE_AGENT,
            context_id=self.context_id,
            task_id=self.task_id,
            parts=parts,
        )
        event = self._event(TaskStatus(state=state), message)
        if meta is not None:
            event.metadata.CopyFrom(_struct(meta))
        return event

    def _event(self, status: TaskStatus, message: Message) -> TaskStatusUpdateEvent:
        status.message.CopyFrom(message)
        return TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )


def _struct(values: dict[str, Any]) -> Struct:
    struct = Struct()
    struct.update(values)
    return struct
