"""``Agent``: a model, a system prompt and the tools a turn may offer, checked once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ToolDefinitionError
from .._seams.model import Model, OutputSpec, ToolSpec
from .._values.policy import SurfacePolicy, TurnPolicy, resolve_policy
from .agent_version import check_version, fingerprint
from .history import HistoryPolicy
from .limits import NO_LIMITS, Limits
from .output import OutputContract, check_retries
from .retries import Retry
from .tool_sources import ToolSource
from .tools import Tool, check_tool_name

if TYPE_CHECKING:
    from .._values.inputs import AuthorizeAnswer
    from .._values.versions import VersionHook


@dataclass(frozen=True, kw_only=True)
class Agent:
    """What runs a turn. Validated at construction so mistakes surface at startup."""

    name: str
    model: Model
    instructions: str = ""
    #: ``Tool`` values, and tool sources (``turnkit.mcp.mcp_tools(...)``) whose tools
    #: are listed when a turn opens and stored with it.
    tools: Sequence[Tool | ToolSource] = ()
    #: Per-source policies keyed by the inbound event's ``source`` (``SurfacePolicy``
    #: or its dict form ``{"mode": "append" | "replace", "deny_tools": [...]}``).
    surfaces: Mapping[str, SurfacePolicy] = field(default_factory=dict)
    #: Instruction overlays keyed by source (``instructions.<source>.md`` in a folder).
    source_instructions: Mapping[str, str] = field(default_factory=dict)
    #: Model steps one turn may take before it fails; ``None`` means no limit.
    #: Shorthand for ``limits=Limits(model_steps=...)``.
    max_steps: int | None = None
    #: What one turn may do before it fails: model steps, tool calls, tokens.
    limits: Limits = NO_LIMITS
    #: Which part of the transcript each model step is sent (``LastTurns``,
    #: ``TokenBudget``, ``SummarizeOlder`` or your own); ``None`` sends all of it.
    history: HistoryPolicy | None = None
    #: How many ``async def`` calls of one model step may run at once (``1`` runs
    #: every call of a step one after another). Plain ``def`` calls always run one
    #: at a time, in their own transactions.
    max_parallel_tools: int = 4
    #: Decides policy answerers: ``async (AnswerCheck) -> bool``, used by ``grant_answer``.
    authorize_answer: AuthorizeAnswer | None = None
    #: The type a turn's final answer must have: a pydantic model, a dataclass or a
    #: ``TypedDict``. ``None``: the answer is free text. See docs/output.md.
    output_type: type[Any] | None = None
    #: Answers failing validation that the model may correct per turn before it fails.
    output_retries: int = 1
    #: The version each turn records (``"2026-12-05"``, a release tag); ``None``: a
    #: fingerprint of the agent (see ``turn_version`` and docs/deploying.md).
    version: str | None = None
    #: What a turn recorded under another version does when this agent takes it on:
    #: ``(VersionChange) -> "continue" | "refuse" | Rewrite`` (plain or async).
    #: ``None``: continue when nothing the turn recorded conflicts, else refuse.
    on_version_change: VersionHook | None = None
    #: How a model step the provider refused for load (HTTP 429, 503, 529) is asked
    #: again: the turn parks on a timer for its ``retry-after`` (or the backoff) and
    #: holds no worker meanwhile. ``None``: ``Retry(attempts=5, backoff=10)``.
    model_retry: Retry | None = None
    _output: OutputContract | None = field(init=False, repr=False, compare=False)
    _by_name: dict[str, Tool] = field(init=False, repr=False, compare=False)
    _specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)
    _sources: dict[str, ToolSource] = field(init=False, repr=False, compare=False)
    _turn_version: str | None = field(init=False, repr=False, compare=False, default=None)
    #: Sources whose unused policy ``mount_agent`` has warned about (once each).
    _warned_sources: set[str] = field(init=False, repr=False, compare=False, default_factory=set)

    def unheard_policy_sources(self, emitted: set[str]) -> list[str]:
        """Sources with a policy or overlay that no channel in ``emitted`` produces,
        each returned once per agent (``mount_agent`` warns about them)."""
        unheard = sorted((set(self.surfaces) | set(self.source_instructions)) - emitted)
        fresh = [source for source in unheard if source not in self._warned_sources]
        self._warned_sources.update(fresh)
        return fresh

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("Agent name must be a non-empty string")
        check_version(self.name, self.version)
        if self.on_version_change is not None and not callable(self.on_version_change):
            raise ConfigurationError(
                f"agent {self.name!r}: on_version_change must be a function, "
                f"got {self.on_version_change!r}"
            )
        if not hasattr(self.model, "stream"):
            raise ConfigurationError(
                f"agent {self.name!r}: model {self.model!r} has no stream() method"
            )
        if self.max_steps is not None and (
            not isinstance(self.max_steps, int)
            or isinstance(self.max_steps, bool)
            or self.max_steps < 1
        ):
            raise ConfigurationError(
                f"agent {self.name!r}: max_steps must be a positive int or None, "
                f"got {self.max_steps!r}"
            )
        self._fold_limits()
        if self.history is not None and not callable(getattr(self.history, "window", None)):
            raise ConfigurationError(
                f"agent {self.name!r}: history must be a history policy (LastTurns, "
                f"TokenBudget, SummarizeOlder, or an object with window(view)), "
                f"got {self.history!r}"
            )
        if self.model_retry is not None and not isinstance(self.model_retry, Retry):
            raise ConfigurationError(
                f"agent {self.name!r}: model_retry must be a turnkit.Retry, "
                f"got {self.model_retry!r}"
            )
        if (
            not isinstance(self.max_parallel_tools, int)
            or isinstance(self.max_parallel_tools, bool)
            or self.max_parallel_tools < 1
        ):
            raise ConfigurationError(
                f"agent {self.name!r}: max_parallel_tools must be a positive int, "
                f"got {self.max_parallel_tools!r}"
            )
        if self.authorize_answer is not None and not callable(self.authorize_answer):
            raise ConfigurationError(
                f"agent {self.name!r}: authorize_answer must be an async function, "
                f"got {self.authorize_answer!r}"
            )
        if not isinstance(self.instructions, str):
            raise ConfigurationError(f"agent {self.name!r}: instructions must be a string")
        if isinstance(self.tools, Tool) or not isinstance(self.tools, Sequence):
            raise ConfigurationError(
                f"agent {self.name!r}: tools must be a list of Tool, "
                f"got {type(self.tools).__name__}"
            )
        by_name: dict[str, Tool] = {}
        sources: dict[str, ToolSource] = {}
        for t in self.tools:
            if isinstance(t, ToolSource) and not isinstance(t, Tool):
                self._add_source(t, sources)
                continue
            if not isinstance(t, Tool):
                raise ConfigurationError(
                    f"agent {self.name!r}: {t!r} is not a Tool (decorate it with @turnkit.tool)"
                )
            try:
                check_tool_name(t.name)
            except ToolDefinitionError as exc:
                raise ConfigurationError(f"agent {self.name!r}: {exc}") from None
            if t.name in by_name:
                raise ConfigurationError(f"agent {self.name!r}: duplicate tool name {t.name!r}")
            by_name[t.name] = t
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_sources", sources)
        object.__setattr__(self, "_specs", tuple(t.spec for t in by_name.values()))
        object.__setattr__(self, "_output", self._output_contract(by_name))
        self._check_surfaces(by_name)

    def _output_contract(self, by_name: Mapping[str, Tool]) -> OutputContract | None:
        where = f"agent {self.name!r}"
        if self.output_type is None:
            check_retries(self.output_retries, where)
            return None
        contract = OutputContract.build(self.output_type, self.output_retries, where)
        if contract.spec.name in by_name:
            raise ConfigurationError(
                f"{where}: a tool is named {contract.spec.name!r}, the name of the tool typed "
                "answers are given with; rename it"
            )
        return contract

    def _add_source(self, source: ToolSource, sources: dict[str, ToolSource]) -> None:
        key = source.key
        if not isinstance(key, str) or not key:
            raise ConfigurationError(
                f"agent {self.name!r}: tool source {source!r} has no key (a non-empty str)"
            )
        if key in sources:
            raise ConfigurationError(
                f"agent {self.name!r}: two tool sources share the key {key!r}; name them apart"
            )
        sources[key] = source

    def _fold_limits(self) -> None:
        """``max_steps`` is ``limits.model_steps``: either may be given, or both alike."""
        if not isinstance(self.limits, Limits):
            raise ConfigurationError(
                f"agent {self.name!r}: limits must be a turnkit.Limits, got {self.limits!r}"
            )
        steps, capped = self.max_steps, self.limits.model_steps
        if steps is not None and capped is not None and steps != capped:
            raise ConfigurationError(
                f"agent {self.name!r}: max_steps={steps} and limits.model_steps={capped} "
                "disagree; give one of them"
            )
        if steps is not None:
            object.__setattr__(self, "limits", replace(self.limits, model_steps=steps))
        object.__setattr__(self, "max_steps", self.limits.model_steps)

    def _check_surfaces(self, by_name: Mapping[str, Tool]) -> None:
        """Normalize and check the per-source settings, naming the source at fault."""
        where = f"agent {self.name!r}"
        if not isinstance(self.source_instructions, Mapping):
            raise ConfigurationError(f"{where}: source_instructions must be a dict of str")
        overlays: dict[str, str] = {}
        for source, text in self.source_instructions.items():
            if not isinstance(source, str) or not source:
                raise ConfigurationError(f"{where}: source {source!r} must be a non-empty str")
            if not isinstance(text, str):
                raise ConfigurationError(
                    f"{where}: the instructions for source {source!r} must be a string"
                )
            overlays[source] = text
        if not isinstance(self.surfaces, Mapping):
            raise ConfigurationError(f"{where}: surfaces must be a dict keyed by source")
        surfaces: dict[str, SurfacePolicy] = {}
        for source, value in self.surfaces.items():
            if not isinstance(source, str) or not source:
                raise ConfigurationError(f"{where}: surface key {source!r} must be a non-empty str")
            try:
                surface = SurfacePolicy.coerce(source, value)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}: {exc}") from None
            if surface.mode is not None and source not in overlays:
                raise ConfigurationError(
                    f"{where}: surface {source!r} has mode {surface.mode!r} but no instructions "
                    f"for {source!r} (add instructions.{source}.md or "
                    f"source_instructions[{source!r}], or leave the mode unset)"
                )
            # A source's tools are known only once listed, so with sources a name
            # that is none of the agent's own may be one of theirs.
            unknown = [n for n in surface.deny_tools if n not in by_name]
            if unknown and not self._sources:
                raise ConfigurationError(
                    f"{where}: surface {source!r} denies {unknown}, which the agent does not "
                    f"have (its tools: {sorted(by_name)})"
                )
            surfaces[source] = surface
        object.__setattr__(self, "surfaces", MappingProxyType(surfaces))
        object.__setattr__(self, "source_instructions", MappingProxyType(overlays))

    @property
    def turn_version(self) -> str:
        """The version this agent's turns record: ``version`` if given, else its
        fingerprint (computed once per agent, on first use)."""
        known = self._turn_version
        if known is None:
            known = self.version if self.version is not None else fingerprint(self)
            object.__setattr__(self, "_turn_version", known)
        return known

    def policy_for(self, source: str | None) -> TurnPolicy:
        """The prompt and tool set for a turn from ``source`` (``None``: programmatic)."""
        return resolve_policy(
            instructions=self.instructions,
            source=source,
            surfaces=self.surfaces,
            source_instructions=self.source_instructions,
        )

    def tool(self, name: str) -> Tool | None:
        """The agent's own tool called ``name``, or ``None`` (a turn's ``TurnTools``
        also knows what the agent's tool sources listed for it)."""
        return self._by_name.get(name)

    def tool_source(self, key: str) -> ToolSource | None:
        """The tool source whose key is ``key``, or ``None``."""
        return self._sources.get(key)

    @property
    def tool_sources(self) -> tuple[ToolSource, ...]:
        """The tool sources among ``tools``, in their order."""
        return tuple(self._sources.values())

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told about the agent's own tools (not its sources')."""
        return self._specs

    @property
    def output_spec(self) -> OutputSpec | None:
        """What the model is asked a final answer to look like, if ``output_type`` is set."""
        return self._output.spec if self._output is not None else None
