"""``Limits``: how much one turn may do, checked before each model call and tool batch.

The counts are read off the transcript and the turn's stored usage, so a redelivery
in another process stops at the same point; a turn over a limit fails cleanly,
with nothing half-run, and says which limit it reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from .._errors import ConfigurationError
from .._values.messages import AssistantMessage, Message
from .._values.turns import TurnFailure
from .._values.usage import Usage


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Caps on one turn; ``None`` leaves that one open.

    ``model_steps`` counts the turn's model calls; ``tool_calls`` the tool calls its
    model asked for (a batch that would go past the cap does not run);
    ``tokens`` the input and output tokens its model calls used, history summaries
    included (checked before each call, so the call that crosses it completes).
    """

    model_steps: int | None = None
    tool_calls: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ConfigurationError(
                    f"Limits.{f.name} must be a positive int or None, got {value!r}"
                )

    def check_model_call(self, agent: str, steps_taken: int, usage: Usage) -> None:
        """Fail the turn if another model call would go past a limit."""
        if self.model_steps is not None and steps_taken >= self.model_steps:
            raise TurnFailure(
                f"the turn reached agent {agent!r}'s limit of {self.model_steps} model steps"
            )
        if self.tokens is not None and usage.total_tokens >= self.tokens:
            raise TurnFailure(
                f"the turn used {usage.total_tokens:,} tokens, reaching agent {agent!r}'s "
                f"limit of {self.tokens:,} tokens; it stopped before the next model call"
            )

    def check_tool_batch(self, agent: str, asked_before: int, batch: int) -> None:
        """Fail the turn if running a batch of ``batch`` calls, after ``asked_before``
        earlier calls of the turn, would go past the tool-call limit."""
        if self.tool_calls is not None and asked_before + batch > self.tool_calls:
            raise TurnFailure(
                f"the turn's model asked for {batch} more tool call(s) after "
                f"{asked_before}, past agent {agent!r}'s limit of {self.tool_calls} tool "
                "calls; none of them ran"
            )


#: No caps at all.
NO_LIMITS = Limits()


def calls_asked_before(
    transcript: Sequence[Message], turn_id: str, index: int, *, skip: frozenset[str] = frozenset()
) -> int:
    """How many tool calls the turn's assistant messages before ``index`` asked for
    (calls named in ``skip`` left out). Walks back through the turn only."""
    asked = 0
    for i in range(index - 1, -1, -1):
        message = transcript[i]
        if message.turn_id != turn_id:
            break
        if isinstance(message, AssistantMessage):
            asked += sum(1 for c in message.tool_calls if c.name not in skip)
    return asked
