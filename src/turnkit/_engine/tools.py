"""Tool declarations: raw ``Tool``, the ``@tool`` decorator and ``define_action``.

A tool's delivery guarantee follows from how its ``run`` is declared: a plain
``def`` is *local* and runs inside the step's store transaction (exactly-once for
writes made through ``ctx.store``); an ``async def`` is *remote*, runs outside it
and is at-least-once, so it gets a stable ``ctx.idempotency_key``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    TypeAlias,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

import pydantic
from pydantic.fields import FieldInfo

from .._errors import ToolDefinitionError
from .._seams.model import ToolSpec
from .._values.inbound import User
from .._values.messages import JsonObject
from .approval import Approval, approved_run
from .docstrings import ToolDoc, read_tool_doc
from .input_errors import ToolInputError
from .retries import Retry

if TYPE_CHECKING:
    from .context import ToolContext

#: What both Anthropic and OpenAI accept as a tool name.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

RunFn: TypeAlias = Callable[[Any, "ToolContext"], Any]


def is_async_callable(fn: object) -> bool:
    """True for an ``async def`` function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - we need the bound method itself
    return call is not None and inspect.iscoroutinefunction(call)


def _refuse_generators(fn: object, name: str) -> None:
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise ToolDefinitionError(
            f"tool {name!r} is a generator function; a tool returns one result "
            "(use `def` or `async def` with `return`)"
        )


def check_tool_name(name: str) -> str:
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ToolDefinitionError(
            f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-'"
        )
    return name


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: what it is told (``spec``) and what runs (``run``).

    ``run(input, ctx)`` receives the model's input as a dict and a ``ToolContext``.
    Declare it ``async def`` when it awaits anything: see the module docstring.
    """

    spec: ToolSpec
    run: RunFn
    #: False when ``run`` can never reach ``ctx.store`` (a ``@tool`` function without
    #: a context parameter, a ``define_action``), so a local step need not hand it
    #: the transaction's handle, which some stores open only on demand.
    needs_store: bool = True
    #: For a ``define_action`` tool, its own ``run(input, ActionContext)``: what
    #: ``turnkit.mcp.server`` calls to serve the action outside any turn.
    action: Callable[[Any, ActionContext], Any] | None = field(
        default=None, repr=False, compare=False
    )
    #: How a failed call is tried again (``turnkit.Retry``); ``None``: only a
    #: ``RetryableError`` is, by the default ``Retry()``.
    retry: Retry | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, ToolSpec):
            raise ToolDefinitionError(
                f"Tool.spec must be a ToolSpec, got {type(self.spec).__name__}"
            )
        check_tool_name(self.spec.name)
        if not callable(self.run):
            raise ToolDefinitionError(f"tool {self.spec.name!r}: run must be callable")
        if self.retry is not None and not isinstance(self.retry, Retry):
            raise ToolDefinitionError(
                f"tool {self.spec.name!r}: retry= takes a turnkit.Retry, got {self.retry!r}"
            )
        _refuse_generators(self.run, self.spec.name)
        object.__setattr__(self, "local", not is_async_callable(self.run))

    #: True when ``run`` is a plain ``def`` and so runs inside the step transaction.
    local: bool = field(init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.spec.name

    def with_approval(self, approval: Approval) -> Tool:
        """This tool, asking a person to decide on each call ``approval`` says needs it
        (what ``define_action(approval=...)`` and ``@tool(approval=...)`` do), for a
        tool made elsewhere: a ``subagent``, a library's."""
        return _approved(self, approval)


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "input"
        parts.append(f"{where}: {err['msg']}")
    return "invalid input: " + "; ".join(parts)


def _has_description(hint: Any, default: Any) -> bool:
    """Whether the parameter carries its own ``Field(description=...)``, in an
    ``Annotated`` hint or as its default: that wins over the docstring."""
    infos = [default] if isinstance(default, FieldInfo) else []
    if get_origin(hint) is Annotated:
        infos += [m for m in get_args(hint)[1:] if isinstance(m, FieldInfo)]
    return any(info.description is not None for info in infos)


def _described(hint: Any, default: Any, doc: str | None) -> Any:
    """``hint`` with the docstring's description of the parameter, unless it has one."""
    if doc is None or _has_description(hint, default):
        return hint
    return cast(Any, Annotated)[hint, pydantic.Field(description=doc)]


class _FunctionTool:
    """Adapts a typed Python function to ``run(input, ctx)``, validating input with pydantic.

    ``Annotated`` constraints (``Annotated[int, Field(ge=1)]``) reach both the schema
    the model reads and the validation its input gets.
    """

    def __init__(self, fn: Callable[..., Any], name: str, doc: ToolDoc) -> None:
        self.fn = fn
        self.name = name
        sig = inspect.signature(fn)
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ToolDefinitionError(f"tool {name!r}: cannot resolve type hints: {exc}") from exc
        from .context import ToolContext

        self.ctx_param: str | None = None
        field_defs: dict[str, Any] = {}
        for pname, param in sig.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(f"tool {name!r}: *args and **kwargs are not supported")
            if param.kind is param.POSITIONAL_ONLY:
                raise ToolDefinitionError(
                    f"tool {name!r}: parameter {pname!r} is positional-only; the model passes "
                    "arguments by name"
                )
            hint = hints.get(pname, Any)
            if hint is ToolContext or pname == "ctx":
                self.ctx_param = pname
                continue
            if pname.startswith(("_", "model_")):
                raise ToolDefinitionError(
                    f"tool {name!r}: parameter {pname!r} cannot be an input field "
                    "(names starting with '_' or 'model_' are reserved by pydantic)"
                )
            default = ... if param.default is param.empty else param.default
            field_defs[pname] = (_described(hint, default, doc.params.get(pname)), default)
        unknown = sorted(set(doc.params) - set(sig.parameters))
        if unknown:
            raise ToolDefinitionError(
                f"tool {name!r}: its docstring describes {', '.join(map(repr, unknown))}, "
                "which the function does not take"
            )
        config = pydantic.ConfigDict(extra="forbid")
        self.model = pydantic.create_model(f"{name}_input", __config__=config, **field_defs)
        #: The input's field names, read once (a class property that costs per read).
        self.fields = tuple(self.model.model_fields)
        schema = self.model.model_json_schema()
        schema.pop("title", None)
        self.schema: JsonObject = schema
        self.is_async = inspect.iscoroutinefunction(fn)

    def _kwargs(self, data: Any, ctx: ToolContext) -> dict[str, Any]:
        try:
            parsed = self.model.model_validate(data if data is not None else {})
        except pydantic.ValidationError as exc:
            raise ToolInputError(_validation_message(exc)) from None
        kwargs: dict[str, Any] = {}
        for k in self.fields:  # (a loop, not a comprehension: no frame of its own a call)
            kwargs[k] = getattr(parsed, k)
        if self.ctx_param is not None:
            kwargs[self.ctx_param] = ctx
        return kwargs

    def run_sync(self, data: Any, ctx: ToolContext) -> Any:
        return self.fn(**self._kwargs(data, ctx))

    async def run_async(self, data: Any, ctx: ToolContext) -> Any:
        return await self.fn(**self._kwargs(data, ctx))


def _approved(tool: Tool, approval: Approval | None) -> Tool:
    """``tool``, asking for a decision (``approval``) before each call that needs one.

    The wrapped tool is ``async`` (a turn parks only outside a transaction), so a
    plain ``def`` tool that may write through ``ctx.store`` cannot take an approval.
    It has no ``action``: an MCP server serves actions outside any turn, where
    nobody could be asked, so an action behind an approval is not served there.
    """
    if approval is None:
        return tool
    if not isinstance(approval, Approval):
        raise ToolDefinitionError(
            f"tool {tool.name!r}: approval= takes a turnkit.Approval, got {approval!r}"
        )
    if tool.local and tool.needs_store:
        raise ToolDefinitionError(
            f"tool {tool.name!r} takes a context and is a plain def, so it writes inside the "
            "step's transaction, which cannot wait for a person: declare it `async def` to "
            "give it an approval"
        )
    run = approved_run(tool.run, local=tool.local, spec=tool.spec, approval=approval)
    return Tool(tool.spec, run, needs_store=False)


def _from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    approval: Approval | None = None,
) -> Tool:
    if not callable(fn):
        raise ToolDefinitionError(f"@tool needs a function, got {type(fn).__name__}")
    _refuse_generators(fn, name or str(getattr(fn, "__name__", "?")))
    tool_name = check_tool_name(name or fn.__name__)
    docstring = inspect.getdoc(fn)
    doc = read_tool_doc(docstring) if docstring else ToolDoc("")
    text = description if description is not None else doc.description
    if not text:
        raise ToolDefinitionError(
            f"tool {tool_name!r} has no description: give the function a docstring "
            "that says what it does (before any Args section)"
        )
    adapter = _FunctionTool(fn, tool_name, doc)
    run: RunFn = adapter.run_async if adapter.is_async else adapter.run_sync
    spec = ToolSpec(name=tool_name, description=text, input_schema=adapter.schema)
    return _approved(Tool(spec, run, needs_store=adapter.ctx_param is not None), approval)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    approval: Approval | None = None,
    retry: Retry | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: Approval | None = None,
    retry: Retry | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a typed function.

    The name comes from the function, the description from its docstring and the
    input schema from its type hints (``Annotated`` constraints included), with each
    parameter described by the docstring's ``Args`` section unless its ``Field`` has
    a description. A parameter typed ``ToolContext`` (or named ``ctx``) receives the
    context and is not shown to the model. ``approval`` (a ``turnkit.Approval``)
    has a person decide on each call before it runs; ``retry`` (a ``turnkit.Retry``)
    tries a failed call again after a durable wait.
    """
    if fn is not None:
        return _retried(_from_function(fn, name, description, approval), retry)
    return lambda f: _retried(_from_function(f, name, description, approval), retry)


def _retried(tool: Tool, retry: Retry | None) -> Tool:
    """``tool`` with its ``Retry`` policy (a wait parks the turn, so a plain ``def``
    tool that writes in the step's transaction retries only a ``RetryableError``
    it raises, like any other)."""
    return tool if retry is None else replace(tool, retry=retry)


@dataclass(frozen=True, kw_only=True)
class ActionContext:
    """What a ``define_action`` run may see: only who asked."""

    user: User | None


def define_action(
    *,
    name: str,
    description: str,
    input_schema: JsonObject,
    run: Callable[[Any, ActionContext], Any],
    approval: Approval | None = None,
    retry: Retry | None = None,
) -> Tool:
    """A tool whose ``run(input, actx)`` sees only an ``ActionContext``, never the store.

    ``def`` makes it local and ``async def`` remote, exactly as for ``Tool``.
    ``approval`` (a ``turnkit.Approval``) has a person decide on each call before
    ``run`` runs (the action then runs outside the step's transaction); ``retry``
    (a ``turnkit.Retry``) tries a failed call again after a durable wait.
    """
    if not isinstance(input_schema, dict):
        raise ToolDefinitionError(f"action {name!r}: input_schema must be a JSON-schema dict")
    spec = ToolSpec(name=name, description=description, input_schema=input_schema)

    def action_ctx(ctx: ToolContext) -> ActionContext:
        return ActionContext(user=ctx.event.user if ctx.event else None)

    if is_async_callable(run):

        async def run_remote(data: Any, ctx: ToolContext) -> Any:
            return await cast(Any, run)(data, action_ctx(ctx))

        remote = Tool(spec, run_remote, needs_store=False, action=run)
        return _retried(_approved(remote, approval), retry)

    def run_local(data: Any, ctx: ToolContext) -> Any:
        return run(data, action_ctx(ctx))

    local = Tool(spec, run_local, needs_store=False, action=run)
    return _retried(_approved(local, approval), retry)
