"""``TurnOptions``: one value for how a turn starts, taken by every call that starts
one, as the value or as its keywords — on every store for the runtime cases."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit import ConfigurationError, InboundEvent, Proactive, TurnOptions
from turnkit.testing import ScriptedModel


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ({"event": "hi"}, TypeError, "event must be an InboundEvent"),
        ({"trigger": "cron"}, TypeError, "trigger must be a Proactive"),
        (
            {"event": InboundEvent(source="x", text="t"), "trigger": Proactive(by="cron:x")},
            ConfigurationError,
            "either an inbound event or a trigger",
        ),
        ({"replace": "yes"}, ConfigurationError, "replace must be a bool"),
        ({"turn_id": ""}, ConfigurationError, "turn_id must be a non-empty str"),
        ({"owner": 7}, ConfigurationError, "owner must be a non-empty str"),
        ({"turn_id": "a\x00b"}, ConfigurationError, "turn_id .* contains"),
        ({"tenant": 3}, ConfigurationError, "tenant must be a str"),
    ],
)
def test_bad_options_are_refused_naming_what_is_wrong(
    given: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says.replace("(", r"\(")):
        TurnOptions(**given)


def test_the_default_tenant_is_the_empty_key() -> None:
    assert TurnOptions().tenant_key == "" and TurnOptions(tenant="acme").tenant_key == "acme"


async def test_a_turn_takes_its_options_as_one_value_or_as_keywords(open_runtime: Any) -> None:
    agent = turnkit.Agent(name="a", model=ScriptedModel(["one", "two", "three"]))
    rt = await open_runtime(agent)
    session = rt.session("a", "s1")
    first = await session.submit("hi", TurnOptions(turn_id="t-1", owner="u1", tenant="acme"))
    assert first == "t-1"
    assert (await session.result(first)).text == "one"
    record = await session.turn_record("t-1")
    assert record is not None and record.tenant == "acme"
    assert await session.turn("again", owner="u1", turn_id="t-2") == "two"
    ctx = turnkit.mount_agent(agent, rt)
    assert await ctx.run("more", TurnOptions(owner="u1"), session="s1") == "three"
    with pytest.raises(turnkit.SessionOwnerError):
        await session.submit("not yours", TurnOptions(owner="u2"))


async def test_options_given_both_ways_or_unknown_keywords_are_refused(open_runtime: Any) -> None:
    rt = await open_runtime(turnkit.Agent(name="a", model=ScriptedModel([])))
    session = rt.session("a", "s1")
    with pytest.raises(ConfigurationError, match="not both"):
        session.start("hi", TurnOptions(owner="u1"), tenant="acme")
    with pytest.raises(TypeError, match="no option 'tennant'"):
        await session.submit("hi", tennant="acme")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"options must be a turnkit\.TurnOptions"):
        session.start("hi", {"owner": "u1"})  # type: ignore[arg-type]
    assert await session.status() == "new"
