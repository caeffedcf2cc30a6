"""Budgets on every store: usage is counted in the commit of each model step, a turn
over its session's or tenant's budget parks before the next model call (or fails),
with nothing of that call done, and an operator's answer lets it go on or ends it."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import turnkit
from turnkit import Budget, Limit, Price, Spend, ToolMessage, Usage, tool
from turnkit.server._metrics import metrics_for
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

#: Every model call reports these tokens: 100 a call.
USED = Usage(input_tokens=60, output_tokens=40)


class Counted:
    """An agent whose turn calls ``step`` five times, then answers; it counts the
    model's calls and the tool's runs."""

    def __init__(self) -> None:
        self.model_calls = 0
        self.tool_runs = 0

    def agent(self) -> turnkit.Agent:
        @tool
        def step() -> str:
            """One step of the work."""
            self.tool_runs += 1
            return f"step {self.tool_runs}"

        def reply(messages: list[turnkit.Message]) -> ScriptedReply:
            self.model_calls += 1
            done = sum(isinstance(m, ToolMessage) for m in messages)
            if done < 5:
                return ScriptedReply(tool_calls=[tool_call("step", {})], usage=USED)
            return ScriptedReply(text="all done", usage=USED)

        model = ScriptedModel(respond=reply, record_calls=False)
        model.model = "small-model"  # type: ignore[attr-defined]  # the name prices use
        return turnkit.Agent(name="b", model=model, tools=[step])


async def _spend(store: Any, session: str, tenant: str) -> tuple[Spend, Spend]:
    return await store.session(session).spend(tenant)  # type: ignore[no-any-return]


async def test_a_budget_reached_mid_turn_parks_before_the_next_model_call(
    make_store: Any,
) -> None:
    counted = Counted()
    prices = {"small-model": Price(input_per_million=1.0, output_per_million=2.0)}
    budget = Budget(per_session=Limit(tokens=250), prices=prices)
    store = make_store()
    async with turnkit.Runtime(counted.agent(), store=store, budget=budget) as rt:
        s = rt.session("b", "s1")
        tid = await s.submit("go", tenant="acme")
        parked = await s.result(tid)
        # 100 tokens a call: after 3 calls (300 >= 250) the 4th is not made.
        assert parked.status == "suspended" and parked.request is not None
        assert parked.request.id.startswith("budget_exceeded:")
        assert "the session's budget is spent (300 tokens used of 250)" in parked.request.prompt
        assert (counted.model_calls, counted.tool_runs) == (3, 3)
        # Nothing half-done: the transcript ends with the third tool's whole result.
        messages = (await store.session("s1").load()).messages
        assert isinstance(messages[-1], ToolMessage) and messages[-1].result == "step 3"
        session, tenant = await _spend(store, "s1", "acme")
        cost = 3 * (60 * 1.0 + 40 * 2.0) / 1_000_000
        assert session == Spend(180, 120, pytest.approx(cost), 3)  # type: ignore[arg-type]
        assert tenant == session
        # The operator lets it go on: the rest of the turn runs past the budget.
        await s.resume(tid, parked.request.id, "continue")
        done = await s.result(tid)
        assert done.status == "completed" and done.text == "all done"
        assert (counted.model_calls, counted.tool_runs) == (6, 5)
        session, _ = await _spend(store, "s1", "acme")
        assert (session.tokens, session.calls) == (600, 6)
        # The next turn of the session is over budget from its first step: ended.
        again = await s.submit("more", tenant="acme")
        over = await s.result(again)
        assert over.status == "suspended" and over.request is not None
        assert counted.model_calls == 6
        await s.resume(again, over.request.id, "end")
        ended = await s.result(again)
        assert ended.status == "failed" and "an operator ended the turn" in (ended.error or "")
        assert counted.model_calls == 6
        by_tenant = await store.usage_by_tenant()
        assert by_tenant["acme"].tokens == 600 and by_tenant["acme"].calls == 6
        # Exported as metrics, read back with prometheus_client's own parser.
        text = (await metrics_for(rt).scrape()).decode()
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        acme = (("tenant", "acme"),)
        assert samples[("turnkit_tenant_model_calls", acme)] == 6
        assert samples[("turnkit_tenant_tokens", (("direction", "input"), *acme))] == 360
        assert samples[("turnkit_tenant_tokens", (("direction", "output"), *acme))] == 240
        assert samples[("turnkit_tenant_cost", acme)] == pytest.approx(2 * cost)


async def test_a_tenant_budget_holds_across_its_sessions_and_can_fail_at_once(
    make_store: Any,
) -> None:
    counted = Counted()
    budget = Budget(
        per_tenant=Limit(tokens=10_000),
        tenants={"small": Limit(tokens=450)},
        on_exceeded="fail",
    )
    store = make_store()
    async with turnkit.Runtime(counted.agent(), store=store, budget=budget) as rt:
        first = rt.session("b", "one")
        done = await first.result(await first.submit("go", tenant="small"))
        assert done.status == "failed" and "tenant 'small'" in (done.error or "")
        assert "500 tokens used of 450" in (done.error or "")
        assert counted.model_calls == 5
        # Another session of the same tenant: over before its first call.
        second = rt.session("b", "two")
        failed = await second.result(await second.submit("go", tenant="small"))
        assert failed.status == "failed" and counted.model_calls == 5
        # Another tenant is not held back by it.
        other = rt.session("b", "three")
        fine = await other.result(await other.submit("go", tenant="big"))
        assert fine.status == "completed" and counted.model_calls == 11
        _, small = await _spend(store, "one", "small")
        _, big = await _spend(store, "three", "big")
        assert (small.tokens, big.tokens) == (500, 600)


def test_a_budget_refuses_bad_limits() -> None:
    with pytest.raises(turnkit.ConfigurationError, match=r"Limit\.tokens"):
        Limit(tokens=-1)
    with pytest.raises(turnkit.ConfigurationError, match="on_exceeded"):
        Budget(on_exceeded="wait")  # type: ignore[arg-type]
    with pytest.raises(turnkit.ConfigurationError, match=r"Budget\.prices"):
        Budget(prices={"m": 3})  # type: ignore[dict-item]
