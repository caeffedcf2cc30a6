"""``turnkit.models.from_env``, the CLI's use of it, and the adapters' lazy SDK imports."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import anthropic_wire, openai_wire
from fakes.server import FakeProvider
from suite_paths import ROOT

import turnkit
import turnkit.models
import turnkit.testing
from turnkit import UserMessage
from turnkit.models import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL, from_env
from turnkit.models._env import Choice, choose, configured
from turnkit.stores import MemoryStore

MODEL_VARIABLES = (
    "TURNKIT_MODEL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
)


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any model settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if k not in MODEL_VARIABLES}
    return {**env, "PYTHONUNBUFFERED": "1", **settings}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"ANTHROPIC_API_KEY": "k"}, ("anthropic", DEFAULT_ANTHROPIC_MODEL)),
        ({"OPENAI_API_KEY": "k"}, ("openai", DEFAULT_OPENAI_MODEL)),
        ({"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}, ("openai", DEFAULT_OPENAI_MODEL)),
        ({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}, ("anthropic", DEFAULT_ANTHROPIC_MODEL)),
        ({"TURNKIT_MODEL": "anthropic:claude-opus-4-8"}, ("anthropic", "claude-opus-4-8")),
        ({"TURNKIT_MODEL": "openai:llama3.2:3b"}, ("openai", "llama3.2:3b")),
        ({"TURNKIT_MODEL": "llama3.2:3b"}, ("openai", "llama3.2:3b")),
        ({"TURNKIT_MODEL": "claude-haiku-4-5"}, ("anthropic", "claude-haiku-4-5")),
        ({"TURNKIT_MODEL": "demo", "OPENAI_API_KEY": "k"}, ("demo", "")),
    ],
)
def test_the_environment_names_a_model(
    env: dict[str, str], expected: tuple[str, str] | None
) -> None:
    choice = choose(env)
    assert ((choice.provider, choice.model) if choice else None) == expected


def test_a_provider_without_a_model_name_is_a_configuration_error() -> None:
    with pytest.raises(turnkit.ConfigurationError, match="name the model after 'openai:'"):
        choose({"TURNKIT_MODEL": "openai:"})


async def test_with_nothing_set_it_is_the_offline_demo_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="turnkit.models"):
        model = from_env({})
    assert "using the offline demo model" in caplog.text
    agent = turnkit.Agent(name="demo", model=model)
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        answer = await runtime.session("demo", "s1").turn("hello")
    assert answer.startswith("(offline demo model) You said: hello")


def test_an_app_may_bring_its_own_demo() -> None:
    own = turnkit.testing.ScriptedModel(["offline"])
    assert from_env({}, demo=lambda: own) is own


async def test_an_anthropic_key_gives_the_anthropic_adapter() -> None:
    with FakeProvider(anthropic_wire.message(anthropic_wire.text("hi"))) as server:
        model = from_env({"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": server.url})
        done = [
            d async for d in model.stream([UserMessage(text="x", turn_id="t")], [], system=None)
        ]
    assert done[-1].type == "done" and done[-1].reply.text == "hi"
    assert server.requests[0].body["model"] == DEFAULT_ANTHROPIC_MODEL


def test_a_missing_sdk_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # what an absent package looks like
    monkeypatch.delitem(sys.modules, "turnkit.models._anthropic", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'turnkit\[anthropic\]'"):
        turnkit.models.anthropic("claude-test")
    with pytest.raises(turnkit.ConfigurationError, match=r"selects anthropic, but .*turnkit\["):
        from_env({"ANTHROPIC_API_KEY": "k"})


def test_importing_turnkit_imports_no_sdk() -> None:
    code = (
        "import sys, turnkit, turnkit.models, turnkit.cli;"
        "print(sorted({'anthropic', 'openai'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_cli_runs_the_example_on_the_environments_model(tmp_path: Path) -> None:
    calls = [
        openai_wire.Call("call_1", "create_order", '{"item": "blue widgets", "quantity": 2}'),
        openai_wire.Call("call_2", "lookup_order", '{"order_id": 1}'),
    ]
    with FakeProvider(
        openai_wire.completion("Ordering.", calls=calls[:1], finish="tool_calls"),
        openai_wire.completion(calls=calls[1:], finish="tool_calls"),
        openai_wire.completion("Order #1 ", "is packed."),
    ) as server:
        env = clean_env(TURNKIT_MODEL="openai:gpt-test", OPENAI_BASE_URL=server.url + "/v1")
        done = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", "run", str(ROOT / "examples" / "ops"), "order"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "turnkit: using openai:gpt-test (TURNKIT_MODEL=openai:gpt-test)" in done.stderr
    assert "→ create_order" in done.stdout and "→ lookup_order" in done.stdout
    assert "Order #1 is packed." in done.stdout
    first = server.requests[0].body
    assert [t["function"]["name"] for t in first["tools"]] == [
        "create_order",
        "lookup_order",
        "refund_order",
    ]
    assert first["messages"][-1] == {"role": "user", "content": "order"}


def test_the_cli_stays_offline_with_nothing_set(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", str(ROOT / "examples" / "ops"), "order 1 pen"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no model configured; using the offline demo model" in done.stderr
    assert "Done: order #1 (1 x pen) is packed." in done.stdout


def test_a_folder_without_a_demo_gets_the_generic_one(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "instructions.md").write_text("Be brief.\n")  # no agent.py: no demo_model()
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", str(folder), "hello"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "(offline demo model) You said: hello" in done.stdout


def test_choice_labels() -> None:
    assert Choice(provider="openai", model="m", because="x").label == "openai:m"
    assert Choice(provider="demo", model="", because="x").label == "the offline demo model"


def test_the_public_names_are_sorted_and_present() -> None:
    names = turnkit.models.__all__
    assert list(names) == sorted(names)
    assert all(hasattr(turnkit.models, name) for name in names)


def test_a_bare_model_name_says_how_it_was_read_when_its_sdk_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 37 item 8: ``TURNKIT_MODEL=bogus`` said only "openai: Missing
    credentials…", not that "bogus" was read as ``openai:bogus``."""
    for variable in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)  # the SDK reads these itself
    with pytest.raises(turnkit.ConfigurationError) as caught:
        configured({"TURNKIT_MODEL": "bogus"})
    message = str(caught.value)
    assert message.startswith("TURNKIT_MODEL=bogus (read as openai:bogus")
    assert "api_key" in message or "OPENAI_API_KEY" in message  # the SDK's own words
    with pytest.raises(turnkit.ConfigurationError) as named:
        configured({"TURNKIT_MODEL": "openai:gpt-x"})
    assert str(named.value).startswith("TURNKIT_MODEL=openai:gpt-x: openai: ")
