"""``quick_init`` keeps a frozen dataclass's construction exactly as the dataclass made
it: parameters, defaults, factories, ``__post_init__``, field order and immutability."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

import turnkit
from turnkit._engine.context import ToolContext
from turnkit._seams.model import ModelDone, ReasoningDelta, TextDelta
from turnkit._values.checkpoints import ToolStepResult
from turnkit._values.events import _EVENT_TYPES, UnknownEvent
from turnkit._values.frozen import made_clean, quick_init, replaced
from turnkit._values.records import TurnRecord

made: list[int] = []


def _counted() -> list[int]:
    made.append(1)
    return []


def _check(value: _Plain | _Quick) -> None:
    if value.a < 0:
        raise ValueError("a must not be negative")
    object.__setattr__(value, "d", value.a * 2)


@dataclass(frozen=True, kw_only=True)
class _Plain:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=_counted, compare=False)
    d: int = 0

    def __post_init__(self) -> None:
        _check(self)


@quick_init
@dataclass(frozen=True, kw_only=True)
class _Quick:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=_counted, compare=False)
    d: int = 0

    def __post_init__(self) -> None:
        _check(self)


def test_a_quick_class_is_made_as_its_dataclass_would_make_it() -> None:
    assert str(inspect.signature(_Quick)) == str(inspect.signature(_Plain))
    for kwargs in ({"a": 1}, {"a": 2, "b": "x"}, {"a": 3, "c": [9]}, {"a": 4, "d": 7}):
        plain, quick = _Plain(**kwargs), _Quick(**kwargs)
        assert vars(quick) == vars(plain)
        assert list(vars(quick)) == [f.name for f in dataclasses.fields(_Quick)]
    before = len(made)
    first, second = _Quick(a=1), _Quick(a=1)
    assert len(made) == before + 2 and first.c is not second.c  # a factory per instance
    assert _Quick(a=1, c=[5]).c == [5] and len(made) == before + 2  # given: not called
    with pytest.raises(ValueError, match="negative"):
        _Quick(a=-1)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'a'"):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Quick(a=1, e=2)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.a = 2  # type: ignore[misc]
    assert dataclasses.replace(first, b="y") == _Quick(a=1, b="y")
    assert first == _Quick(a=1) and hash(first) == hash(_Quick(a=1))


def test_made_clean_builds_the_same_value_without_its_post_init() -> None:
    build = made_clean(_Quick)
    before = len(made)
    value = build(a=-1, b="x")  # __post_init__ would refuse it (and set d)
    assert len(made) == before + 1  # the factory still runs for a field not given
    assert list(vars(value)) == [f.name for f in dataclasses.fields(_Quick)]
    assert vars(value) == {"a": -1, "b": "x", "c": [], "d": 0}
    assert type(value) is _Quick and build(a=0, c=[1]) == _Quick(a=0, c=[1])
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'a'"):
        build()
    with pytest.raises(TypeError):
        build(a=1, e=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.a = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="not a quick_init class"):
        made_clean(_Plain)


def test_replaced_copies_as_dataclasses_replace_does() -> None:
    first = _Quick(a=1, b="x", c=[3])
    for changes in ({}, {"b": "y"}, {"a": 5}, {"c": [4], "d": 9}):
        mine, theirs = replaced(first, **changes), dataclasses.replace(first, **changes)
        assert vars(mine) == vars(theirs) and type(mine) is _Quick
        assert list(vars(mine)) == list(vars(theirs))  # field order kept
    assert replaced(first, a=4).d == 8  # __post_init__ ran on the copy
    assert vars(first) == {"a": 1, "b": "x", "c": [3], "d": 2}  # the original is as it was
    with pytest.raises(ValueError, match="negative"):
        replaced(first, a=-1)
    with pytest.raises(TypeError, match=r"_Quick has no field\(s\) e, f"):
        replaced(first, f=1, e=2)
    with pytest.raises(TypeError, match="not a quick_init class"):
        replaced(_Plain(a=1), b="y")


def test_a_replaced_turn_record_cleans_its_text_again() -> None:
    opening = turnkit.UserMessage(text="hi", turn_id="t1")
    record = TurnRecord(session_id="s", turn_id="t1", agent="a", status="running", opening=opening)
    failed = replaced(record, status="failed", error="bad\x00byte")
    assert failed == dataclasses.replace(record, status="failed", error="bad\x00byte")
    assert failed.error is not None and "\x00" not in failed.error


def test_a_clean_assistant_message_equals_the_one_its_init_makes() -> None:
    calls = (turnkit.ToolCall(id="c1", name="t", input={"k": 1}),)
    fields = {"text": "ok", "turn_id": "t1", "tool_calls": calls, "provider_state": {"s": 1}}
    made_one = made_clean(turnkit.AssistantMessage)(**fields)
    assert made_one == turnkit.AssistantMessage(**fields)
    assert list(vars(made_one)) == list(vars(turnkit.AssistantMessage(**fields)))


def test_only_frozen_keyword_only_dataclasses_take_it() -> None:
    @dataclass
    class Loose:
        a: int

    @dataclass(frozen=True)
    class Positional:
        a: int

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Slotted:
        a: int

    for cls in (Loose, Positional, Slotted, int):
        with pytest.raises(TypeError):
            quick_init(cls)


QUICK: list[type[Any]] = [
    *_EVENT_TYPES.values(),
    UnknownEvent,
    turnkit.StopReason,
    turnkit.ToolCall,
    turnkit.ModelReply,
    turnkit.UserMessage,
    turnkit.TriggerMessage,
    turnkit.AssistantMessage,
    turnkit.ToolMessage,
    turnkit.Usage,
    TextDelta,
    ReasoningDelta,
    ModelDone,
    ToolStepResult,
    ToolContext,
    TurnRecord,
]


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_the_values_made_every_step_are_quick_and_keep_their_signatures(cls: type[Any]) -> None:
    init = cls.__init__
    assert init.__qualname__ == f"{cls.__qualname__}.__init__"
    assert "update" in init.__code__.co_names  # quick_init's, not the dataclass's
    params = inspect.signature(cls).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert [p.name for p in params] == [f.name for f in dataclasses.fields(cls)]
