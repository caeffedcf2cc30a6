"""A faster ``__init__`` for the frozen value types the engine makes on every step.

A frozen dataclass's generated ``__init__`` stores each field with
``object.__setattr__`` (its own ``__setattr__`` refuses), a call per field on every
message, event and call of every step. ``quick_init`` gives such a class an
``__init__`` with the same keyword-only parameters, defaults, default factories and
``__post_init__`` that stores every field in one update of the new instance's
``__dict__``, in field order. Everything else (equality, hashing, ``repr``,
``replace``, the refusal to change a field) stays the dataclass's own.

A class whose ``__post_init__`` only makes its text storable (``text.clean_fields``)
also gets the same constructor without that call (``made_clean``), for a value the
engine builds from fields that are storable already: the reply's own text in its
assistant message, a result the step's tool message has just cleaned in its event.

``replaced`` is ``dataclasses.replace`` for such a class: a copy of the instance's
fields with some changed, through ``__post_init__`` as ``replace`` would, but without
looking up the class's fields and calling its constructor field by field (a turn's
record is copied this way several times a turn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar, cast

_C = TypeVar("_C", bound=type)
_T = TypeVar("_T")

#: An argument not given, for a field whose default comes from a factory.
_NOT_GIVEN: Any = type("_NotGiven", (), {"__repr__": lambda self: "<factory>"})()
#: Each quick class's constructor without ``__post_init__`` (see ``made_clean``).
_MADE_CLEAN: dict[type, Callable[..., Any]] = {}
#: Each quick class's field names (what ``replaced`` may change).
_FIELD_NAMES: dict[type, frozenset[str]] = {}


def quick_init(cls: _C) -> _C:
    """Give the frozen, keyword-only dataclass ``cls`` the faster ``__init__``
    (see the module docstring); for use as a decorator above ``@dataclass``."""
    if not is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__qualname__} is not a frozen dataclass")
    own = fields(cls)
    if len(own) != len(cls.__dataclass_fields__) or "__slots__" in vars(cls):
        raise TypeError(f"{cls.__qualname__} has pseudo-fields or slots; keep its own __init__")
    scope: dict[str, Any] = {
        "__name__": cls.__module__,
        "_NOT_GIVEN": _NOT_GIVEN,
        "_new": object.__new__,
        "_cls": cls,
    }
    params: list[str] = []
    values: list[str] = []
    for f in own:
        if not (f.init and f.kw_only):
            raise TypeError(f"{cls.__qualname__}.{f.name} is not a keyword-only init field")
        value = f.name
        if f.default is not MISSING:
            scope[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not MISSING:
            scope[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_NOT_GIVEN")
            value = f"_factory_{f.name}() if {f.name} is _NOT_GIVEN else {f.name}"
        else:
            params.append(f.name)
        values.append(f"{f.name!r}: {value}")
    post = "\n    self.__post_init__()" if hasattr(cls, "__post_init__") else ""
    source = (
        f"def __init__(self, *, {', '.join(params)}):\n"
        f"    self.__dict__.update({{{', '.join(values)}}}){post}\n"
        f"def _made_clean(*, {', '.join(params)}):\n"
        f"    self = _new(_cls)\n"
        f"    self.__dict__.update({{{', '.join(values)}}})\n"
        f"    return self\n"
    )
    exec(source, scope)
    made = scope["_made_clean"]
    made.__qualname__ = f"{cls.__qualname__}.made_clean"
    _MADE_CLEAN[cls] = made
    _FIELD_NAMES[cls] = frozenset(f.name for f in own)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(cls.__init__.__annotations__)
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def made_clean(cls: type[_T]) -> Callable[..., _T]:
    """The constructor of the ``quick_init`` class ``cls`` that takes the same
    arguments and skips ``__post_init__``: only for a class whose ``__post_init__``
    does nothing but ``clean_fields``, and only with fields known storable (each one
    made by a value that cleaned it, or a copy of one), which that call would merely
    check again."""
    made = _MADE_CLEAN.get(cls)
    if made is None:
        raise TypeError(f"{cls.__qualname__} is not a quick_init class")
    return cast(Callable[..., _T], made)


def replaced(obj: _T, /, **changes: Any) -> _T:
    """A copy of ``obj`` (an instance of a ``quick_init`` class) with ``changes``
    made, as ``dataclasses.replace(obj, **changes)`` makes it: the same fields,
    ``__post_init__`` run on the result, and a ``TypeError`` naming a field the class
    does not have."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        raise TypeError(f"{cls.__qualname__} is not a quick_init class")
    if not names.issuperset(changes):
        unknown = ", ".join(sorted(set(changes) - names))
        raise TypeError(f"{cls.__qualname__} has no field(s) {unknown}")
    new = object.__new__(cls)
    fields_of_new = new.__dict__
    fields_of_new.update(obj.__dict__)
    fields_of_new.update(changes)
    post = getattr(new, "__post_init__", None)
    if post is not None:
        post()
    return new
