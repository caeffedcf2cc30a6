"""``grant_answer``: the one way to make a ``Grant`` that a resume accepts.

It asks the agent's ``authorize_answer`` about the session's pending request and
seals a grant only when it says yes, bound to the session's current generation;
nothing is stored until the resume.
"""

from __future__ import annotations

from .._errors import ConfigurationError, ResumeAuthorizationError, ResumeConflictError
from .._values.inputs import AnswerCheck, AuthorizeAnswer
from .approvals import Grant, ResumeRequest
from .session_client import SessionClient


async def grant_answer(
    session: SessionClient,
    resume: ResumeRequest,
    authorize_answer: AuthorizeAnswer | None = None,
) -> Grant:
    """Ask ``authorize_answer`` (the agent's, by default) whether ``resume.by`` may
    answer the session's pending request for its policy; return a sealed ``Grant``.

    Nothing is stored. If ``authorize_answer`` raises, the error propagates and the
    same answer can be tried again; if it says no, ``ResumeAuthorizationError``.
    """
    decide = authorize_answer or session.agent.authorize_answer
    if decide is None:
        raise ConfigurationError(
            f"agent {session.agent.name!r} has no authorize_answer, and none was passed"
        )
    parked = await session._parked_input()
    if parked is None:
        raise ResumeConflictError(f"session {session.session_id} is not waiting for input")
    requests, generation = parked
    request = next((r for r in requests if r.id == resume.input_id), None)
    if request is None or request.turn_id != resume.turn_id:
        waiting = ", ".join(repr(r.id) for r in requests)
        raise ResumeConflictError(
            f"session {session.session_id} waits for input {waiting} of turn "
            f"{requests[0].turn_id}, not {resume.input_id!r} of turn {resume.turn_id}"
        )
    policies = [a for a in request.answerers if a.kind == "policy"]
    if not policies:
        raise ResumeAuthorizationError(
            f"input {request.id!r} names no policy answerer, so no grant can answer it"
        )
    for answerer in policies:
        assert answerer.policy is not None
        check = AnswerCheck(
            policy=answerer.policy, scope=answerer.scope, by=resume.by, principal=resume.principal
        )
        if await decide(check) is True:
            return session._grants.issue(
                session_id=session.session_id,
                generation=generation,
                request=request,
                answerer=answerer,
                by=resume.by,
            )
    raise ResumeAuthorizationError(
        f"authorize_answer did not admit by={resume.by!r} for "
        + ", ".join(a.describe() for a in policies)
    )
