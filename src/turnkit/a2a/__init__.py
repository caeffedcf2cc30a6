"""A2A both ways, on the official ``a2a-sdk`` (``turnkit[a2a]``).

``a2a_server()`` serves every agent of ``create_app`` as an A2A agent: a task is a
turn, its context a session, a park is ``input-required``, cancel is turnkit's
durable cancel. ``a2a_agent(url)`` gives an agent a remote A2A agent as a tool whose
remote task is kept with the call, so a replay follows the same task. See
docs/a2a.md.
"""

try:
    import a2a.server.routes  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("turnkit.a2a needs the A2A SDK: pip install 'turnkit[a2a]'") from exc

from ._client import A2AAgentError, a2a_agent
from ._server import A2AServer, a2a_server, api_key_scheme, bearer_scheme, tool_skills

__all__ = [
    "A2AAgentError",
    "A2AServer",
    "a2a_agent",
    "a2a_server",
    "api_key_scheme",
    "bearer_scheme",
    "tool_skills",
]
