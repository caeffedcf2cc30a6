"""``RecordingSink``: an event sink that keeps every event, for assertions."""

from __future__ import annotations

from .._seams.sink import LocalEventSink
from .._values.events import TurnEvent


class RecordingSink(LocalEventSink):
    """Fans out like ``LocalEventSink`` and also appends each event to ``events``."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[TurnEvent] = []

    def emit(self, event: TurnEvent) -> None:
        self.events.append(event)
        super().emit(event)

    def types(self, turn_id: str | None = None) -> list[str]:
        """The event types in order, optionally for one turn."""
        return [e.type for e in self.events if turn_id is None or e.turn_id == turn_id]
