"""Whose sessions a caller may use: ``SessionAccess``, the ``authorize`` hook's shape
and the default, ``owner_only``.

``authenticate`` says who is calling; ``authorize(principal, access)`` says whether
they may do ``access.action`` to one session. The app asks before it touches the
session, and answers a refusal exactly as it answers a session that does not
exist, so a caller learns nothing about sessions that are not theirs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._errors import ConfigurationError
from .principal import Principal

#: What a request does to a session: ``read`` (transcript, pending request, event
#: feed), ``turn`` (start or replay a turn, which creates a new session), ``resume``
#: (answer its parked turn), ``reset`` (archive its history), ``list`` (see it in
#: the agent's session list), ``erase`` (delete its contents for good), ``wake``
#: (end its parked turn's waits on the clock early).
Action: TypeAlias = Literal["read", "turn", "resume", "reset", "list", "erase", "wake"]
ACTIONS: frozenset[str] = frozenset({"read", "turn", "resume", "reset", "list", "erase", "wake"})

Authorize: TypeAlias = Callable[[Principal, "SessionAccess"], "bool | Awaitable[bool]"]


@dataclass(frozen=True, kw_only=True)
class SessionAccess:
    """One request's use of one session, as ``authorize`` sees it.

    ``owner`` is the principal id the session was opened for (``None``: opened from
    code, or not opened yet); ``exists`` says whether the store holds the session
    at all, so a policy can let anyone start a new session but nobody else's.
    """

    agent: str
    session_id: str
    owner: str | None
    action: Action
    exists: bool = True


def owner_only(principal: Principal, access: SessionAccess) -> bool:
    """The default: a session is its owner's alone (under the owner's id or any of
    their ``aliases``); anyone may start a new one (it becomes theirs). Sessions
    opened from code (no owner) are nobody's to use over HTTP. Compose it to open
    more up, e.g. ``admin(p) or owner_only(p, access)``."""
    if not access.exists:
        return access.action == "turn"
    return access.owner is not None and access.owner in principal.names


def one_person(principal: Principal, access: SessionAccess) -> bool:
    """``turnkit dev``'s rule, for one person's machine: ``owner_only``, and a session
    nobody owns is theirs too (one an older ``turnkit run`` opened, which recorded
    no owner, or one their own code opened). Another principal's session stays
    hidden."""
    if access.exists and access.owner is None:
        return True
    return owner_only(principal, access)


async def allowed(authorize: Authorize, principal: Principal, access: SessionAccess) -> bool:
    """Run the hook, plain or async, and insist on a ``bool``: anything else is a
    mistake in the app, not a permission."""
    verdict = authorize(principal, access)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    if not isinstance(verdict, bool):
        raise TypeError(f"authorize must return True or False, got {type(verdict).__name__}")
    return verdict


def checked_authorize(authorize: Authorize | None) -> Authorize:
    """``authorize`` as given, or ``owner_only`` when it is ``None``."""
    if authorize is None:
        return owner_only
    if not callable(authorize):
        raise ConfigurationError(
            "authorize must be a function (principal, SessionAccess) -> bool, "
            f"got {type(authorize).__name__}"
        )
    return authorize
