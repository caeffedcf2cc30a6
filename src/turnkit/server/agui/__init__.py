"""AG-UI (protocol 1.x) for turnkit agents, on the official ``ag-ui-protocol`` types.

``create_app(runtime, ..., frontends=[ag_ui()])`` serves, for every agent, an
endpoint that takes a ``RunAgentInput`` and streams the run's events (a park ends
the run with an ``interrupt`` outcome; the next run's ``resume[]`` answers it), and
the agent's declared capabilities; see docs/frontends.md.
"""

try:
    from ._run import AgUi, ag_ui, capabilities_of
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    if not (exc.name or "").startswith("ag_ui"):
        raise
    raise ImportError(
        "turnkit.server.agui needs ag-ui-protocol: pip install 'turnkit[server]'"
    ) from exc

__all__ = ["AgUi", "ag_ui", "capabilities_of"]
