"""The OpenAI adapter: Chat Completions streaming, so it also serves every
OpenAI-compatible server (vLLM, Ollama, llama.cpp, LM Studio) through ``base_url``.

Tool-call arguments arrive in pieces and are assembled here; arguments that are not a
JSON object become an error result the model reads, not a crashed turn. The stream
asks for the usage chunk (``stream_options``), which goes on the stored reply.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

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
    Message,
    ModelReply,
    StopKind,
    StopReason,
    ToolCall,
    ToolMessage,
)
from .._values.usage import Usage
from ._common import (
    OVERLOADED,
    arguments_call,
    missing_sdk,
    result_text,
    retry_after,
    too_long,
)
from ._strict_schema import strict_schema

try:
    import openai as sdk
    from openai.types.chat import (
        ChatCompletionChunk,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
        completion_create_params,
    )
    from openai.types.chat.chat_completion_chunk import ChoiceDelta
    from openai.types.completion_usage import CompletionUsage
except ImportError as exc:  # pragma: no cover - exercised by the no-extras import test
    raise ImportError(missing_sdk("openai", "openai")) from exc

_STOPS: dict[str, StopKind] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}
#: Where OpenAI-compatible servers put reasoning text on a delta (vLLM, Ollama,
#: DeepSeek, OpenRouter); the official API sends none on Chat Completions.
_REASONING_FIELDS = ("reasoning_content", "reasoning")
#: Sent when a server needs no key but the SDK insists on one.
PLACEHOLDER_KEY = "unused"


class OpenAIModel:
    """A turnkit ``Model`` over the official SDK's streaming Chat Completions API.

    A typed answer (``output``) is asked for with a JSON-schema ``response_format``,
    strict when the schema fits strict mode's subset. ``structured_output=False``
    offers it as a tool instead, for servers without JSON-schema responses.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        max_tokens: int | None = None,
        max_retries: int | None = None,
        client: sdk.AsyncOpenAI | None = None,
        api_key: str | None = None,
        structured_output: bool = True,
        stream_usage: bool = True,
    ) -> None:
        self.model = model
        self.stream_usage = stream_usage
        self.max_tokens = max_tokens
        self.structured_output = structured_output
        if client is None:
            client = _client(api_key, base_url, max_retries)
        elif max_retries is not None:
            client = client.with_options(max_retries=max_retries)
        self.client = client
        default = str(client.base_url).startswith("https://api.openai.com")
        self.label = "openai" if default else f"openai-compatible server {client.base_url}"

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={str(self.client.base_url)!r})"

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[ModelDelta]:
        reply = _Reply()
        as_tool = output is not None and not self.structured_output
        offered = [*tools, output.tool()] if as_tool and output is not None else list(tools)
        try:
            chunks = await self.client.chat.completions.create(
                model=self.model,
                messages=wire_messages(messages, system),
                tools=[_tool(t) for t in offered] if offered else sdk.omit,
                response_format=_response_format(output) if not as_tool else sdk.omit,
                max_completion_tokens=self.max_tokens if self.max_tokens else sdk.omit,
                stream=True,
                stream_options={"include_usage": True} if self.stream_usage else sdk.omit,
            )
            async with chunks:
                async for chunk in chunks:
                    for delta in reply.add(chunk):
                        yield delta
        except sdk.OpenAIError as exc:
            raise _model_error(exc, self.label) from exc
        yield ModelDone(reply=reply.reply(self.label))

    async def aclose(self) -> None:
        """Close the SDK client's connections (the runtime never needs this)."""
        await self.client.close()


def _client(api_key: str | None, base_url: str | None, max_retries: int | None) -> sdk.AsyncOpenAI:
    retries = sdk.DEFAULT_MAX_RETRIES if max_retries is None else max_retries
    if api_key is None and (base_url or os.environ.get("OPENAI_BASE_URL")):
        # Local servers take any key; the SDK refuses to start without one.
        api_key = os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_KEY
    try:
        return sdk.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=retries)
    except sdk.OpenAIError as exc:
        raise ConfigurationError(f"openai: {exc}") from exc


# -- the transcript, as Chat Completions wants it ---------------------------------


def wire_messages(
    messages: Sequence[Message], system: str | None
) -> list[ChatCompletionMessageParam]:
    """Chat messages for a transcript: the system prompt first, one message per turnkit
    message, tool results as ``tool`` messages (an error result is its ``{"error"}`` JSON)."""
    out: list[ChatCompletionMessageParam] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        if isinstance(message, AssistantMessage):
            calls = [_wire_call(c) for c in message.tool_calls]
            if calls:
                out.append(
                    {"role": "assistant", "content": message.text or None, "tool_calls": calls}
                )
            else:
                out.append({"role": "assistant", "content": message.text})
        elif isinstance(message, ToolMessage):
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.call_id,
                    "content": result_text(message.result),
                }
            )
        else:
            out.append({"role": "user", "content": message.text})
    return out


def _wire_call(call: ToolCall) -> ChatCompletionMessageFunctionToolCallParam:
    # A call whose arguments were unreadable goes back as `{}`: its error result quotes
    # what the model sent, and some servers refuse a request holding invalid JSON.
    arguments = json.dumps(call.input, ensure_ascii=False)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _tool(spec: ToolSpec) -> ChatCompletionFunctionToolParam:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    }


def _response_format(
    output: OutputSpec | None,
) -> completion_create_params.ResponseFormat | sdk.Omit:
    """A JSON-schema response format for ``output``: strict when the schema allows."""
    if output is None:
        return sdk.omit
    strict = strict_schema(output.schema)
    return {
        "type": "json_schema",
        "json_schema": {
            "name": output.name,
            "schema": strict if strict is not None else output.schema,
            "strict": strict is not None,
        },
    }


# -- the reply, assembled from chunks ----------------------------------------------


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    """A reply being assembled from the stream's chunks (first choice only)."""

    text: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    #: The model the server says answered (every chunk names it).
    model: str | None = None

    def add(self, chunk: ChatCompletionChunk) -> list[ModelDelta]:
        shown: list[ModelDelta] = []
        self.model = chunk.model or self.model
        if chunk.usage is not None:  # the last chunk, with no choices
            self.usage = usage_from(chunk.usage)
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            shown += self._delta(choice.delta)
        return shown

    def _delta(self, delta: ChoiceDelta) -> list[ModelDelta]:
        shown: list[ModelDelta] = []
        for name in _REASONING_FIELDS:
            thought = getattr(delta, name, None)
            if isinstance(thought, str) and thought:
                shown.append(ReasoningDelta(text=thought))
        if delta.content:
            self.text.append(delta.content)
            shown.append(TextDelta(text=delta.content))
        if delta.refusal:
            self.refusal.append(delta.refusal)
        for piece in delta.tool_calls or ():
            pending = self.calls.setdefault(piece.index, _PendingCall())
            pending.id = pending.id or (piece.id or "")
            if piece.function is not None:
                pending.name = pending.name or (piece.function.name or "")
                pending.arguments.append(piece.function.arguments or "")
        return shown

    def reply(self, label: str) -> ModelReply:
        """The finished reply; a stream that never said why it stopped was cut off."""
        if self.finish_reason is None:
            raise ModelError(f"{label}: the stream ended without a finish_reason")
        calls = tuple(
            arguments_call(p.id or f"call_{index}", p.name, "".join(p.arguments))
            for index, p in sorted(self.calls.items())
        )
        refused = "".join(self.refusal)
        kind = _STOPS.get(self.finish_reason, "other")
        if refused:
            kind = "refusal"
        elif calls and kind == "end_turn":
            kind = "tool_use"  # some servers say "stop" after asking for tools
        return ModelReply(
            text="".join(self.text) or refused,
            tool_calls=calls,
            stop=StopReason(kind=kind, raw=self.finish_reason),
            usage=self.usage,
            model=self.model,
        )


def usage_from(usage: CompletionUsage) -> Usage:
    """turnkit's ``Usage`` for a completion's: prompt tokens include the cached ones,
    completion tokens the reasoning ones, as turnkit's counts do."""
    prompt, completion = usage.prompt_tokens_details, usage.completion_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_tokens=(prompt.cached_tokens or 0) if prompt else 0,
        cache_write_tokens=(getattr(prompt, "cache_write_tokens", None) or 0) if prompt else 0,
        reasoning_tokens=(completion.reasoning_tokens or 0) if completion else 0,
    )


def _model_error(exc: sdk.OpenAIError, label: str) -> ModelError:
    """The ``ModelError`` for an SDK error: a ``ContextWindowError`` when the request
    was too long for the model."""
    text = describe_error(exc, label)
    if isinstance(exc, sdk.APIStatusError):
        code = exc.code if isinstance(exc.code, str) else None
        if too_long(exc.status_code, code, _message(exc.body) or exc.message):
            return ContextWindowError(text)
        if exc.status_code in OVERLOADED:
            return ModelOverloadedError(text, retry_after=retry_after(exc.response.headers))
    return ModelError(text)


def describe_error(exc: sdk.OpenAIError, label: str) -> str:
    """One line naming the HTTP status and the server's own message."""
    if isinstance(exc, sdk.APIStatusError):
        said = _message(exc.body) or exc.message
        code = f" {exc.code}" if exc.code else ""
        return f"{label}: HTTP {exc.status_code}{code}: {said}"
    if isinstance(exc, sdk.APITimeoutError):
        return f"{label}: the request timed out"
    if isinstance(exc, sdk.APIConnectionError):
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return f"{label}: could not connect: {exc.message}{cause}"
    if isinstance(exc, sdk.APIError):
        return f"{label}: the stream reported an error: {exc.message}"
    return f"{label}: {type(exc).__name__}: {exc}"


def _message(body: object) -> str | None:
    said = body.get("message") if isinstance(body, dict) else None
    return said if isinstance(said, str) and said else None
