"""Model adapters for real providers, each behind its own extra, ``from_env``, and
the scripted model the demo and ``turnkit.testing`` play back.

``anthropic()`` needs ``turnkit[anthropic]`` and ``openai()`` needs ``turnkit[openai]``;
each imports its SDK only when called, so ``import turnkit.models`` works with neither
installed, and a missing SDK is an ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._demo import demo_model
from ._env import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL, configured, from_env
from ._scripted import ScriptedCall, ScriptedModel, ScriptedReply, tool_call

if TYPE_CHECKING:
    import anthropic as anthropic_sdk
    import openai as openai_sdk

    from ._anthropic import AnthropicModel
    from ._openai import OpenAIModel


def anthropic(
    model: str,
    *,
    thinking: bool | int = False,
    max_tokens: int = 8192,
    max_retries: int | None = None,
    client: anthropic_sdk.AsyncAnthropic | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    cache: bool = True,
) -> AnthropicModel:
    """Claude through the Messages API.

    ``thinking=True`` turns on adaptive thinking, an ``int`` a manual thinking budget;
    thinking blocks are kept on the transcript, so tool-use turns work with it on.
    ``max_retries`` bounds the SDK's own retries of overloads, rate limits and 5xx
    (default: the SDK's). Without ``client``, one is made from ``api_key`` and
    ``base_url`` (default: the SDK reads ``ANTHROPIC_API_KEY``). ``cache`` marks the
    system prompt and the conversation so far for Anthropic's prompt cache; the hits
    show in each reply's ``usage``.
    """
    from ._anthropic import AnthropicModel

    return AnthropicModel(
        model,
        thinking=thinking,
        max_tokens=max_tokens,
        max_retries=max_retries,
        client=client,
        api_key=api_key,
        base_url=base_url,
        cache=cache,
    )


def openai(
    model: str,
    *,
    base_url: str | None = None,
    max_tokens: int | None = None,
    max_retries: int | None = None,
    client: openai_sdk.AsyncOpenAI | None = None,
    api_key: str | None = None,
    structured_output: bool = True,
    stream_usage: bool = True,
) -> OpenAIModel:
    """OpenAI, or any OpenAI-compatible server at ``base_url``, through Chat Completions.

    With a ``base_url`` and no key anywhere, a placeholder key is sent (local servers
    take any). ``max_tokens`` is sent as ``max_completion_tokens`` when given;
    ``max_retries`` bounds the SDK's own retries (default: the SDK's). A typed answer
    is asked for with a JSON-schema ``response_format``; ``structured_output=False``
    offers it as a tool instead, for a server that has no such response format.
    ``stream_usage`` asks the server to end the stream with the token usage
    (``stream_options``); turn it off for a server that refuses the option.
    """
    from ._openai import OpenAIModel

    return OpenAIModel(
        model,
        base_url=base_url,
        max_tokens=max_tokens,
        max_retries=max_retries,
        client=client,
        api_key=api_key,
        structured_output=structured_output,
        stream_usage=stream_usage,
    )


__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "DEFAULT_OPENAI_MODEL",
    "ScriptedCall",
    "ScriptedModel",
    "ScriptedReply",
    "anthropic",
    "configured",
    "demo_model",
    "from_env",
    "openai",
    "tool_call",
]
