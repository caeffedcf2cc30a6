"""The HTTP surface: a ``Runtime`` as a Starlette ASGI app (``turnkit[server]``).

``create_app(runtime, authenticate=…)`` serves turns as server-sent events, resumes,
resets, transcripts and a reconnectable event feed; ``ops_app(runtime)`` serves
health, readiness and Prometheus metrics (``turnkit[metrics]``); see docs/server.md.
"""

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "turnkit.server needs Starlette and uvicorn: pip install 'turnkit[server]'"
    ) from exc

from .._access.authorize import Action, Authorize, SessionAccess, owner_only
from .._access.principal import Authenticate, Principal, loopback_only
from ._app import ServerLimits, create_app
from ._body_limit import BodyLimit
from ._console import Console, ConsoleAudit, console_app
from ._ops import ops_app
from ._sse import event_frame, frame

__all__ = [
    "Action",
    "Authenticate",
    "Authorize",
    "BodyLimit",
    "Console",
    "ConsoleAudit",
    "Principal",
    "ServerLimits",
    "SessionAccess",
    "console_app",
    "create_app",
    "event_frame",
    "frame",
    "loopback_only",
    "ops_app",
    "owner_only",
]
