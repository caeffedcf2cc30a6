"""Slack as a channel (``turnkit[slack]``): mentions and thread messages become
turns, replies stream into the thread, parked questions become Approve / Deny
buttons. See docs/slack.md."""

try:
    import slack_sdk  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "turnkit.slack needs slack_sdk and Starlette: pip install 'turnkit[slack]'"
    ) from exc

from ._channel import SlackChannel, session_of, slack_channel, turn_of
from ._pacing import EditPacer
from ._render import SlackThread

__all__ = ["EditPacer", "SlackChannel", "SlackThread", "session_of", "slack_channel", "turn_of"]
