"""Who is calling: ``Principal`` and the authentication hook's shape.

``authenticate(request)`` is the app's own check; the principal it returns is the
turn's speaker and the resumer's ``by``, and is handed whole to ``authorize_answer``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any

from starlette.requests import Request
from starlette.types import Scope

from .._channels.local_user import LocalUser, local_user

Authenticate = Callable[[Request], "Principal | Awaitable[Principal | None] | None"]


@dataclass(frozen=True, kw_only=True)
class Principal:
    """An authenticated caller. ``attested`` says the identity was verified (a
    signed token, a session cookie), which lets a turn it opens default its
    approvals to it; ``claims`` carries whatever else the app wants
    ``authorize_answer`` to see (roles, tenant)."""

    id: str
    attested: bool = True
    claims: Mapping[str, Any] = field(default_factory=dict)
    #: Other ids the same caller goes by: a session owned by one, or a question that
    #: names one as its answerer, is the caller's too (answered under that name).
    aliases: tuple[str, ...] = ()
    #: The tenant whose turns this caller's turns are (docs/tenants.md): their fair
    #: share of workers, concurrency cap and budget. ``None``: the default tenant.
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Principal.id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.aliases, tuple) or not all(
            isinstance(a, str) and a for a in self.aliases
        ):
            raise ValueError(
                f"Principal.aliases must be a tuple of non-empty str, got {self.aliases!r}"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """``id`` first, then the aliases."""
        return (self.id, *self.aliases)


async def authenticated(authenticate: Authenticate, request: Request) -> Principal | None:
    """Run the hook, plain or async, and insist on its return type."""
    found = authenticate(request)
    if inspect.isawaitable(found):
        found = await found
    if found is not None and not isinstance(found, Principal):
        raise TypeError(
            f"authenticate must return a turnkit.server.Principal or None, "
            f"got {type(found).__name__}"
        )
    return found


def loopback_only(request: Request) -> Principal | None:
    """The development default: any client on this machine is you, nobody else is.

    The principal is the local user, the one ``turnkit run`` speaks as:
    ``$TURNKIT_USER``, else ``local:<login>`` (also going by ``cli:<login>`` and
    ``dev:<login>``), counted as attested, so a turn you start may park for your
    own approval.
    """
    return _on_this_machine(request, local_user())


def loopback_as(user: LocalUser) -> Callable[[Request], Principal | None]:
    """``loopback_only`` with the local user chosen once, up front."""

    def authenticate(request: Request) -> Principal | None:
        return _on_this_machine(request, user)

    return authenticate


def _on_this_machine(request: Request, user: LocalUser) -> Principal | None:
    client = request.client
    if client is None:
        return None
    try:
        loopback = ip_address(client.host).is_loopback
    except ValueError:
        return None
    return Principal(id=user.id, aliases=user.aliases) if loopback else None


#: The scope key under which an app mounted behind ``create_app``'s ``authenticate``
#: finds the authenticated ``Principal``.
PRINCIPAL_SCOPE_KEY = "turnkit.principal"


def principal_of(scope: Scope) -> Principal | None:
    """The principal ``create_app`` authenticated for this request, if any."""
    found = scope.get(PRINCIPAL_SCOPE_KEY)
    return found if isinstance(found, Principal) else None
