"""Times in JSON: every time turnkit writes into a JSON body is an RFC 3339 UTC string.

The stores keep seconds since the epoch; the HTTP API and the command line's
``--json`` both turn them into text here, so a client parses one format everywhere.
"""

from __future__ import annotations

import time


def rfc3339(timestamp: float | None) -> str | None:
    """Seconds since the epoch as RFC 3339 in UTC, to the millisecond
    (``2026-12-03T13:07:36.412Z``); ``None`` stays ``None``."""
    if timestamp is None:
        return None
    seconds, millis = divmod(round(timestamp * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
