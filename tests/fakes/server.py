"""``FakeProvider``: a threaded HTTP server on 127.0.0.1 that plays scripted responses.

Each request takes the next ``Canned`` response, an SSE stream or a JSON error (or,
given ``respond``, the one that function builds from the request's body), and is kept
(path, headers, JSON body and its raw bytes) for assertions. Out of script it answers 400, which no
SDK retries, so a test that asks too often fails at once instead of hanging.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Canned:
    """One scripted HTTP response: ``events`` (SSE) when ``status`` is 200, else ``body``."""

    status: int = 200
    events: tuple[tuple[str | None, Any], ...] = ()
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""


def sse(events: tuple[tuple[str | None, Any], ...]) -> bytes:
    """Server-sent events: ``event:`` lines when named, ``data:`` as JSON (or raw text)."""
    out: list[str] = []
    for name, data in events:
        if name is not None:
            out.append(f"event: {name}")
        out.append("data: " + (data if isinstance(data, str) else json.dumps(data)))
        out.append("")
    return ("\n".join(out) + "\n").encode()


class FakeProvider:
    """``with FakeProvider(*responses) as server:`` serves them in order at ``server.url``."""

    def __init__(self, *responses: Canned, respond: Callable[[Any], Canned] | None = None) -> None:
        self._respond = respond
        self._script: deque[Canned] = deque(responses)
        self._lock = threading.Lock()
        self.requests: list[Received] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, *responses: Canned) -> None:
        with self._lock:
            self._script.extend(responses)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _next(self, request: Received) -> Canned:
        with self._lock:
            self.requests.append(request)
            if self._respond is not None:
                return self._respond(request.body)
            if self._script:
                return self._script.popleft()
        message = f"fake provider: no response scripted for request {len(self.requests)}"
        error = {"type": "invalid_request_error", "message": message}
        return Canned(status=400, body={"type": "error", "error": error})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one response per connection, closed at its end

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = json.loads(raw) if raw else None
                canned = provider._next(Received("POST", self.path, headers, body, raw))
                self._send(canned)

            def _send(self, canned: Canned) -> None:
                if canned.status == 200:
                    payload = sse(canned.events)
                    kind = "text/event-stream; charset=utf-8"
                else:
                    payload = json.dumps(canned.body).encode()
                    kind = "application/json"
                self.send_response(canned.status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(payload)))
                for name, value in canned.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler


def iter_blocks(body: Any, role: str) -> Iterator[dict[str, Any]]:
    """Every content block of every ``role`` message in an Anthropic request body."""
    for message in body["messages"]:
        if message["role"] == role and isinstance(message["content"], list):
            yield from message["content"]
