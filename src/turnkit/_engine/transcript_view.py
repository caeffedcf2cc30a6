"""``TranscriptView``: a read-only, fixed window on the growing transcript, O(1) to make.

The model must see the transcript as it was when it was called (or the part of it a
history policy chose), without the engine copying the history on every step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import overload

from .._values.messages import Message


class TranscriptView(Sequence[Message]):
    """``items[start:end]`` as it is now (``end`` defaults to the current length),
    without copying it."""

    __slots__ = ("_end", "_items", "_start")

    def __init__(self, items: Sequence[Message], start: int = 0, end: int | None = None) -> None:
        self._items = items
        self._end = len(items) if end is None else end
        self._start = min(start, self._end)

    def __len__(self) -> int:
        return self._end - self._start

    def __iter__(self) -> Iterator[Message]:
        return islice(self._items, self._start, self._end)

    @overload
    def __getitem__(self, i: int) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Message]: ...
    def __getitem__(self, i: int | slice) -> Message | Sequence[Message]:
        if isinstance(i, slice):
            return self._items[self._start : self._end][i]
        size = self._end - self._start
        if i < 0:
            i += size
        if not 0 <= i < size:
            raise IndexError("transcript index out of range")
        return self._items[self._start + i]
