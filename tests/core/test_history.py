"""History policies: what each model step is sent, decided durably.

Long scripted sessions under each built-in policy, the pure window logic on its own,
a SIGKILL in the middle of a summary step (the official Anthropic SDK against the
local fake server, whose recorded request bodies must match a run that never
crashed, byte for byte), context-window failures that name their remedy, and the
seam for a policy of one's own.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import anthropic_wire as aw
from fakes import openai_wire as ow
from fakes.server import Canned, FakeProvider
from suite_paths import TESTS

import turnkit
from turnkit import (
    AssistantMessage,
    HistoryView,
    HistoryWindow,
    LastTurns,
    Message,
    SummarizeOlder,
    TokenBudget,
    ToolMessage,
    TriggerMessage,
    Usage,
    UserMessage,
)
from turnkit.cli._progress import Progress
from turnkit.cli._render import render_session
from turnkit.cli._show import read_session
from turnkit.models import anthropic, openai
from turnkit.stores import MemoryStore, SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

SUMMARY_MARK = "Summary so far"


@turnkit.tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key} " + "v" * 60


def is_summary_call(messages: Sequence[Message]) -> bool:
    return len(messages) == 1 and messages[0].text.startswith(SUMMARY_MARK)


def chatty(messages: Sequence[Message]) -> ScriptedReply:
    """Answers every turn; every third turn looks something up first. Summary calls
    get a summary naming how much they read."""
    if is_summary_call(messages):
        return ScriptedReply(text=f"summary of {len(messages[0].text)} chars")
    last = messages[-1]
    if isinstance(last, UserMessage) and last.text.endswith("lookup"):
        return ScriptedReply(tool_calls=[tool_call("lookup", {"key": last.text[:12]})])
    said = last.name if isinstance(last, ToolMessage) else last.text[:40]
    return ScriptedReply(text="noted: " + said + " " + "w" * 80)


def check_request(messages: Sequence[Message]) -> None:
    """What every request must be: opened by a turn's opening, no call without its
    result and no result without its call."""
    if is_summary_call(messages):
        return
    assert isinstance(messages[0], UserMessage | TriggerMessage)
    asked = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
    answered = {m.call_id for m in messages if isinstance(m, ToolMessage)}
    assert answered <= asked
    pending = asked - answered  # only the last step's calls, never sent back unanswered
    assert not pending


@pytest.mark.parametrize(
    ("policy", "most_messages"),
    [
        (LastTurns(4), 4 * 4),
        (TokenBudget(400), 40),
        (SummarizeOlder(max_tokens=400), 40),
    ],
    ids=["last-turns", "token-budget", "summarize"],
)
async def test_a_500_turn_session_stays_in_a_small_window(
    policy: turnkit.HistoryPolicy, most_messages: int
) -> None:
    model = ScriptedModel(respond=chatty)
    agent = turnkit.Agent(
        name="chatty", model=model, instructions="Be brief.", tools=[lookup], history=policy
    )
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        session = runtime.session("chatty", "s1")
        for n in range(500):
            text = f"turn {n} " + "t" * 60 + (" lookup" if n % 3 == 0 else "")
            result = await session.result(session.start(text))
            assert result.status == "completed", result.error
        transcript = await session.messages()
    assert sum(isinstance(m, UserMessage) for m in transcript) == 500  # all of it is kept
    main_calls = [c for c in model.calls if not is_summary_call(c.messages)]
    for call in main_calls:
        check_request(call.messages)
    assert max(len(c.messages) for c in main_calls) <= most_messages
    summaries = [c for c in model.calls if is_summary_call(c.messages)]
    if isinstance(policy, SummarizeOlder):
        assert len(summaries) >= 20  # folded in now and then, not on every step
        assert main_calls[-1].system is not None and "summary of" in main_calls[-1].system
    else:
        assert summaries == []


def transcript(*turns: tuple[str, int]) -> list[Message]:
    """Turns of ``(text, tool calls)``: each opens, calls its tools, answers."""
    out: list[Message] = []
    for n, (text, calls) in enumerate(turns):
        tid = f"t{n}"
        out.append(UserMessage(text=text, turn_id=tid))
        if calls:
            asked = tuple(
                turnkit.ToolCall(id=f"c{n}{k}", name="lookup", input={}) for k in range(calls)
            )
            out.append(AssistantMessage(text="", turn_id=tid, tool_calls=asked))
            out += [
                ToolMessage(call_id=c.id, name="lookup", result="x" * 40, turn_id=tid)
                for c in asked
            ]
        out.append(AssistantMessage(text="done " + text, turn_id=tid))
    return out


def view(messages: list[Message], previous: int = 0) -> HistoryView:
    turn_start = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    return HistoryView(
        messages,
        turn_start=turn_start,
        previous=HistoryWindow(start=previous),
        summary=None,
        sizes={},
    )


def test_windows_start_where_turns_open() -> None:
    messages = transcript(("a" * 100, 2), ("b" * 100, 0), ("c" * 100, 3), ("d", 0))
    openings = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    assert openings == [0, 5, 7, 13]
    assert LastTurns(1).window(view(messages)) == HistoryWindow(start=13)
    assert LastTurns(3).window(view(messages)) == HistoryWindow(start=5)
    assert LastTurns(9).window(view(messages)) == HistoryWindow(start=0)
    # Within budget: the previous start stays (a stable prefix); over it: trimmed.
    everything = view(messages).tokens(0)
    assert TokenBudget(everything).window(view(messages, 5)) == HistoryWindow(start=5)
    trimmed = TokenBudget(everything - 1, trim_to=view(messages).tokens(7)).window(view(messages))
    assert trimmed == HistoryWindow(start=7)
    # Even a budget too small for the running turn keeps that turn whole.
    assert TokenBudget(1).window(view(messages)) == HistoryWindow(start=13)
    assert SummarizeOlder(max_tokens=1).window(view(messages)) == HistoryWindow(
        start=13, summarize=True
    )
    with pytest.raises(turnkit.ConfigurationError, match="turns must be a positive int"):
        LastTurns(0)


class RunningTurnOnly:
    """A policy of one's own: only the running turn."""

    def window(self, view: HistoryView) -> HistoryWindow:
        return HistoryWindow(start=view.turn_start)


class MidTurn:
    def window(self, view: HistoryView) -> HistoryWindow:
        return HistoryWindow(start=view.turn_start + 1)


async def test_a_policy_of_ones_own_and_one_that_cuts_a_turn() -> None:
    model = ScriptedModel(respond=chatty)
    agent = turnkit.Agent(name="own", model=model, tools=[lookup], history=RunningTurnOnly())
    async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
        session = runtime.session("own", "s1")
        for text in ("one", "two lookup", "three"):
            assert (await session.result(session.start(text))).status == "completed"
    assert [len(c.messages) for c in model.calls] == [1, 1, 3, 1]
    bad = turnkit.Agent(name="bad", model=ScriptedModel(respond=chatty), history=MidTurn())
    async with turnkit.Runtime([bad], store=MemoryStore()) as runtime:
        session = runtime.session("bad", "s1")
        result = await session.result(session.start("hi"))
    assert result.status == "failed"
    assert "chose start 1, which is not where a turn opens" in (result.error or "")
    with pytest.raises(turnkit.ConfigurationError, match="history must be a history policy"):
        turnkit.Agent(name="x", model=model, history=4)  # type: ignore[arg-type]


# -- a SIGKILL in the middle of a summary step ------------------------------------------


def served_tokens(body: dict[str, Any]) -> aw.Tokens:
    """The usage the fake reports for a request: fixed by the request, so a replay
    gets the same figures."""
    return aw.Tokens(input=len(json.dumps(body)) // 10, output=7, cache_read=3)


def keeper(body: dict[str, Any]) -> Canned:
    """The fake Claude: a summary call gets a summary of the newest note it read, any
    other call a reply to the last note; both fixed by the request."""
    system = body.get("system")
    system_text = system if isinstance(system, str) else system[0]["text"]
    last = body["messages"][-1]["content"][-1]["text"]
    if system_text.startswith("You maintain the running summary"):
        notes = [line for line in last.splitlines() if line.startswith("User: Note")]
        answer = "Summary: " + "; ".join(n[6:20] for n in notes)
    else:
        answer = "Got it: " + last[:30]
    return aw.message(aw.text(answer), tokens=served_tokens(body))


def run_child(db: Path, url: str, turns: int, crash: tuple[int, str] | None = None) -> str:
    extra = [str(crash[0]), crash[1]] if crash else []
    child = subprocess.run(
        [sys.executable, "-m", "fakes.history_child", str(db), url, str(turns), *extra],
        cwd=TESTS,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if crash:
        assert child.returncode == -9, child.stderr
        return ""
    assert child.returncode == 0, child.stderr
    return child.stdout


def summary_requests(server: FakeProvider) -> list[int]:
    def system_text(body: dict[str, Any]) -> str:
        system = body["system"]
        return system if isinstance(system, str) else system[0]["text"]

    return [
        i
        for i, r in enumerate(server.requests)
        if system_text(r.body).startswith("You maintain the running summary")
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[bytes], int, str]]:
    """The run that never crashed: its request bodies, where the first summary call
    was, and the session usage it read back."""
    with FakeProvider(respond=keeper) as server:
        usage = run_child(tmp_path_factory.mktemp("ref") / "h.db", server.url, 6)
        first_summary = summary_requests(server)[0]
        served = [served_tokens(r.body) for r in server.requests]
        yield [r.raw for r in server.requests], first_summary, usage
    # Usage sums match the figures the server sent, summary calls included.
    total = Usage()
    for t in served:
        total = total + Usage(
            input_tokens=t.input + t.cache_read,
            output_tokens=t.output,
            cache_read_tokens=t.cache_read,
        )
    assert json.loads(usage) == total.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_sigkill_in_a_summary_step_replays_to_the_same_requests(
    reference: tuple[list[bytes], int, str], tmp_path: Path, when: str
) -> None:
    bodies, first_summary, usage = reference
    assert first_summary >= 2  # some turns ran before the window had to shrink
    # Every request before it was a turn's model step: an opening and a model step
    # commit each, then the summary step's commit.
    commit = 2 * first_summary + 2
    db = tmp_path / "h.db"
    with FakeProvider(respond=keeper) as server:
        run_child(db, server.url, 6, crash=(commit, when))
        crashed = [r.raw for r in server.requests]
        assert len(crashed) == first_summary + 1  # the summary call was made, then the kill
        assert run_child(db, server.url, 6) == usage  # the same usage, read from the store
        replayed = [r.raw for r in server.requests][len(crashed) :]
    if when == "before":  # not stored: asked again, with the very same body
        assert crashed + replayed == bodies[: first_summary + 1] + bodies[first_summary:]
    else:  # stored: reused, never asked again
        assert crashed + replayed == bodies


# -- the context window exceeded ---------------------------------------------------------


async def test_a_context_window_failure_names_the_remedy_and_a_policy_cures_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.db"
    too_long = aw.error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000")
    with FakeProvider(
        aw.message(aw.text("first")), aw.message(aw.text("second")), too_long
    ) as server:
        plain = turnkit.Agent(
            name="w", model=anthropic("claude-test", api_key="k", base_url=server.url)
        )
        async with turnkit.Runtime([plain], store=SqliteStore(db)) as runtime:
            session = runtime.session("w", "s1")
            for text in ("one", "two"):
                await session.result(session.start(text))
            failed = await session.result(session.start("three", turn_id="t3"))
        assert failed.status == "failed" and failed.error is not None
        assert "exceeded the model's context window" in failed.error
        assert "prompt is too long" in failed.error
        assert "Agent(history=turnkit.LastTurns(20))" in failed.error
        # With a policy set, the failed turn redelivered sends only itself, and works.
        server.add(aw.message(aw.text("third")))
        model = anthropic("claude-test", api_key="k", base_url=server.url)
        kept = turnkit.Agent(name="w", model=model, history=LastTurns(1))
        async with turnkit.Runtime([kept], store=SqliteStore(db)) as runtime:
            session = runtime.session("w", "s1")
            done = await session.result(session.start("three", turn_id="t3"))
            assert done.status == "completed" and done.text == "third"
            assert len(await session.messages()) == 6  # the store keeps everything
        last = server.requests[-1].body["messages"]
        assert [m["content"][0]["text"] for m in last] == ["three"]


async def test_openai_context_length_exceeded_and_an_empty_context_window_stop(
    tmp_path: Path,
) -> None:
    with FakeProvider(
        ow.error(
            400,
            "This model's maximum context length is 8192 tokens",
            code="context_length_exceeded",
        ),
        aw.message(stop_reason="model_context_window_exceeded"),
    ) as server:
        gpt = openai("gpt-test", api_key="k", base_url=server.url + "/v1")
        claude = anthropic("claude-test", api_key="k", base_url=server.url)
        for name, model in (("gpt", gpt), ("claude", claude)):
            agent = turnkit.Agent(name=name, model=model)
            async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
                session = runtime.session(name, "s1")
                result = await session.result(session.start("hi"))
            assert result.status == "failed" and result.error is not None
            assert "exceeded the model's context window" in result.error, result.error
            assert "history policy" in result.error


async def test_thinking_blocks_travel_with_their_tool_loop_under_a_small_window(
    tmp_path: Path,
) -> None:
    thinking = aw.Thinking(("Let me look.",), signature="sig-1")
    with FakeProvider(
        aw.message(aw.text("hello")),
        aw.message(thinking, aw.ToolUse("toolu_1", "lookup", {"key": "k"}), stop_reason="tool_use"),
        aw.message(aw.text("found it")),
    ) as server:
        model = anthropic("claude-test", thinking=True, api_key="k", base_url=server.url)
        agent = turnkit.Agent(name="t", model=model, tools=[lookup], history=LastTurns(1))
        async with turnkit.Runtime([agent], store=MemoryStore()) as runtime:
            session = runtime.session("t", "s1")
            await session.result(session.start("hi"))
            done = await session.result(session.start("look it up"))
        assert done.text == "found it"
        sent = server.requests[-1].body["messages"]
    # The window is the running turn, whole: its thinking, the call and its result.
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["content"][0]["text"] == "look it up"
    assert [b["type"] for b in sent[1]["content"]] == ["thinking", "tool_use"]
    assert sent[1]["content"][0]["signature"] == "sig-1"
    assert sent[2]["content"][0]["type"] == "tool_result"


async def test_summaries_show_in_usage_and_in_turnkit_show() -> None:
    def answer(messages: Sequence[Message]) -> ScriptedReply:
        reply = chatty(messages)
        return ScriptedReply(
            text=reply.text,
            tool_calls=reply.tool_calls,
            usage=Usage(input_tokens=100 if is_summary_call(messages) else 10, output_tokens=1),
        )

    store = MemoryStore()
    model = ScriptedModel(respond=answer)
    agent = turnkit.Agent(name="s", model=model, history=SummarizeOlder(max_tokens=60))
    async with turnkit.Runtime([agent], store=store) as runtime:
        session = runtime.session("s", "s1")
        results = [await session.result(session.start(f"note {n} " + "n" * 80)) for n in range(4)]
        total = await session.usage()
    summaries = sum(is_summary_call(c.messages) for c in model.calls)
    assert summaries >= 1
    assert sum((r.usage for r in results), Usage()) == total
    assert total.input_tokens == 100 * summaries + 10 * 4
    view = await read_session(store, "s1", Progress(io.StringIO()), where="memory")
    text = render_session(view, store="memory", store_flag="")
    assert "sent messages [0:]" in text and ", after summary history:" in text
    assert "summary of messages [:" in text and "[100 in, 1 out]" in text


async def test_a_new_runtime_starts_from_the_stored_window_and_summary(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    policy = SummarizeOlder(max_tokens=150, keep_tokens=60)
    first = ScriptedModel(respond=chatty)
    agent = turnkit.Agent(name="s", model=first, history=policy)
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session("s", "s1")
        for n in range(7):
            await session.result(session.start(f"note {n} " + "n" * 60))
    last = first.calls[-1]
    assert last.system is not None and "summary of" in last.system
    # A new runtime (as another process would) finds the window and summary in the
    # store: the next turn's request starts where the last one did, under the same
    # summary, and no summary is made again while the window fits.
    second = ScriptedModel(respond=chatty)
    agent = turnkit.Agent(name="s", model=second, history=policy)
    async with turnkit.Runtime([agent], store=SqliteStore(db)) as runtime:
        session = runtime.session("s", "s1")
        await session.result(session.start("short"))
    (call,) = second.calls
    assert call.system == last.system
    assert call.messages[: len(last.messages)] == last.messages
