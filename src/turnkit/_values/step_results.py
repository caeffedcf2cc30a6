"""A turn's memoized step results, as a store hands them to a delivery.

Each result is the JSON its step stored (``PutStep.result``). No store interprets
it: the engine wrote it and reads it back by the step's kind (``step_ids``), so
the seam carries it as opaque JSON, read-only, rather than as a dict a reader
could change under the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

#: A JSON value: what a step stores and a store keeps without reading it.
JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"


class StepResults:
    """The stored results of one turn's steps, by step id (read-only)."""

    __slots__ = ("_by_id",)

    def __init__(self, by_id: dict[str, JsonValue] | None = None) -> None:
        # The store hands over a dict it made for this snapshot: kept, not copied.
        self._by_id: dict[str, JsonValue] = {} if by_id is None else by_id

    def get(self, step_id: str) -> JsonValue | None:
        """The result stored under ``step_id``, or ``None`` if there is none."""
        return self._by_id.get(step_id)

    def items(self) -> Iterator[tuple[str, JsonValue]]:
        """Each step id with its result, in the order the store read them."""
        return iter(self._by_id.items())

    def values(self) -> Iterator[JsonValue]:
        """Each result, in the order the store read them."""
        return iter(self._by_id.values())

    def __getitem__(self, step_id: str) -> JsonValue:
        return self._by_id[step_id]

    def __contains__(self, step_id: object) -> bool:
        return step_id in self._by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepResults) and self._by_id == other._by_id

    __hash__ = None  # type: ignore[assignment]  # its results may be lists and dicts

    def __repr__(self) -> str:
        return f"StepResults({self._by_id!r})"


#: A turn with no stored steps.
NO_STEPS = StepResults()
