"""Who may answer a parked turn, and the grants that prove a policy said yes.

A resume is checked synchronously against the stored request: a ``user`` answerer
admits only that verified ``by``; a ``policy`` answerer admits only a ``Grant``
for exactly that policy and scope, on that session, turn, input and generation.
A ``Grant`` is sealed with a key that lives only in the runtime's memory by
``grant_answer``, after the agent's ``authorize_answer`` said yes (or, for a
subagent's child, after the parent's answer was found stored), so one built by
hand, altered or reused after a reset is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import jsonschema

from .._errors import ResumeAuthorizationError
from .._values.inputs import Answerer, InputRequest


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
    input request of one generation of a session. Only ``grant_answer`` makes one
    that ``resume`` accepts."""

    session_id: str
    turn_id: str
    input_id: str
    #: The session's generation when the grant was issued: a reset voids it.
    generation: int
    policy: str
    scope: str | None
    by: str | None
    seal: str = field(default="", repr=False)


#: What a grant says, as plain values: session, turn, input, generation, policy,
#: scope and by.
Claim: TypeAlias = tuple[str, str, str, int, str, str | None, str | None]
_TEXT = ("session_id", "turn_id", "input_id", "policy", "seal")
_TEXT_OR_NONE = ("scope", "by")


def _claim_of(granted: object) -> tuple[Claim, str] | None:
    """The claim and seal of ``granted`` if it is exactly a ``Grant`` whose fields are
    exactly ``str``/``int``/``None``, else ``None``. Reads the instance's own field
    values and calls none of its methods, so a subclass or a field of a ``str``
    subclass cannot make it say what it was not sealed with."""
    if type(granted) is not Grant:
        return None
    values = vars(granted)
    if not all(type(values.get(name)) is str for name in _TEXT):
        return None
    if not all(values.get(name) is None or type(values[name]) is str for name in _TEXT_OR_NONE):
        return None
    if type(values.get("generation")) is not int:
        return None
    claim: Claim = (
        values["session_id"],
        values["turn_id"],
        values["input_id"],
        values["generation"],
        values["policy"],
        values["scope"],
        values["by"],
    )
    return claim, values["seal"]


class GrantSealer:
    """Seals and checks grants with a key that lives only in this runtime's memory.

    Internal: the runtime keeps it private. ``grant_answer`` (after
    ``authorize_answer``) and the subagent path (after finding the parent's stored
    answer) are the only code that issues grants.
    """

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, claim: Claim) -> str:
        payload = json.dumps(claim, separators=(",", ":")).encode()
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    def issue(
        self,
        *,
        session_id: str,
        generation: int,
        request: InputRequest,
        answerer: Answerer,
        by: str | None,
    ) -> Grant:
        """A grant admitting ``by`` for the policy ``answerer`` on ``request``."""
        assert answerer.kind == "policy" and answerer.policy is not None
        claim: Claim = (
            session_id,
            request.turn_id,
            request.id,
            generation,
            answerer.policy,
            answerer.scope,
            by,
        )
        return Grant(
            session_id=session_id,
            turn_id=request.turn_id,
            input_id=request.id,
            generation=generation,
            policy=answerer.policy,
            scope=answerer.scope,
            by=by,
            seal=self._mac(claim),
        )

    def verified(self, granted: object) -> Claim:
        """What ``granted`` claims, if this sealer issued it unaltered; else
        ``ResumeAuthorizationError``."""
        found = _claim_of(granted)
        if found is not None:
            claim, seal = found
            if hmac.compare_digest(seal.encode(), self._mac(claim).encode()):
                return claim
        raise ResumeAuthorizationError(
            "the grant was not issued by grant_answer in this runtime (or was altered); "
            "get one with `await turnkit.grant_answer(session, resume, authorize_answer)`"
        )


def check_answerer(
    request: InputRequest,
    *,
    session_id: str,
    generation: int,
    by: str | None,
    granted: Grant | None,
    sealer: GrantSealer,
) -> None:
    """Raise ``ResumeAuthorizationError`` unless one of the request's answerers admits
    this resume. A request with no answerers admits anyone."""
    if not request.answerers:
        return
    claim = sealer.verified(granted) if granted is not None else None
    if (
        claim is not None
        and claim[:3] == (session_id, request.turn_id, request.id)
        and claim[3] != generation
    ):
        raise ResumeAuthorizationError(
            f"the grant was issued for generation {claim[3]} of session {session_id}; "
            f"the session was reset since (it is in generation {generation}), so the "
            "grant answers nothing any more"
        )
    for answerer in request.answerers:
        if answerer.kind == "user":
            if by is not None and by == answerer.user_id:
                return
        elif claim is not None and claim == (
            session_id,
            request.turn_id,
            request.id,
            generation,
            answerer.policy,
            answerer.scope,
            by,
        ):
            return
    wanted = ", ".join(a.describe() for a in request.answerers)
    given = f"by={by!r}" + (
        f" with a grant for policy {claim[4]!r} (scope {claim[5]!r})" if claim else ""
    )
    raise ResumeAuthorizationError(
        f"input {request.id!r} of turn {request.turn_id} may be answered only by {wanted}; "
        f"this resume came {given}"
    )


def check_answer(request: InputRequest, value: Any) -> None:
    """Raise ``ValueError`` if ``value`` breaks the request's schema, or, for a
    decision, is not one the request allows (an edit's arguments are checked
    against the tool's input schema)."""
    if request.decision is not None:
        try:
            request.decision.check(value)
        except ValueError as exc:
            raise ValueError(f"the answer to input {request.id!r}: {exc}") from None
        return
    if request.schema is None:
        return
    try:
        jsonschema.validate(value, request.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the answer"
        raise ValueError(
            f"the answer to input {request.id!r} does not match its schema: {where}: {exc.message}"
        ) from None
