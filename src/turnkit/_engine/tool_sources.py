"""``ToolSource``: tools an agent learns by asking (an MCP server's), not by declaring.

A source stands in an agent's tool list (``turnkit.mcp.mcp_tools(...)`` is one).
The engine asks each source once per turn and stores the answer with the turn
(see ``turn_tools``); from then on the turn, replayed or resumed anywhere, offers
exactly what was stored.

A source may also hold connections open (``OpenedToolSource``): a ``Runtime`` opens
it when it opens and closes it when it closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .._values.listed_tools import ListedTool
from .tools import Tool


@runtime_checkable
class ToolSource(Protocol):
    """Tools an agent learns when a turn opens rather than when it is built.

    ``key`` names the source among the agent's and is stored with every tool it
    listed, so it must be the same in every process. ``list_tools`` asks for the
    tools now (raising if it cannot: the turn then fails, to be delivered again).
    ``bind`` makes a ``Tool`` that calls one listed tool, which may have been listed
    days ago in another process; declare its ``run`` ``async def`` (a remote call).
    """

    @property
    def key(self) -> str: ...

    async def list_tools(self) -> Sequence[ListedTool]: ...

    def bind(self, listed: ListedTool) -> Tool: ...


@runtime_checkable
class OpenedToolSource(Protocol):
    """A tool source with resources to share while a ``Runtime`` runs (an MCP
    server's connection). ``open`` is called on the running loop when the runtime
    opens, ``close`` when it closes; a source in several runtimes is opened by each
    and must stay usable until the last ``close``."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...
