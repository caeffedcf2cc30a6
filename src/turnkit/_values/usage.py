"""Token usage: what one model step cost, as the provider reported it, and sums of it.

Every count is the provider's own figure, normalized so that ``input_tokens`` is all
the input the model read (cached or not) and ``output_tokens`` all it wrote
(reasoning included); the cache and reasoning counts say how much of each that was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .._errors import MessageDecodeError
from .frozen import quick_init
from .step_ids import HISTORY, MODEL, step_kind
from .step_results import StepResults

#: The kinds of step whose stored record is a model call's, with its usage.
_MODEL_CALLS = frozenset({MODEL, HISTORY})


@quick_init
@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens one model step (or a sum of steps) used.

    ``input_tokens`` counts every input token, including those read from or written
    to the provider's prompt cache (``cache_read_tokens``, ``cache_write_tokens``);
    ``output_tokens`` counts every generated token, including ``reasoning_tokens``.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        values = self.__dict__
        for name in _COUNTS:
            value = values[name]
            # (An exact int, the usual case, is one check, not three.)
            kind = type(value)
            wrong = kind is not int and (kind is bool or not isinstance(value, int))
            if wrong or value < 0:
                raise ValueError(f"Usage.{name} must be a non-negative int, got {value!r}")

    @property
    def total_tokens(self) -> int:
        """Input plus output."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    def __bool__(self) -> bool:
        values = self.__dict__
        return any(values[name] for name in _COUNTS)

    def to_dict(self) -> dict[str, int]:
        values = self.__dict__
        return {name: values[name] for name in _COUNTS}

    @classmethod
    def from_dict(cls, data: object) -> Usage:
        if not isinstance(data, Mapping):
            raise MessageDecodeError(f"usage: expected a JSON object, got {type(data).__name__}")
        try:
            return cls(**{name: data.get(name, 0) for name in _COUNTS})
        except ValueError as exc:
            raise MessageDecodeError(f"usage: {exc}") from None


#: The counts, in field order (read once: ``fields()`` costs on every call).
_COUNTS: tuple[str, ...] = tuple(f.name for f in fields(Usage))

#: No tokens: what a turn whose model reported nothing used.
NO_USAGE = Usage()


def total(usages: Iterable[Usage | None]) -> Usage:
    """The sum of ``usages`` (``None``: a step whose provider reported nothing)."""
    result = NO_USAGE
    for usage in usages:
        if usage is not None:
            result = result + usage
    return result


def usage_of_step(value: Any) -> Usage | None:
    """The usage a stored model-step record carries (``{"usage": {...}}``), if any."""
    if not isinstance(value, Mapping):
        return None
    data = value.get("usage")
    return Usage.from_dict(data) if data is not None else None


def steps_usage(steps: Mapping[str, Any] | StepResults) -> Usage:
    """What a turn's stored steps used: the sum over its model steps, and any other
    step that records a model call of its own (a history summary)."""
    return total(usage_of_step(v) for k, v in steps.items() if step_kind(k) in _MODEL_CALLS)
