"""Where a turn came from: the inbound event a channel delivered, or a proactive trigger.

These are plain values: the channel that builds an ``InboundEvent`` vouches for its
``source`` and for whether ``user.attested`` is true; nothing a user typed sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import MessageDecodeError
from .messages import JsonObject
from .text import clean_fields


@dataclass(frozen=True, kw_only=True)
class User:
    """Who spoke. ``attested`` is true only when the platform signed the identity."""

    id: str
    attested: bool = False


@dataclass(frozen=True, kw_only=True)
class InboundEvent:
    """A platform message as a channel delivered it. ``raw`` is never stored."""

    source: str
    text: str
    user: User | None = None
    channel_id: str | None = None
    thread_id: str | None = None
    kind: str = "message"
    raw: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # The source picks the turn's policy, so it must name a channel.
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"InboundEvent.source must be a non-empty str, got {self.source!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"InboundEvent.text must be a str, got {type(self.text).__name__}")
        if self.user is not None and not isinstance(self.user, User):
            raise ValueError(f"InboundEvent.user must be a User, got {type(self.user).__name__}")
        clean_fields(self, ("text", "channel_id", "thread_id", "kind"))

    def to_dict(self) -> JsonObject:
        """The stored form: everything but ``raw``."""
        return {
            "source": self.source,
            "text": self.text,
            "user": {"id": self.user.id, "attested": self.user.attested} if self.user else None,
            "channel_id": self.channel_id,
            "thread_id": self.thread_id,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: object) -> InboundEvent:
        if not isinstance(data, dict):
            raise MessageDecodeError("inbound event: expected a JSON object")
        try:
            user = data.get("user")
            return cls(
                source=data["source"],
                text=data["text"],
                user=User(id=str(user["id"]), attested=bool(user["attested"])) if user else None,
                channel_id=data.get("channel_id"),
                thread_id=data.get("thread_id"),
                kind=str(data.get("kind", "message")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageDecodeError(f"inbound event: missing or malformed field {exc}") from None


@dataclass(frozen=True, kw_only=True)
class Proactive:
    """Marks a turn that no person opened; ``by`` names what did (``"cron:daily"``).

    ``source`` is the channel the turn is for (``receive`` sets it to the delivering
    channel's), so that source's policy applies as to an inbound turn.
    """

    by: str
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.by, str) or not self.by:
            raise ValueError(f"Proactive.by must be a non-empty str, got {self.by!r}")
        if self.source is not None and (not isinstance(self.source, str) or not self.source):
            raise ValueError(f"Proactive.source must be a non-empty str, got {self.source!r}")
