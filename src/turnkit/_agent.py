"""``Agent``: a model, a system prompt and the tools a turn may offer, checked once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._errors import ConfigurationError
from ._model import Model, ToolSpec
from ._tools import Tool

if TYPE_CHECKING:
    from ._approvals import AuthorizeAnswer


@dataclass(frozen=True, kw_only=True)
class Agent:
    """What runs a turn. Validated at construction so mistakes surface at startup."""

    name: str
    model: Model
    instructions: str = ""
    tools: Sequence[Tool] = ()
    #: Model steps one turn may take before it fails; ``None`` means no limit.
    max_steps: int | None = None
    #: Decides policy answerers: ``async (AnswerCheck) -> bool``, used by ``grant_answer``.
    authorize_answer: AuthorizeAnswer | None = None
    _by_name: dict[str, Tool] = field(init=False, repr=False, compare=False)
    _specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("Agent name must be a non-empty string")
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
        for t in self.tools:
            if not isinstance(t, Tool):
                raise ConfigurationError(
                    f"agent {self.name!r}: {t!r} is not a Tool (decorate it with @turnkit.tool)"
                )
            if t.name in by_name:
                raise ConfigurationError(f"agent {self.name!r}: duplicate tool name {t.name!r}")
            by_name[t.name] = t
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_specs", tuple(t.spec for t in self.tools))

    def tool(self, name: str) -> Tool | None:
        """The offered tool called ``name``, or ``None``."""
        return self._by_name.get(name)

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return self._specs
