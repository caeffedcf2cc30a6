"""What a front end served beside the app is given: the public face of ``create_app``
for a protocol package of its own (``turnkit.a2a``; ``turnkit.server.aisdk`` and
``agui`` use the same).

A ``Frontend`` returns routes for a ``FrontendHost``, which reaches the runtime
through the app's own checks (``Target``: one agent's session, authorized);
``followed`` and ``EventFeed`` follow a turn's events from any process; ``Story``
tells a turn's events as the steps a client shows (text, tool calls, questions,
the ending); ``HttpError`` and ``identifier`` refuse bad input as the app does.
"""

from ._bodies import MAX_ID_LENGTH, HttpError, identifier
from ._feed import EventFeed
from ._frontend import Followed, Frontend, FrontendHost, Target, followed
from ._story import (
    Answered,
    Asked,
    Ended,
    Item,
    Story,
    TextAdded,
    TextClosed,
    ToolCalled,
    ToolReturned,
)

__all__ = [
    "MAX_ID_LENGTH",
    "Answered",
    "Asked",
    "Ended",
    "EventFeed",
    "Followed",
    "Frontend",
    "FrontendHost",
    "HttpError",
    "Item",
    "Story",
    "Target",
    "TextAdded",
    "TextClosed",
    "ToolCalled",
    "ToolReturned",
    "followed",
    "identifier",
]
