"""The Anthropic adapter: the Messages API's stream as turnkit deltas, the transcript as
Anthropic messages.

With thinking on, the API requires an assistant turn's thinking blocks, signatures and
all, to come back unchanged on the next call of a tool-use turn. The adapter keeps the
reply's content blocks, in order, on the assistant message's ``provider_state``, so
they survive replays and restarts like everything else the store holds.

Prompt caching (on unless ``cache=False``) marks two breakpoints: the system prompt,
which caches the tools and the prompt, and the last block of the request, which
caches the conversation so far; the next step or turn reads that prefix back as long
as the history policy leaves it unchanged. The reply's usage, cache reads and writes
included, goes on the stored reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import cast

from .._errors import ConfigurationError, ContextWindowError, ModelError, ModelOverloadedError
from .._seams.model import (
    ModelDelta,
    ModelDone,
    OutputSpec,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
)
from .._values.messages import (
    AssistantMessage,
    JsonObject,
    Message,
    ModelReply,
    StopKind,
    StopReason,
    ToolCall,
    ToolMessage,
)
from .._values.usage import Usage
from ._common import INPUT_ERROR, OVERLOADED, missing_sdk, result_text, retry_after, too_long

try:
    import anthropic as sdk
    from anthropic.types import (
        MessageParam,
        TextBlockParam,
        ThinkingConfigParam,
        ToolChoiceParam,
        ToolParam,
    )
except ImportError as exc:  # pragma: no cover - exercised by the no-extras import test
    raise ImportError(missing_sdk("anthropic", "anthropic")) from exc

#: The ``provider_state`` key under which this adapter keeps its own data.
STATE_KEY = "anthropic"

_STOPS: dict[str, StopKind] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "refusal",
    "pause_turn": "pause",
    "model_context_window_exceeded": "context_window",
}
_KEPT_BLOCKS = frozenset({"thinking", "redacted_thinking"})
#: The prompt-cache breakpoint (five minutes, refreshed on every hit).
_CACHED: JsonObject = {"type": "ephemeral"}


class AnthropicModel:
    """A turnkit ``Model`` over the official SDK's async streaming Messages API.

    ``thinking=True`` asks for adaptive thinking; an ``int`` asks for manual extended
    thinking with that token budget (for models without adaptive thinking).

    A typed answer (``output``) is asked for as a tool the model is forced to use:
    the output tool itself when the turn offers no other tool, any tool when it
    does (so the model can still work before it answers). With thinking on, the
    API forces no tool, so the model is only offered it. ``cache=False`` sends no
    prompt-cache breakpoints.
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        thinking: bool | int = False,
        max_tokens: int = 8192,
        max_retries: int | None = None,
        client: sdk.AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        cache: bool = True,
    ) -> None:
        self.model = model
        self.cache = cache
        self.max_tokens = max_tokens
        self.thinking = _thinking_config(thinking, max_tokens)
        self.thinking_on = thinking is not False
        if client is None:
            retries = sdk.DEFAULT_MAX_RETRIES if max_retries is None else max_retries
            client = sdk.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=retries)
        elif max_retries is not None:
            client = client.with_options(max_retries=max_retries)
        self.client = client

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r})"

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[ModelDelta]:
        offered = [*tools, output.tool()] if output is not None else list(tools)
        wire = wire_messages(messages, self.thinking_on)
        if self.cache:
            mark_last_block(wire)
        manager = self.client.messages.stream(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=cast("list[MessageParam]", wire),
            system=self._system(system),
            tools=[cast(ToolParam, t.to_dict()) for t in offered] if offered else sdk.omit,
            tool_choice=self._tool_choice(output, bool(tools)),
            thinking=self.thinking,
        )
        stopped = False
        try:
            async with manager as events:
                async for event in events:
                    if event.type == "text":
                        yield TextDelta(text=event.text)
                    elif event.type == "thinking":
                        yield ReasoningDelta(text=event.thinking)
                    elif event.type == "message_stop":
                        stopped = True
                if not stopped:
                    raise ModelError("anthropic: the stream ended before message_stop")
                final = await events.get_final_message()
        except sdk.AnthropicError as exc:
            raise _model_error(exc) from exc
        except ModelError:
            raise
        except Exception as exc:  # a transport failure mid-stream the SDK did not wrap
            raise ModelError(f"anthropic: the stream broke: {type(exc).__name__}: {exc}") from exc
        yield ModelDone(reply=reply_from(final))

    def _system(self, system: str | None) -> list[TextBlockParam] | str | sdk.Omit:
        """The system prompt, as a cached block when caching is on."""
        if not system:
            return sdk.omit
        if not self.cache:
            return system
        return [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]

    async def aclose(self) -> None:
        """Close the SDK client's connections (the runtime never needs this)."""
        await self.client.close()

    def _tool_choice(self, output: OutputSpec | None, others: bool) -> ToolChoiceParam | sdk.Omit:
        """Force the answer through a tool: the output tool, or any tool while the
        model may still need the others. Thinking allows no forcing."""
        if output is None or self.thinking_on:
            return sdk.omit
        if others:
            return {"type": "any"}
        return {"type": "tool", "name": output.name}


def _thinking_config(thinking: bool | int, max_tokens: int) -> ThinkingConfigParam | sdk.Omit:
    if thinking is False:
        return sdk.omit
    if thinking is True:
        return {"type": "adaptive"}
    if thinking < 1024 or thinking >= max_tokens:
        raise ConfigurationError(
            f"anthropic(thinking={thinking}): a thinking budget must be at least 1024 "
            f"and less than max_tokens ({max_tokens})"
        )
    return {"type": "enabled", "budget_tokens": thinking}


# -- the transcript, as the Messages API wants it ----------------------------------


def wire_messages(messages: Sequence[Message], thinking: bool = True) -> list[JsonObject]:
    """Anthropic messages for a transcript. Turns of one role are merged, which groups
    a step's tool results into one user message (the API wants them there, first).
    Kept thinking blocks go back only while thinking is on (the API needs them then)."""
    out: list[JsonObject] = []
    for message in messages:
        role = "assistant" if isinstance(message, AssistantMessage) else "user"
        blocks = _blocks(message, thinking)
        if not blocks:
            continue  # the API refuses empty content; a neighbour of the same role merges
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(message: Message, thinking: bool) -> list[JsonObject]:
    if isinstance(message, ToolMessage):
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.call_id,
                "content": result_text(message.result),
                "is_error": message.is_error,
            }
        ]
    if isinstance(message, AssistantMessage):
        return _assistant_blocks(message, thinking)
    return [{"type": "text", "text": message.text}] if message.text else []


def _assistant_blocks(message: AssistantMessage, thinking: bool) -> list[JsonObject]:
    state = (message.provider_state or {}).get(STATE_KEY)
    kept = state.get("content") if isinstance(state, dict) else None
    if isinstance(kept, list):
        # The reply's own blocks, in their order.
        return [dict(b) for b in kept if thinking or b.get("type") not in _KEPT_BLOCKS]
    blocks: list[JsonObject] = [{"type": "text", "text": message.text}] if message.text else []
    blocks += [_tool_use(call) for call in message.tool_calls]
    return blocks


def mark_last_block(wire: list[JsonObject]) -> None:
    """Put a cache breakpoint on the request's last block that may carry one (not a
    thinking block), so the next call reads everything up to it from the cache."""
    if not wire:
        return
    for block in reversed(wire[-1]["content"]):
        if block.get("type") not in _KEPT_BLOCKS:
            block["cache_control"] = dict(_CACHED)
            return


def _tool_use(call: ToolCall) -> JsonObject:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}


# -- the reply, as turnkit keeps it -------------------------------------------------


def reply_from(message: sdk.types.Message) -> ModelReply:
    """The ``ModelReply`` for a finished message; its blocks go into ``provider_state``
    when it has thinking the next call must send back."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    blocks: list[JsonObject] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        elif block.type == "thinking":
            blocks.append(
                {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
            )
        elif block.type == "redacted_thinking":
            blocks.append({"type": "redacted_thinking", "data": block.data})
        elif block.type == "tool_use":
            call = _call(block.id, block.name, block.input)
            calls.append(call)
            blocks.append(_tool_use(call))
    raw = message.stop_reason
    stop = StopReason(kind=_STOPS.get(raw, "other") if raw else "other", raw=raw)
    thought = any(b["type"] in _KEPT_BLOCKS for b in blocks)
    return ModelReply(
        text="".join(texts),
        tool_calls=tuple(calls),
        stop=stop,
        provider_state={STATE_KEY: {"content": blocks}} if thought else None,
        usage=usage_from(message.usage),
        model=message.model or None,
    )


def usage_from(usage: sdk.types.Usage) -> Usage:
    """turnkit's ``Usage`` for the API's: its ``input_tokens`` leave out the tokens read
    from or written to the cache, which turnkit's include."""
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    # Newer SDKs break the output down; older ones lack the field.
    details = getattr(usage, "output_tokens_details", None)
    reasoning = getattr(details, "thinking_tokens", None)
    return Usage(
        input_tokens=usage.input_tokens + read + written,
        output_tokens=usage.output_tokens,
        cache_read_tokens=read,
        cache_write_tokens=written,
        reasoning_tokens=reasoning if isinstance(reasoning, int) else 0,
    )


def _call(call_id: str, name: str, data: object) -> ToolCall:
    if isinstance(data, dict):
        return ToolCall(id=call_id, name=name, input=dict(data))
    problem = f"invalid arguments for {name}: expected a JSON object, got {data!r}"
    return ToolCall(id=call_id, name=name, input={}, provider_state={INPUT_ERROR: problem})


def _model_error(exc: sdk.AnthropicError) -> ModelError:
    """The ``ModelError`` for an SDK error: a ``ContextWindowError`` when the request
    was too long for the model."""
    text = describe_error(exc)
    if isinstance(exc, sdk.APIStatusError):
        said = exc.api_message or exc.message
        if too_long(exc.status_code, None, said):
            return ContextWindowError(text)
        if exc.status_code in OVERLOADED:
            return ModelOverloadedError(text, retry_after=retry_after(exc.response.headers))
    return ModelError(text)


def describe_error(exc: sdk.AnthropicError) -> str:
    """One line naming the HTTP status, the error type and the provider's own message."""
    if isinstance(exc, sdk.APIStatusError):
        kind = exc.type or "error"
        said = exc.api_message or exc.message
        ref = f" [request-id {exc.request_id}]" if exc.request_id else ""
        if exc.status_code >= 400:
            return f"anthropic: HTTP {exc.status_code} {kind}: {said}{ref}"
        return f"anthropic: the stream reported {kind}: {said}{ref}"  # an SSE error event
    if isinstance(exc, sdk.APITimeoutError):
        return "anthropic: the request timed out"
    if isinstance(exc, sdk.APIConnectionError):
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return f"anthropic: could not connect: {exc.message}{cause}"
    return f"anthropic: {type(exc).__name__}: {exc}"
