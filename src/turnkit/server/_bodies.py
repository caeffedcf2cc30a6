"""Reading request bodies and parameters into checked values, or a clear refusal.

Every refusal is an ``HttpError`` whose message names the field and what was wrong;
the app turns it into a JSON error before anything reaches the runtime.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._access.principal import Principal
from .._errors import SessionBusyError, StoreError

log = logging.getLogger("turnkit.server")

#: Longest id (session, turn, input) accepted from a client.
MAX_ID_LENGTH = 200


class HttpError(Exception):
    """A request refused with ``status``; ``code`` is a stable slug for clients."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """The JSON body every refused request gets: the message and its ``code``."""
    return JSONResponse({"error": message, "code": code}, status_code=status)


async def refusing(
    handler: Callable[[Request, Principal], Awaitable[Response]],
    request: Request,
    principal: Principal,
) -> Response:
    """``handler``'s response, or the JSON error of its ``HttpError`` or of the store's
    passing trouble (a busy session, an unreachable database)."""
    try:
        return await handler(request, principal)
    except HttpError as exc:
        return error_response(exc.status, exc.code, exc.message)
    except SessionBusyError as exc:
        return error_response(503, "session_busy", str(exc))
    except StoreError as exc:
        log.warning("%s %s: the store failed: %s", request.method, request.url.path, exc)
        # The store's words stay in the log: a database's error text can quote
        # stored rows, name hosts or echo a query.
        return error_response(
            503, "store_unavailable", "the store could not answer; try again later"
        )


@dataclass(frozen=True, kw_only=True)
class TurnBody:
    text: str
    replace: bool = False
    turn_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResumeBody:
    turn_id: str
    input_id: str
    value: Any


async def read_object(
    request: Request, max_bytes: int, *, max_depth: int, optional: bool = False
) -> dict[str, Any]:
    """The body as a JSON object, refused when too large, nested more than
    ``max_depth`` arrays and objects deep, not JSON or not an object.

    With ``optional``, an empty body reads as ``{}``.
    """
    raw = await _read_limited(request, max_bytes)
    if not raw.strip() and optional:
        return {}
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise HttpError(
            415,
            "unsupported_media_type",
            f"the body must be application/json, not {media or 'unnamed'}",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(
            400, "invalid_json", f"the body is not UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    if nesting_exceeds(text, max_depth):
        # Checked before parsing: the parser recurses once per level, so a deep enough
        # body would otherwise exhaust the stack.
        raise HttpError(
            400,
            "too_deep",
            f"the body nests arrays and objects more than {max_depth} levels deep",
        )
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise HttpError(
            400,
            "invalid_json",
            f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except ValueError as exc:
        raise HttpError(400, "invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HttpError(
            400, "invalid_body", f"the body must be a JSON object, not {_json_kind(data)}"
        )
    _check_strings(data, "body")
    return data


#: The next character that matters to nesting outside strings: a bracket or a quote.
_STRUCTURAL = re.compile(r'[\[\]{}"]')
#: The rest of a JSON string after its opening quote, escapes included.
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def nesting_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays and objects inside each other.

    One pass without recursion, skipping strings (brackets in text do not nest), so
    its cost grows with the length, never the depth. On text that is not JSON the
    answer is a guess; the parser then says what is wrong.
    """
    if text.count("[") + text.count("{") <= limit:
        return False  # too few brackets to nest that deep, wherever they are
    depth = 0
    pos = 0
    while (found := _STRUCTURAL.search(text, pos)) is not None:
        char = found.group()
        pos = found.end()
        if char == '"':
            rest = _STRING_REST.match(text, pos)
            if rest is None:
                return False  # an unterminated string: not JSON at all
            pos = rest.end()
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def turn_body(data: dict[str, Any]) -> TurnBody:
    """``{"text", "replace"?, "turn_id"?}`` of ``/turns`` and ``/chat``."""
    _refuse_unknown(data, {"text", "replace", "turn_id"})
    text = _required(data, "text", str)
    if not text.strip():
        raise HttpError(400, "invalid_body", "text must not be empty")
    replace = data.get("replace", False)
    if not isinstance(replace, bool):
        raise HttpError(
            400, "invalid_body", f"replace must be a boolean, not {_json_kind(replace)}"
        )
    turn_id = data.get("turn_id")
    if turn_id is not None:
        turn_id = identifier(turn_id, "turn_id")
    return TurnBody(text=text, replace=replace, turn_id=turn_id)


def resume_body(data: dict[str, Any]) -> ResumeBody:
    """``{"turn_id", "input_id", "value"}`` of ``/resume``; ``value`` may be any JSON."""
    _refuse_unknown(data, {"turn_id", "input_id", "value"})
    turn_id = identifier(_required(data, "turn_id", str), "turn_id")
    input_id = identifier(_required(data, "input_id", str), "input_id")
    if "value" not in data:
        raise HttpError(400, "invalid_body", "value is missing (the answer; it may be null)")
    return ResumeBody(turn_id=turn_id, input_id=input_id, value=data["value"])


def wake_body(data: dict[str, Any]) -> str | None:
    """``{"turn_id"?}`` of ``/wake``: the parked turn to wake (default: the session's)."""
    _refuse_unknown(data, {"turn_id"})
    if "turn_id" not in data:
        return None
    return identifier(data["turn_id"], "turn_id")


def empty_body(data: dict[str, Any], what: str) -> None:
    """A body that takes no fields (``/reset``): ``{}`` or nothing."""
    if data:
        raise HttpError(400, "invalid_body", f"{what} takes no fields, got {sorted(data)}")


def identifier(value: Any, name: str) -> str:
    """A client-chosen id: a non-empty string of printable characters, not too long."""
    if not isinstance(value, str):
        raise HttpError(400, "invalid_body", f"{name} must be a string, not {_json_kind(value)}")
    if not value:
        raise HttpError(400, "invalid_body", f"{name} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise HttpError(400, "invalid_body", f"{name} is longer than {MAX_ID_LENGTH} characters")
    if not value.isprintable():
        raise HttpError(400, "invalid_body", f"{name} must not contain control characters")
    return value


def non_negative_int(raw: str | None, name: str, *, default: int) -> int:
    """A query parameter or header holding a count or sequence number."""
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise HttpError(
            400, "invalid_parameter", f"{name} must be a non-negative integer, got {raw[:40]!r}"
        )
    return int(raw)


def flag(raw: str | None, name: str) -> bool:
    """A yes-or-no query parameter: ``true`` or ``1``; ``false``, ``0`` or absent."""
    if raw is None or raw in ("", "false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise HttpError(400, "invalid_parameter", f"{name} must be true or false, got {raw[:40]!r}")


async def _read_limited(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> HttpError:
    return HttpError(
        413, "body_too_large", f"the body is larger than the limit of {max_bytes} bytes"
    )


def _required(data: dict[str, Any], name: str, kind: type) -> Any:
    if name not in data:
        raise HttpError(400, "invalid_body", f"{name} is missing")
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise HttpError(
            400, "invalid_body", f"{name} must be a {_KIND_NAMES[kind]}, not {_json_kind(value)}"
        )
    return value


def _refuse_unknown(data: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise HttpError(
            400,
            "invalid_body",
            f"unknown field(s) {', '.join(map(repr, unknown))}; expected {sorted(known)}",
        )


def _check_strings(value: Any, where: str) -> None:
    """Refuse text no store can keep: NUL characters and unpaired surrogates."""
    if isinstance(value, str):
        if "\0" in value:
            raise HttpError(400, "invalid_body", f"{where} contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise HttpError(
                400, "invalid_body", f"{where} contains an unpaired surrogate"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, f"{where} key")
            _check_strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{where}[{index}]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_KIND_NAMES: dict[type, str] = {str: "string", bool: "boolean", int: "number", dict: "object"}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
