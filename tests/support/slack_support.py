"""A local stand-in for Slack's Web API and Slack's request signing: what the Slack
channel's tests and ``turnkit dev --slack``'s share."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

SECRET = "test-signing-secret"


@dataclass
class FakeSlack:
    """The Web API methods the channel uses, recording each call in order."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: How many of the next ``chat.update`` calls answer 429 with Retry-After: 1.
    rate_limited: int = 0
    #: An error every ``chat.postMessage`` answers with (``channel_not_found``…).
    post_error: str | None = None
    #: An error every ``chat.update`` answers with (``token_revoked``…).
    update_error: str | None = None
    #: The ``ts`` of each message posted, in order.
    posted: list[str] = field(default_factory=list)
    #: When the last call came (``time.monotonic()``).
    last_call: float = 0.0
    _next_ts: int = 1000

    async def handle(self, request: Request) -> Response:
        method = request.path_params["method"]
        raw = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            args = json.loads(raw or b"{}")
        else:
            args = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        self.calls.append((method, args))
        self.last_call = time.monotonic()
        if method == "chat.update" and self.rate_limited:
            self.rate_limited -= 1
            return JSONResponse(
                {"ok": False, "error": "ratelimited"}, status_code=429, headers={"Retry-After": "1"}
            )
        if method == "chat.postMessage" and self.post_error:
            return JSONResponse({"ok": False, "error": self.post_error})
        if method == "chat.update" and self.update_error:
            return JSONResponse({"ok": False, "error": self.update_error})
        self._next_ts += 1
        ts = f"{self._next_ts}.000"
        if method == "chat.postMessage":
            self.posted.append(ts)
        return JSONResponse({"ok": True, "ts": ts, "channel": "C1"})

    def of(self, method: str) -> list[dict[str, Any]]:
        return [args for m, args in self.calls if m == method]


def signed(body: bytes, *, secret: str = SECRET, at: int | None = None) -> dict[str, str]:
    timestamp = str(int(time.time()) if at is None else at)
    base = b"v0:" + timestamp.encode() + b":" + body
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature}


def mention(text: str, *, event_id: str) -> bytes:
    """The body of Slack's event for a mention of the bot (``<@B1>``) by user ``U1`` in
    channel ``C1``, saying ``text``."""
    event = {
        "type": "app_mention",
        "user": "U1",
        "channel": "C1",
        "ts": "7.7",
        "text": f"<@B1> {text}",
    }
    return json.dumps(
        {"type": "event_callback", "team_id": "T1", "event_id": event_id, "event": event}
    ).encode()
