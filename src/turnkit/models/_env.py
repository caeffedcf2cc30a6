"""Choosing a model from the environment, for the CLI and for apps that want its rule.

``TURNKIT_MODEL`` names ``provider:model`` (or a bare model name); without it a key
decides: ``ANTHROPIC_API_KEY`` picks Anthropic, ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``
picks OpenAI. With nothing set, the offline demo model, and a notice saying so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from .._errors import ConfigurationError
from .._seams.model import Model
from ._demo import demo_model

log = logging.getLogger("turnkit.models")

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-6"
DEFAULT_OPENAI_MODEL = "gpt-5.4-mini"
DEMO_NOTICE = (
    "no model configured (TURNKIT_MODEL, ANTHROPIC_API_KEY, OPENAI_API_KEY and "
    "OPENAI_BASE_URL are unset); using the offline demo model"
)

Provider = Literal["anthropic", "openai", "demo"]
_PROVIDERS: tuple[Provider, ...] = ("anthropic", "openai", "demo")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What the environment asks for, before any SDK is imported."""

    provider: Provider
    model: str
    because: str
    #: Whether the provider was guessed from a bare model name (no ``provider:``).
    guessed: bool = False

    @property
    def label(self) -> str:
        return (
            "the offline demo model" if self.provider == "demo" else f"{self.provider}:{self.model}"
        )


def choose(env: Mapping[str, str]) -> Choice | None:
    """The model ``env`` names, or ``None`` when it names none (a pure function)."""
    named = env.get("TURNKIT_MODEL", "").strip()
    if named:
        return _named(named)
    if env.get("ANTHROPIC_API_KEY"):
        return Choice(
            provider="anthropic", model=DEFAULT_ANTHROPIC_MODEL, because="ANTHROPIC_API_KEY"
        )
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        if env.get(variable):
            return Choice(provider="openai", model=DEFAULT_OPENAI_MODEL, because=variable)
    return None


def _named(named: str) -> Choice:
    prefix, colon, rest = named.partition(":")
    because = f"TURNKIT_MODEL={named}"
    for provider in _PROVIDERS:
        if prefix.strip().lower() == provider:
            if provider != "demo" and not (colon and rest.strip()):
                raise ConfigurationError(f"{because}: name the model after '{provider}:'")
            return Choice(provider=provider, model=rest.strip(), because=because)
    # A bare name, which may hold a colon itself (Ollama's "llama3.2:3b").
    provider = "anthropic" if named.lower().startswith("claude") else "openai"
    return Choice(provider=provider, model=named, because=because, guessed=True)


def build(choice: Choice, env: Mapping[str, str]) -> Model:
    """The adapter ``choice`` names; a missing SDK is a ``ConfigurationError`` that says
    which extra to install."""
    try:
        if choice.provider == "anthropic":
            from ._anthropic import AnthropicModel

            return AnthropicModel(
                choice.model,
                api_key=env.get("ANTHROPIC_API_KEY") or None,
                base_url=env.get("ANTHROPIC_BASE_URL") or None,
            )
        if choice.provider == "openai":
            from ._openai import OpenAIModel

            return OpenAIModel(
                choice.model,
                api_key=env.get("OPENAI_API_KEY") or None,
                base_url=env.get("OPENAI_BASE_URL") or None,
            )
    except ImportError as exc:
        raise ConfigurationError(f"{choice.because} selects {choice.provider}, but {exc}") from exc
    except ConfigurationError as exc:  # the SDK refused to start (a missing key, say)
        read = (
            f" (read as {choice.label}: a name without 'anthropic:' or 'openai:' is "
            "Anthropic's if it starts with 'claude', else OpenAI's)"
            if choice.guessed
            else ""
        )
        raise ConfigurationError(f"{choice.because}{read}: {exc}") from exc
    return demo_model()


def configured(env: Mapping[str, str] | None = None) -> tuple[Model, Choice] | None:
    """The model the environment configures and why, or ``None`` if it configures none."""
    env = os.environ if env is None else env
    choice = choose(env)
    return None if choice is None else (build(choice, env), choice)


def from_env(
    env: Mapping[str, str] | None = None, *, demo: Callable[[], Model] | None = None
) -> Model:
    """The model the environment names (``os.environ`` unless ``env`` is given).

    With nothing set it logs a notice and returns ``demo()``, by default the offline
    demo model, so an app runs before anyone has a key.
    """
    found = configured(env)
    if found is not None:
        return found[0]
    log.warning(DEMO_NOTICE)
    return (demo or demo_model)()
