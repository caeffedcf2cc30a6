"""``EditPacer``: how often the replies in one Slack channel may change.

Slack lets an app post or change about one message per second in a channel (short
bursts pass, more are refused with 429). The limit is the channel's, not one
message's: two replies streaming into one channel at once share it. So every reply
a ``SlackChannel`` renders asks one pacer, keyed by the Slack channel id, before a
streamed edit. A pacer is this process's only; what several processes send to one
channel is paced by Slack itself, with 429 and the ``Retry-After`` slack_sdk waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .._errors import ConfigurationError

#: Channels remembered before the ones whose last change is older than the interval
#: (and so no longer holds anything back) are forgotten.
_REMEMBERED = 1024


class EditPacer:
    """Spaces the streamed edits of every reply in a channel ``interval`` seconds
    apart. ``clock`` (``time.monotonic``) tells the time, in seconds."""

    def __init__(
        self, interval: float = 1.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not isinstance(interval, int | float) or interval < 0:
            raise ConfigurationError(f"EditPacer: interval must be seconds >= 0, got {interval!r}")
        self.interval = float(interval)
        self.clock = clock
        self._last: dict[str, float] = {}

    def take(self, channel: str) -> bool:
        """Whether a streamed edit in ``channel`` may go now; if so, it is counted at
        once (before the call is sent), so a reply asking meanwhile waits its turn."""
        now = self.clock()
        last = self._last.get(channel)
        if last is not None and now - last < self.interval:
            return False
        self._record(channel, now)
        return True

    def sent(self, channel: str) -> None:
        """Count a change that goes whatever the pace (a new message, the timeline, a
        reply's last edit): the streamed edits after it wait a full interval."""
        self._record(channel, self.clock())

    def _record(self, channel: str, now: float) -> None:
        self._last[channel] = now
        if len(self._last) > _REMEMBERED:
            self._last = {c: t for c, t in self._last.items() if now - t < self.interval}
