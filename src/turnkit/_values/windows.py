"""What a history policy decided, as stored records: the window each model step was
sent, and the summaries that stand in for the messages before a window.

Both are memoized steps (``window:<n>``, ``history:<turn_id>:<upto>``), written once
and read back by every later delivery in any process, so a replay sends exactly the
messages the first delivery sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import MessageDecodeError
from .messages import JsonObject
from .usage import Usage


def _int(data: dict[str, Any], key: str, what: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MessageDecodeError(f"{what}: {key} must be a non-negative integer, got {value!r}")
    return value


def _str(data: dict[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise MessageDecodeError(f"{what}: {key} must be a string, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class SummaryRef:
    """Where a summary is stored: its step id and the turn that owns the step."""

    step_id: str
    turn_id: str

    def to_dict(self) -> JsonObject:
        return {"step_id": self.step_id, "turn_id": self.turn_id}

    @classmethod
    def from_dict(cls, data: Any) -> SummaryRef:
        if not isinstance(data, dict):
            raise MessageDecodeError("summary reference: expected a JSON object")
        what = "summary reference"
        return cls(step_id=_str(data, "step_id", what), turn_id=_str(data, "turn_id", what))


@dataclass(frozen=True, kw_only=True)
class WindowRecord:
    """The window one model step was sent: the transcript from ``start``, after the
    summary of everything before it (``summary``, or none)."""

    start: int = 0
    summary: SummaryRef | None = None

    def to_dict(self) -> JsonObject:
        ref = self.summary.to_dict() if self.summary is not None else None
        return {"start": self.start, "summary": ref}

    @classmethod
    def from_dict(cls, data: Any) -> WindowRecord:
        if not isinstance(data, dict):
            raise MessageDecodeError("window: expected a JSON object")
        ref = data.get("summary")
        return cls(
            start=_int(data, "start", "window"),
            summary=SummaryRef.from_dict(ref) if ref is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class SummaryRecord:
    """A summary of the transcript before position ``upto``: the model's ``text``, and
    what the call that wrote it used."""

    text: str
    upto: int
    usage: Usage | None = None

    def to_dict(self) -> JsonObject:
        used = self.usage.to_dict() if self.usage is not None else None
        return {"text": self.text, "upto": self.upto, "usage": used}

    @classmethod
    def from_dict(cls, data: Any) -> SummaryRecord:
        if not isinstance(data, dict):
            raise MessageDecodeError("summary: expected a JSON object")
        used = data.get("usage")
        return cls(
            text=_str(data, "text", "summary"),
            upto=_int(data, "upto", "summary"),
            usage=Usage.from_dict(used) if used is not None else None,
        )
