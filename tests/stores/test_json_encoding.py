"""The stores' JSON encoder (``stores/_json.py``) writes the very bytes pydantic's
``to_json`` wrote before it, for every value: orjson for plain JSON, pydantic for the
rest, and pydantic's refusal, word for word, for what is not JSON."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError, from_json, to_json

from turnkit.stores._json import json_bytes

#: Text without surrogates (those are refused: see the last test), NUL included.
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(TEXT, inner, max_size=4)
    ),
    max_leaves=25,
)


def pydantic_bytes(value: Any) -> bytes:
    return to_json(value, inf_nan_mode="null")


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_plain_json_is_written_as_pydantic_wrote_it(value: Any) -> None:
    encoded = json_bytes(value)
    assert encoded == pydantic_bytes(value)
    assert from_json(encoded) == from_json(pydantic_bytes(value))


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


class Subtext(str):
    pass


@dataclasses.dataclass
class Point:
    x: int
    label: str


OTHER_VALUES = [
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    Colour.RED,
    Size.LARGE,
    datetime.datetime(2026, 12, 6, 15, 4, 5, 123456, tzinfo=datetime.UTC),
    datetime.datetime(2026, 12, 6, 15, 4, 5),
    datetime.date(2026, 12, 6),
    decimal.Decimal("1.50"),
    Point(1, "a"),
    Subtext("sub"),
    {Subtext("key"): [Subtext("value")]},
    {1: "int key", 2.5: "float key"},
    b"bytes",
    {3, 1, 2},
    2**70,
    -(2**64),
    [{"deep": [1, (2, 3)]}],
]


@pytest.mark.parametrize("value", OTHER_VALUES, ids=repr)
def test_values_beyond_plain_json_are_written_by_pydantic_as_before(value: Any) -> None:
    assert json_bytes(value) == pydantic_bytes(value)


@pytest.mark.parametrize("value", [math.nan, [math.inf], {"x": -math.inf}])
def test_json_has_no_nan_or_infinity_so_both_write_null(value: Any) -> None:
    assert b"null" in json_bytes(value)
    assert json_bytes(value) == pydantic_bytes(value)


@pytest.mark.parametrize("value", ["a\udc80b", {"k": ["\ud800"]}, object()])
def test_what_is_not_json_is_refused_in_pydantics_words(value: Any) -> None:
    with pytest.raises(PydanticSerializationError) as ours:
        json_bytes(value)
    with pytest.raises(PydanticSerializationError) as theirs:
        pydantic_bytes(value)
    assert str(ours.value) == str(theirs.value)
