"""Tool declarations: schemas from type hints, classification by declaration, clear errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from typing import Annotated, Any

import pytest
from eventually import eventually
from pydantic import BaseModel, Field

import turnkit
from turnkit import (
    ActionContext,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolSpec,
    define_action,
    tool,
)
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


class Address(BaseModel):
    city: str
    zip: str | None = None


def test_tool_schema_comes_from_name_docstring_and_hints() -> None:
    @tool
    def ship(item: str, qty: int, to: Address, express: bool = False, ctx: Any = None) -> str:
        """Ship an item to an address."""
        return "ok"

    assert ship.name == "ship" and ship.local
    assert ship.spec.description == "Ship an item to an address."
    schema = ship.spec.input_schema
    assert schema["required"] == ["item", "qty", "to"]
    assert set(schema["properties"]) == {"item", "qty", "to", "express"}  # ctx is hidden
    assert schema["properties"]["qty"]["type"] == "integer"
    assert schema["additionalProperties"] is False


async def test_annotated_constraints_reach_the_schema_and_the_validation(
    open_runtime: Any,
) -> None:
    ran: list[int] = []

    @tool
    def buy(quantity: Annotated[int, Field(ge=1, description="How many")], item: str) -> int:
        """Buy some of an item."""
        ran.append(quantity)
        return quantity

    quantity = buy.spec.input_schema["properties"]["quantity"]
    assert quantity["minimum"] == 1 and quantity["description"] == "How many"
    model = ScriptedModel(
        [
            ScriptedReply(tool_calls=[tool_call("buy", {"quantity": 0, "item": "pen"})]),
            ScriptedReply(tool_calls=[tool_call("buy", {"quantity": 2, "item": "pen"})]),
            "bought",
        ]
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[buy]))
    session = rt.session("a", "s1")
    assert await session.turn("buy pens") == "bought"
    refused, accepted = [m for m in await session.messages() if isinstance(m, turnkit.ToolMessage)]
    # The model reads why its input was refused, and the tool never saw the 0.
    assert refused.is_error and refused.result == {
        "error": "invalid input: quantity: Input should be greater than or equal to 1"
    }
    assert accepted.result == 2 and ran == [2]


GOOGLE = """Book a table.

    Picks the first free one.

    Args:
        guests: How many people
            will come.
        day: The day, as YYYY-MM-DD.
        ctx: The tool context (not shown to the model).

    Returns:
        The booking's id.
    """

NUMPY = """Book a table.

    Picks the first free one.

    Parameters
    ----------
    guests : int
        How many people
        will come.
    day : str
        The day, as YYYY-MM-DD.

    Returns
    -------
    str
        The booking's id.
    """

SPHINX = """Book a table.

    Picks the first free one.

    :param guests: How many people
        will come.
    :param str day: The day, as YYYY-MM-DD.
    :returns: The booking's id.
    """


@pytest.mark.parametrize("docstring", [GOOGLE, NUMPY, SPHINX], ids=["google", "numpy", "sphinx"])
def test_parameter_descriptions_come_from_the_docstring(docstring: str) -> None:
    def book(guests: int, day: str, ctx: ToolContext) -> str:
        return day

    book.__doc__ = docstring
    booked = tool(book)
    props = booked.spec.input_schema["properties"]
    assert props["guests"]["description"] == "How many people\nwill come."
    assert props["day"]["description"] == "The day, as YYYY-MM-DD."
    # The parameters moved into the schema; the rest of the docstring describes the tool.
    assert booked.spec.description == (
        "Book a table.\n\nPicks the first free one.\n\nReturns: The booking's id."
    )


def test_an_explicit_field_description_wins_over_the_docstring() -> None:
    @tool
    def book(
        guests: Annotated[int, Field(ge=1, description="Party size")],
        day: str = Field("today", description="When"),
        note: Annotated[str, Field(max_length=3)] = "",
    ) -> str:
        """Book a table.

        Args:
            guests: From the docstring.
            day: From the docstring too.
            note: A short note.
        """
        return day

    props = book.spec.input_schema["properties"]
    assert props["guests"]["description"] == "Party size" and props["guests"]["minimum"] == 1
    assert props["day"]["description"] == "When" and props["day"]["default"] == "today"
    assert props["note"]["description"] == "A short note." and props["note"]["maxLength"] == 3
    assert book.spec.description == "Book a table."
    with pytest.raises(ValueError, match="note: String should have at most 3 characters"):
        book.run({"guests": 2, "note": "long"}, None)


def test_a_docstring_describing_what_the_function_lacks_is_refused() -> None:
    def stale(guests: int) -> int:
        """Book a table.

        Args:
            guests: How many.
            day: Which day.
        """
        return guests

    def sections_only(guests: int) -> int:
        """:param guests: How many."""
        return guests

    with pytest.raises(ToolDefinitionError, match="describes 'day', which the function does not"):
        tool(stale)
    with pytest.raises(ToolDefinitionError, match="no description"):
        tool(sections_only)
    # An explicit description is enough; the parameters still come from the docstring.
    named = tool(description="Book.")(sections_only)
    assert named.spec.description == "Book."
    assert named.spec.input_schema["properties"]["guests"]["description"] == "How many."


def test_a_docstring_without_sections_is_the_description_as_written() -> None:
    @tool
    def note() -> None:
        """Keep a note.

        Example: not a section, only a line with a colon.
        """

    assert note.spec.description == (
        "Keep a note.\n\nExample: not a section, only a line with a colon."
    )


def test_importing_turnkit_does_not_load_the_docstring_parser() -> None:
    check = "import sys, turnkit; assert 'docstring_parser' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True)


def test_async_def_is_remote_and_overrides_apply() -> None:
    @tool(name="lookup-v2", description="Find things.")
    async def lookup(q: str) -> list[str]:
        return [q]

    assert lookup.name == "lookup-v2" and not lookup.local
    assert lookup.spec.description == "Find things."


def test_a_context_parameter_is_found_by_its_type() -> None:
    @tool
    def where(context: ToolContext) -> str:
        """Where am I."""
        return context.session_id

    assert where.spec.input_schema["properties"] == {}


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dots.not.ok"])
def test_invalid_tool_names_are_refused(name: str) -> None:
    with pytest.raises(ToolDefinitionError, match="invalid tool name"):
        Tool(ToolSpec(name=name, description="d", input_schema={}), lambda i, c: None)


def test_missing_docstring_and_varargs_are_refused() -> None:
    def nodoc(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match="no description"):
        tool(nodoc)

    def star(*args: int) -> None:
        """Star."""

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        tool(star)


def test_raw_tool_classification_follows_run() -> None:
    spec = ToolSpec(name="t", description="d", input_schema={"type": "object"})

    class AsyncCallable:
        async def __call__(self, data: Any, ctx: Any) -> None:
            return None

    assert Tool(spec, lambda data, ctx: None).local
    assert not Tool(spec, AsyncCallable()).local
    with pytest.raises(ToolDefinitionError, match="run must be callable"):
        Tool(spec, 42)  # type: ignore[arg-type]


async def test_define_action_sees_only_the_user(open_runtime: Any) -> None:
    seen: list[Any] = []

    def local_run(data: dict[str, Any], actx: ActionContext) -> str:
        seen.append(actx)
        return f"hello {data['name']}"

    async def remote_run(data: dict[str, Any], actx: ActionContext) -> str:
        seen.append(actx)
        return "remote"

    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    greet = define_action(name="greet", description="Greet.", input_schema=schema, run=local_run)
    ping = define_action(name="ping", description="Ping.", input_schema=schema, run=remote_run)
    assert greet.local and not ping.local
    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("greet", {"name": "Ada"}), tool_call("ping")]), "ok"]
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[greet, ping]))
    user = turnkit.User(id="U1", attested=True)
    event = turnkit.InboundEvent(source="test", text="hi", user=user)
    await rt.session("a", "s1").turn("hi", event=event)
    assert seen == [ActionContext(user=user), ActionContext(user=user)]
    with pytest.raises(ToolDefinitionError, match="input_schema"):
        define_action(name="x", description="d", input_schema="nope", run=local_run)  # type: ignore[arg-type]


def test_agent_validates_its_tools() -> None:
    @tool
    def a() -> None:
        """A."""

    model = ScriptedModel([])
    with pytest.raises(turnkit.ConfigurationError, match="duplicate tool name 'a'"):
        turnkit.Agent(name="x", model=model, tools=[a, a])
    with pytest.raises(turnkit.ConfigurationError, match="is not a Tool"):
        turnkit.Agent(name="x", model=model, tools=[lambda: None])  # type: ignore[list-item]
    with pytest.raises(turnkit.ConfigurationError, match="no stream"):
        turnkit.Agent(name="x", model=object())  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match="non-empty"):
        turnkit.Agent(name=" ", model=model)


async def test_tool_results_are_converted_to_json(open_runtime: Any) -> None:
    @tool
    def where() -> Address:
        """Return a pydantic model."""
        return Address(city="Oslo")

    @tool
    def unjsonable() -> object:
        """Return something JSON cannot hold."""
        return object()

    model = ScriptedModel(
        [ScriptedReply(tool_calls=[tool_call("where"), tool_call("unjsonable")]), "ok"]
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[where, unjsonable]))
    session = rt.session("a", "s1")
    await session.turn("hi")
    results = [m for m in await session.messages() if isinstance(m, turnkit.ToolMessage)]
    assert results[0].result == {"city": "Oslo", "zip": None}
    assert results[1].is_error and "PydanticSerializationError" in results[1].result["error"]


def test_parameters_the_model_cannot_fill_are_refused_at_declaration() -> None:
    def private(_secret: str) -> str:
        """Has a private-looking parameter."""
        return _secret

    def reserved(model_config: str) -> str:
        """Clashes with pydantic."""
        return model_config

    def positional(a: int, /) -> int:
        """Positional-only."""
        return a

    with pytest.raises(ToolDefinitionError, match="'_secret' cannot be an input field"):
        tool(private)
    with pytest.raises(ToolDefinitionError, match="'model_config' cannot be an input field"):
        tool(reserved)
    with pytest.raises(ToolDefinitionError, match="positional-only"):
        tool(positional)


def test_generator_functions_are_not_tools() -> None:
    async def stream_things() -> Any:
        """Yields."""
        yield 1

    def gen(ctx: Any, data: Any) -> Any:
        yield 1

    with pytest.raises(ToolDefinitionError, match="generator function"):
        tool(stream_things)
    with pytest.raises(ToolDefinitionError, match="generator function"):
        Tool(ToolSpec(name="g", description="d", input_schema={}), gen)


async def test_a_def_returning_an_awaitable_fails_and_its_work_never_happens(
    open_runtime: Any,
) -> None:
    happened: list[str] = []

    async def side_effect() -> None:
        happened.append("charged")

    @tool
    def schedule() -> Any:
        """Returns a coroutine from a plain def."""
        return side_effect()

    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call("schedule")]), "told"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[schedule]))
    session = rt.session("a", "s1")
    result = await session.result(session.start("go"))
    assert result.status == "failed" and "async def" in (result.error or "")
    assert happened == []  # the coroutine was closed, never run


async def test_def_tools_run_off_the_event_loop(open_runtime: Any) -> None:
    loops: list[bool] = []

    def has_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @tool
    def plain() -> str:
        """No context."""
        loops.append(has_loop())
        return "ok"

    @tool
    def with_ctx(ctx: ToolContext) -> str:
        """With a context."""
        loops.append(has_loop())
        return "ok"

    action = define_action(
        name="act",
        description="An action.",
        input_schema={"type": "object"},
        run=lambda data, actx: loops.append(has_loop()),
    )
    calls = [tool_call("plain"), tool_call("with_ctx"), tool_call("act")]
    model = ScriptedModel([ScriptedReply(tool_calls=calls), "ok"])
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[plain, with_ctx, action]))
    assert await rt.session("a", "s1").turn("go") == "ok"
    assert loops == [False, False, False]


@pytest.mark.parametrize("uses_store", [False, True], ids=["plain", "ctx"])
async def test_other_sessions_stream_while_a_def_tool_blocks(
    open_runtime: Any, make_store: Any, store_kind: str, uses_store: bool
) -> None:
    """A ``def`` tool blocks (on an Event set only once another session's turn has
    streamed to its end); that turn runs meanwhile, and the tool's step still commits
    in one transaction with the rows it wrote through ``ctx.store``."""
    started, go = threading.Event(), threading.Event()
    write = uses_store and store_kind != "memory"  # memory has no SQL handle

    def wait_for_go(ctx: ToolContext) -> str:
        started.set()
        # A safety net only: if the tool blocked the loop, the other turn never runs,
        # go is never set, and the tool gives up with an error the test then sees.
        if not go.wait(timeout=60):
            raise RuntimeError("the other session never ran: the event loop was blocked")
        if write:
            ctx.store.execute("CREATE TABLE IF NOT EXISTS marks (v TEXT)")
            ctx.store.execute("INSERT INTO marks (v) VALUES (?)", ("after the wait",))
        return "went"

    blocking = Tool(
        ToolSpec(name="wait_for_go", description="Wait.", input_schema={"type": "object"}),
        lambda data, ctx: wait_for_go(ctx),
        needs_store=uses_store,
    )
    waiter = turnkit.Agent(
        name="waiter",
        model=ScriptedModel([ScriptedReply(tool_calls=[tool_call("wait_for_go")]), "done"]),
        tools=[blocking],
    )
    talker = turnkit.Agent(
        name="talker", model=ScriptedModel([ScriptedReply(text="streaming while a tool blocks")])
    )
    store = make_store()
    rt = await open_runtime(waiter, talker, store=store)
    blocked = rt.session("waiter", "s1")
    blocked_turn = blocked.start("wait")
    await eventually(started.is_set, what="the tool running (on some thread)")

    other = rt.session("talker", "s2")
    stream = other.observe(other.start("talk"))
    seen = [event async for event in stream]
    assert not go.is_set()  # all of the other turn happened while the tool blocked
    deltas = "".join(e.text for e in seen if isinstance(e, turnkit.MessageDeltaEvent))
    assert deltas == "streaming while a tool blocks"
    assert seen[-1].type == "turn.completed"
    go.set()

    result = await blocked.result(blocked_turn)
    assert result.status == "completed" and result.text == "done"
    [tool_message] = [m for m in await blocked.messages() if isinstance(m, turnkit.ToolMessage)]
    assert tool_message.result == "went" and not tool_message.is_error
    if write:
        rows = await store.session("s1").run_tool(
            lambda handle: (handle.execute("SELECT v FROM marks"), [])
        )
        assert rows == [("after the wait",)]


def test_only_a_tool_that_can_see_the_context_asks_for_the_store_handle() -> None:
    @tool
    def plain(a: int) -> int:
        """No context."""
        return a

    @tool
    def writer(a: int, ctx: turnkit.ToolContext) -> int:
        """Writes through ctx.store."""
        return a

    action = turnkit.define_action(
        name="act", description="d", input_schema={"type": "object"}, run=lambda d, a: d
    )
    raw = Tool(ToolSpec(name="raw", description="d", input_schema={}), lambda d, c: d)
    assert (plain.needs_store, writer.needs_store, action.needs_store, raw.needs_store) == (
        False,
        True,
        False,
        True,
    )
