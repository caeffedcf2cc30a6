"""The tool set one turn offers: the agent's own tools plus what its tool sources
listed when the turn opened (stored with it as ``ListedTools``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ToolDefinitionError
from .._seams.model import ToolSpec
from .._values.listed_tools import ListedTool, ListedTools
from .._values.policy import TurnPolicy
from .._values.turns import TurnFailure
from .tool_results import error_text
from .tool_sources import ToolSource
from .tools import Tool, check_tool_name

if TYPE_CHECKING:
    from .agent import Agent
    from .context import ToolContext


async def list_tool_sources(agent: Agent) -> ListedTools:
    """Ask each of ``agent``'s sources for its tools, all at once; a source that
    fails, or lists a tool the turn could not offer, fails the turn."""
    sources = agent.tool_sources
    answers = await asyncio.gather(
        *(_listed_by(source) for source in sources), return_exceptions=True
    )
    taken = {spec.name: "the agent's own tools" for spec in agent.tool_specs}
    if agent.output_spec is not None:
        taken[agent.output_spec.name] = "the agent's typed answer"
    found: list[ListedTool] = []
    for source, answer in zip(sources, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer  # a cancellation, an interrupt: not the source's failure
            raise TurnFailure(
                f"tool source {source.key!r} could not list its tools: {error_text(answer)}"
            )
        for listed in answer:
            _check_listed(source, listed, taken)
            taken[listed.name] = f"tool source {source.key!r}"
            found.append(listed)
    return ListedTools(tools=tuple(found))


async def _listed_by(source: ToolSource) -> Sequence[ListedTool]:
    tools = await source.list_tools()
    return tuple(tools)


def _check_listed(source: ToolSource, listed: object, taken: dict[str, str]) -> None:
    where = f"tool source {source.key!r}"
    if not isinstance(listed, ListedTool) or listed.source != source.key:
        raise TurnFailure(f"{where} listed {listed!r}, which is not a ListedTool of its own")
    try:
        check_tool_name(listed.name)
    except ToolDefinitionError as exc:
        raise TurnFailure(f"{where}: {exc}") from None
    if listed.name in taken:
        raise TurnFailure(
            f"{where} lists a tool named {listed.name!r}, a name already taken by "
            f"{taken[listed.name]}; give the source a prefix for its tool names"
        )


class TurnTools:
    """The tools one turn offers: the agent's own and those its sources listed."""

    def __init__(self, agent: Agent, listed: ListedTools | None = None) -> None:
        self._agent = agent
        self._listed = {t.name: t for t in listed.tools} if listed is not None else {}
        extra = tuple(
            ToolSpec(name=t.name, description=t.description, input_schema=t.input_schema)
            for t in self._listed.values()
        )
        self._specs = agent.tool_specs + extra
        self._bound: dict[str, Tool] = {}

    def specs_for(self, policy: TurnPolicy) -> tuple[ToolSpec, ...]:
        """The tools offered to the model under ``policy``: denied ones are left out."""
        if not policy.deny_tools:
            return self._specs
        return tuple(s for s in self._specs if policy.allows(s.name))

    def current(self, name: str) -> Tool | None:
        """The tool called ``name`` if the agent still has it: its own, or listed by a
        source it still has (``tool`` also returns a listed tool whose source is gone,
        which only fails when called)."""
        own = self._agent.tool(name)
        if own is not None:
            return own
        listed = self._listed.get(name)
        if listed is None or self._agent.tool_source(listed.source) is None:
            return None
        return self.tool(name)

    def tool(self, name: str) -> Tool | None:
        """The offered tool called ``name``, or ``None``."""
        own = self._agent.tool(name)
        if own is not None:
            return own
        listed = self._listed.get(name)
        if listed is None:
            return None
        bound = self._bound.get(name)
        if bound is None:
            source = self._agent.tool_source(listed.source)
            bound = source.bind(listed) if source is not None else _orphan(listed)
            self._bound[name] = bound
        return bound


def _orphan(listed: ListedTool) -> Tool:
    """A listed tool whose source the agent no longer has: calling it is an error the
    model reads."""
    spec = ToolSpec(
        name=listed.name, description=listed.description, input_schema=listed.input_schema
    )

    async def run(data: Any, ctx: ToolContext) -> Any:
        raise LookupError(
            f"tool {listed.name!r} came from tool source {listed.source!r}, which agent "
            f"{ctx.agent.name!r} no longer has"
        )

    return Tool(spec, run, needs_store=False)
