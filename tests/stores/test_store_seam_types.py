"""No untyped payload crosses the store seam upward (issue 30, item 1).

Every store decodes what it keeps into typed values once, at the seam: a turn's
opening is an ``OpeningMessage``, its event an ``InboundEvent``, a parked turn's
checkpoint a ``SuspendCheckpoint``, a turn's memoized steps ``StepResults``. This
test reads the annotations of every store protocol in ``turnkit._seams`` and of the
records they hand out, and fails on a ``dict``/``Mapping`` of untyped values or an
``Any`` anywhere on the way up (return values, properties, what a callback is
given). What goes down (writes, arguments) may stay loose.

Two leaves are allowed, each for a reason:
- ``JsonValue``, a memoized step's JSON inside ``StepResults``: the engine wrote it
  and decodes it by the step's kind; no store reads it.
- ``StoreHandle``: a local tool's own SQL through the store's connection, whose
  rows are the application's, not turnkit's.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import turnkit._seams
from turnkit._seams import (
    blobs,
    election,
    inbox,
    placing,
    queue,
    rates,
    relay,
    retention,
    store,
    tenant_view,
    timers,
    worker_view,
)
from turnkit._values.messages import JsonObject
from turnkit._values.step_results import StepResults

#: The modules whose protocols make up the store seam: ``Store`` and
#: ``SessionStore``, and the optional siblings a store may offer.
STORE_SEAM = (
    store,
    inbox,
    queue,
    relay,
    retention,
    timers,
    worker_view,
    tenant_view,
    rates,
    election,
    blobs,
    placing,
)

#: The seams that are not the store's: what a model, an event sink, a tracer and a
#: codec are handed and give back is theirs to type.
OTHER_SEAMS = {"model", "sink", "tracer", "codec"}

#: Protocols exempt, with why (see the module docstring).
EXEMPT = {store.StoreHandle}


class _OpaqueJson:
    """What ``JsonValue`` reads as here: the one opaque leaf allowed."""


_MAPS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_UNTYPED = (Any, object)


def _hints(owner: Any, module: types.ModuleType) -> dict[str, Any]:
    """``owner``'s annotations, read where it was written (a function's own module,
    else ``module``), with ``JsonValue`` as the opaque leaf."""
    written = getattr(owner, "__globals__", None) or vars(module)
    namespace = {**written, "JsonValue": _OpaqueJson}
    return typing.get_type_hints(owner, globalns=namespace, localns={"JsonValue": _OpaqueJson})


def _is_record(kind: type) -> bool:
    """A record the seam hands out, whose own fields are checked in turn: the store
    records of ``_values.records`` and the seam's own, and ``StepResults``."""
    module = getattr(kind, "__module__", "")
    return kind is StepResults or (
        dataclasses.is_dataclass(kind)
        and (module == "turnkit._values.records" or module.startswith("turnkit._seams."))
    )


class _Walk:
    def __init__(self, is_record: Callable[[type], bool] = _is_record) -> None:
        self.is_record = is_record
        self.problems: list[str] = []
        self.seen: set[type] = set()

    def hint(self, hint: Any, where: str) -> None:
        """Check one type that flows upward."""
        if hint in _UNTYPED:
            self.problems.append(f"{where}: {hint!r}")
            return
        if hint is _OpaqueJson or isinstance(hint, TypeVar) or hint is type(None):
            return
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if hint in _MAPS or (origin in _MAPS and not args):
            self.problems.append(f"{where}: an untyped {hint!r}")
            return
        if origin in _MAPS and any(a in _UNTYPED or a is _OpaqueJson for a in args):
            self.problems.append(f"{where}: {hint!r}")
            return
        if origin is collections.abc.Callable:
            for arg in args[0] if args and isinstance(args[0], list) else ():
                self.hint(arg, f"{where} (what it is called with)")
            return
        if origin is not None:
            for arg in args:
                if arg is not Ellipsis:
                    self.hint(arg, where)
            return
        if isinstance(hint, type) and self.is_record(hint):
            self.record(hint)

    def record(self, kind: type) -> None:
        if kind in self.seen:
            return
        self.seen.add(kind)
        module = sys.modules[kind.__module__]
        if dataclasses.is_dataclass(kind):
            for name, hint in _hints(kind, module).items():
                self.hint(hint, f"{kind.__name__}.{name}")
        self.members(kind, module)

    def members(self, kind: type, module: types.ModuleType) -> None:
        """Every public method's return and every property of ``kind``."""
        for name, member in vars(kind).items():
            if name.startswith("_") and name not in ("__iter__", "__contains__", "__len__"):
                continue
            function = member.fget if isinstance(member, property) else member
            if not callable(function):
                continue
            hints = _hints(function, module)
            where = f"{kind.__name__}.{name}"
            if "return" in hints:
                self.hint(hints["return"], where)
            for param, hint in hints.items():
                if param != "return" and typing.get_origin(hint) is collections.abc.Callable:
                    self.hint(hint, f"{where}({param})")


def seam_protocols() -> Iterator[tuple[type, types.ModuleType]]:
    """Each protocol the seam's modules define or take from one another, once.
    (Public ones say ``turnkit`` is their module, so ``__module__`` cannot tell.)"""
    found: set[type] = set()
    for module in STORE_SEAM:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and getattr(value, "_is_protocol", False)
                and value is not Protocol
                and value not in EXEMPT
                and value not in found
            ):
                found.add(value)
                yield value, module


def untyped_upward(
    protocols: list[tuple[type, types.ModuleType]], is_record: Callable[[type], bool] = _is_record
) -> list[str]:
    walk = _Walk(is_record)
    for protocol, module in protocols:
        walk.members(protocol, module)
    return walk.problems


def test_the_store_seam_hands_out_only_typed_values() -> None:
    protocols = list(seam_protocols())
    names = {p.__name__ for p, _ in protocols}
    # The walk must reach what it is about; an empty walk would pass vacuously.
    assert {"Store", "SessionStore", "InboxStore", "TimerStore", "TurnQueue", "BlobStore"} <= names
    assert untyped_upward(protocols) == []


def test_every_seam_module_is_walked_or_named_as_no_store_seam() -> None:
    found = {m.name for m in pkgutil.iter_modules(turnkit._seams.__path__)}
    walked = {m.__name__.rsplit(".", 1)[1] for m in STORE_SEAM}
    assert found - OTHER_SEAMS == walked


def test_a_turn_record_carries_decoded_payloads() -> None:
    from turnkit._values import records

    hints = _hints(records.TurnRecord, records)
    assert str(hints["opening"]) == str(records.OpeningMessage)
    assert hints["event"] == records.InboundEvent | None
    assert hints["pending"] == records.SuspendCheckpoint | None
    assert _hints(records.SessionSnapshot, records)["steps"] is StepResults


# -- the walk itself fails on what it is to catch ---------------------------------


@dataclasses.dataclass(frozen=True)
class _LooseRecord:
    opening: JsonObject
    pending: dict[str, Any] | None


class _LooseStore(Protocol):
    async def turn(self, turn_id: str) -> _LooseRecord: ...

    async def steps(self) -> collections.abc.Mapping[str, Any]: ...

    def follow(self, callback: Callable[[dict[str, Any]], None]) -> None: ...

    async def raw(self) -> Any: ...

    def put(self, value: dict[str, Any]) -> None:  # downward: allowed
        ...


def test_the_walk_reports_each_untyped_payload_going_up() -> None:
    here = sys.modules[__name__]
    found = untyped_upward([(_LooseStore, here)], lambda kind: kind is _LooseRecord)
    assert sorted(p.split(":")[0] for p in found) == [
        "_LooseRecord.opening",
        "_LooseRecord.pending",
        "_LooseStore.follow(callback) (what it is called with)",
        "_LooseStore.raw",
        "_LooseStore.steps",
    ]
