"""Who may answer a parked turn, and the grants that prove a policy said yes.

A resume is checked synchronously against the stored request: a ``user`` answerer
admits only that verified ``by``; a ``policy`` answerer admits only a ``Grant``
for exactly that policy and scope. A ``Grant`` is sealed with the runtime's secret
key by ``grant_answer``, after the agent's ``authorize_answer`` said yes, so one
built by hand (or altered) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field, fields
from typing import Any

import jsonschema

from .._errors import ResumeAuthorizationError
from .._values.inputs import InputRequest


@dataclass(frozen=True, kw_only=True)
class ResumeRequest:
    """A resume to be authorized: the answer and who gives it."""

    turn_id: str
    input_id: str
    value: Any
    by: str | None = None
    principal: Any = None


@dataclass(frozen=True, kw_only=True)
class Grant:
    """Proof that ``authorize_answer`` admitted ``by`` for ``policy``/``scope`` on one
    input request. Only ``grant_answer`` makes one that ``resume`` accepts."""

    session_id: str
    turn_id: str
    input_id: str
    policy: str
    scope: str | None
    by: str | None
    seal: str = field(default="", repr=False)

    def _payload(self) -> bytes:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seal"}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class GrantSealer:
    """Seals and checks grants with a key that lives only in this runtime's memory."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, grant: Grant) -> str:
        return hmac.new(self._key, grant._payload(), hashlib.sha256).hexdigest()

    def seal(self, grant: Grant) -> Grant:
        return Grant(
            session_id=grant.session_id,
            turn_id=grant.turn_id,
            input_id=grant.input_id,
            policy=grant.policy,
            scope=grant.scope,
            by=grant.by,
            seal=self._mac(grant),
        )

    def genuine(self, grant: Grant) -> bool:
        return isinstance(grant, Grant) and hmac.compare_digest(grant.seal, self._mac(grant))


def check_answerer(
    request: InputRequest,
    *,
    session_id: str,
    by: str | None,
    granted: Grant | None,
    sealer: GrantSealer,
) -> None:
    """Raise ``ResumeAuthorizationError`` unless one of the request's answerers admits
    this resume. A request with no answerers admits anyone."""
    if not request.answerers:
        return
    if granted is not None and not sealer.genuine(granted):
        raise ResumeAuthorizationError(
            "the grant was not issued by grant_answer in this runtime (or was altered); "
            "get one with `await turnkit.grant_answer(session, resume, authorize_answer)`"
        )
    for answerer in request.answerers:
        if answerer.kind == "user":
            if by is not None and by == answerer.user_id:
                return
        elif (
            granted is not None
            and granted.policy == answerer.policy
            and granted.scope == answerer.scope
            and granted.session_id == session_id
            and granted.turn_id == request.turn_id
            and granted.input_id == request.id
            and granted.by == by
        ):
            return
    wanted = ", ".join(a.describe() for a in request.answerers)
    given = f"by={by!r}" + (
        f" with a grant for policy {granted.policy!r} (scope {granted.scope!r})" if granted else ""
    )
    raise ResumeAuthorizationError(
        f"input {request.id!r} of turn {request.turn_id} may be answered only by {wanted}; "
        f"this resume came {given}"
    )


def check_answer(request: InputRequest, value: Any) -> None:
    """Raise ``ResumeConflictError``-free ``ValueError`` if ``value`` breaks the schema."""
    if request.schema is None:
        return
    try:
        jsonschema.validate(value, request.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the answer"
        raise ValueError(
            f"the answer to input {request.id!r} does not match its schema: {where}: {exc.message}"
        ) from None
