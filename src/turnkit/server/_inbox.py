"""``GET /inbox``: the caller's open questions across sessions and agents, paged.

A question is the caller's when it names them (under any of their names), names a
policy the agent's ``authorize_answer`` grants them, or names nobody and
``authorize`` lets them ``resume`` its session. Answering one is an ordinary
``POST …/resume`` on the session the item names.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._access.authorize import Authorize, SessionAccess, allowed
from .._access.principal import Principal
from .._runtime.client import RuntimeClient
from .._runtime.inbox import MAX_LIMIT
from .._seams.store import NO_MESSAGES
from ._bodies import HttpError, non_negative_int


async def inbox(
    runtime: RuntimeClient, authorize: Authorize, request: Request, principal: Principal
) -> Response:
    """One page: ``{"items": [...], "next": cursor or null}`` (``?limit=&after=``)."""
    params = request.query_params
    limit = non_negative_int(params.get("limit"), "limit", default=50)
    if not 1 <= limit <= MAX_LIMIT:
        raise HttpError(
            400, "invalid_parameter", f"limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )

    async def open_to(agent: str, session_id: str) -> bool:
        snap = await runtime.store.session(session_id).load(from_index=NO_MESSAGES)
        access = SessionAccess(
            agent=agent, session_id=session_id, owner=snap.owner, action="resume"
        )
        return await allowed(authorize, principal, access)

    try:
        page = await runtime.pending_inputs(
            principal.names,
            principal=principal,
            limit=limit,
            after=params.get("after") or None,
            open_to=open_to,
        )
    except ValueError as exc:
        raise HttpError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse({"items": [i.to_dict() for i in page.items], "next": page.next})
