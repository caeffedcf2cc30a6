"""A2A both ways, on the official ``a2a-sdk`` (``turnkit[a2a]``).

``a2a_server()`` serves every agent of ``create_app`` as an A2A agent: a task is a
turn, its context a session, a park is ``input-required``, cancel is turnkit's
durable cancel. See docs/a2a.md.
"""

try:
    import a2a.server.routes  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("turnkit.a2a needs the A2A SDK: pip install 'turnkit[a2a]'") from exc

from ._server import A2AServer, a2a_server, api_key_scheme, bearer_scheme, tool_skills

__all__ = ["A2AServer", "a2a_server", "api_key_scheme", "bearer_scheme", "tool_skills"]
