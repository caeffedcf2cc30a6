"""What a session remembers between deliveries, so the next reads only what is new.

It is a cache: every delivery checks it against the store's generation and falls
back to reading the whole transcript.
"""

from __future__ import annotations

from .._values.messages import Message
from .context_window import WindowCache


class KnownTranscript:
    """The transcript a session's last delivery ended with, kept so the next delivery
    reads only the messages committed since (positions are append-only within a
    generation, and committed messages never change)."""

    __slots__ = ("finished", "generation", "messages", "window")

    def __init__(self) -> None:
        self.messages: list[Message] | None = None
        self.generation = 0
        #: The turn that delivery ran, if it ended for good (completed or cancelled:
        #: states no redelivery can change), so the next opening need not look it up.
        self.finished: str | None = None
        #: The window the latest model step was sent under the history policy.
        self.window: WindowCache | None = None

    def forget(self) -> None:
        self.messages = None
        self.finished = None
        self.window = None
