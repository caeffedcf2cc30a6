"""The public surface: a curated, sorted ``__all__`` and a core that imports no plug-in."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import ModuleType

import turnkit
import turnkit.stores
import turnkit.testing

PACKAGE = Path(turnkit.__file__).parent


def test_all_is_sorted_and_complete() -> None:
    for module in (turnkit, turnkit.stores, turnkit.testing):
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_all_is_exactly_the_public_names() -> None:
    for module in (turnkit, turnkit.stores, turnkit.testing):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            # a submodule counts only where the package exports it (turn_rules)
            and (not isinstance(value, ModuleType) or name in module.__all__)
            and name not in {"annotations", "TYPE_CHECKING", "Any"}
        }
        # Names a module serves lazily (PostgresStore, behind an optional extra)
        # are not in its namespace until first asked for.
        lazy = {name for name in module.__all__ if name not in vars(module)}
        assert public == set(module.__all__) - lazy, module.__name__


def test_public_classes_and_functions_report_the_package_as_their_module() -> None:
    for name in turnkit.__all__:
        value = getattr(turnkit, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == "turnkit", name


def test_package_ships_type_information() -> None:
    assert (PACKAGE / "py.typed").exists()


def test_turn_keywords_name_exactly_the_fields_of_turn_options() -> None:
    """The keywords every turn-starting call takes are ``TurnOptions``' fields, so a
    field added to one and not the other fails here."""
    fields = {f.name for f in dataclasses.fields(turnkit.TurnOptions)}
    assert set(turnkit.TurnKeywords.__annotations__) == fields


def test_a_runtime_offers_every_public_call_of_a_client_with_the_same_parameters() -> None:
    """Whatever takes a ``RuntimeClient`` (``create_app``, ``mount_agent``) can be
    handed a ``Runtime``: each public call of the client and of its sessions is
    there, taking the same parameters."""
    pairs = [
        (turnkit.RuntimeClient, turnkit.Runtime),
        (turnkit.SessionClient, turnkit.AgentSession),
    ]
    for client, runner in pairs:
        assert issubclass(runner, client)
        for name, member in vars(client).items():
            if name.startswith("_") or not callable(member):
                continue
            ours = inspect.signature(getattr(runner, name)).parameters
            assert list(ours) == list(inspect.signature(member).parameters), (runner, name)
