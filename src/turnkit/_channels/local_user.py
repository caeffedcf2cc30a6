"""The person at this machine: one identity for ``turnkit run``, ``turnkit answer``
and the ``turnkit dev`` page, so what one of them opens or parks the others can use.

It is ``$TURNKIT_USER`` when set, else ``local:<login>``. The default identity also
goes by ``cli:<login>`` and ``dev:<login>``, the names the terminal and the dev page
used before they were one, so sessions and questions stored under those stay its.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._errors import ConfigurationError
from .._values.inputs import Answerer

#: The environment variable that names the local identity instead of ``local:<login>``.
USER_ENV = "TURNKIT_USER"


@dataclass(frozen=True, kw_only=True)
class LocalUser:
    """Who is at this machine: ``id``, and the ``aliases`` that name the same person."""

    id: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """``id`` first, then the aliases."""
        return (self.id, *self.aliases)


def local_user(user: str | None = None, env: Mapping[str, str] | None = None) -> LocalUser:
    """The local identity: ``user`` when given, else ``$TURNKIT_USER``, else
    ``local:<login>``. Only ``local:<login>`` of this login has aliases: an identity
    chosen by name is that name alone."""
    environ = os.environ if env is None else env
    chosen = user if user is not None else environ.get(USER_ENV)
    login = _login()
    default = f"local:{login}"
    if chosen is None:
        chosen = default
    elif not isinstance(chosen, str) or not chosen.strip() or not chosen.isprintable():
        where = "the user" if user is not None else USER_ENV
        raise ConfigurationError(
            f"{where} must be a user id: not empty, without control characters, got {chosen!r}"
        )
    elif chosen != chosen.strip():
        where = "the user" if user is not None else USER_ENV
        raise ConfigurationError(f"{where} must not start or end with a space, got {chosen!r}")
    aliases = (f"cli:{login}", f"dev:{login}") if chosen == default else ()
    return LocalUser(id=chosen, aliases=aliases)


def named_answerer(names: Iterable[str], answerers: Iterable[Answerer]) -> str | None:
    """The first of ``names`` that ``answerers`` names as a user, or ``None``."""
    named = {a.user_id for a in answerers if a.kind == "user"}
    return next((n for n in names if n in named), None)


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"
