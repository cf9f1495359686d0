"""Cost accounting per turn and per tree, and the ``max_cost_usd`` ward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cantrip
from cantrip._outcome import result_dict
from cantrip.cli._loom import main as loom_main
from cantrip.cli._main import main as cli_main
from cantrip.llm._cost import response_cost
from gates import call_agent, done, echo

# $1 per million prompt tokens, $2 per million completion tokens
PRICES = cantrip.Pricing(1.0, 2.0)


def echo_call(text: str = "x", prompt: int = 1000, completion: int = 0) -> dict[str, Any]:
    return {
        "tool_calls": [{"gate": "echo", "args": {"text": text}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def finish(answer: str = "ok", prompt: int = 1000, completion: int = 0) -> dict[str, Any]:
    return {
        "tool_calls": [{"gate": "done", "args": {"answer": answer}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def spell(
    script: list[dict[str, Any]],
    *wards: cantrip.Ward,
    pricing: cantrip.Pricing | None = PRICES,
    loom: cantrip.Loom | None = None,
) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script, pricing=pricing),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(10), *wards]),
        loom=cantrip.Loom() if loom is None else loom,
    )


async def test_each_turn_records_its_cost_and_the_cast_sums_them() -> None:
    s = spell([echo_call(prompt=1000, completion=500), finish(prompt=2000, completion=0)])
    outcome = await s.cast_async("spend")
    costs = [t.metadata.cost_usd for t in outcome.turns]
    assert costs == [pytest.approx(0.002), pytest.approx(0.002)]
    assert outcome.cost_usd == pytest.approx(0.004)
    assert result_dict(outcome)["cost_usd"] == pytest.approx(0.004)
    # the cost survives the loom's round trip
    stored = s.loom.get(outcome.turns[0].id)
    assert stored.metadata.cost_usd == pytest.approx(0.002)


async def test_an_unknown_price_is_unknown_never_zero() -> None:
    s = spell([echo_call(), finish()], pricing=None)
    outcome = await s.cast_async("spend")
    assert [t.metadata.cost_usd for t in outcome.turns] == [None, None]
    assert outcome.cost_usd is None
    assert result_dict(outcome)["cost_usd"] is None
    assert "cost_usd" not in outcome.turns[0].metadata.to_dict()


async def test_a_reported_cost_wins_over_prices() -> None:
    response = cantrip.Response(
        content="hi",
        usage=cantrip.Usage(100, 100),
        metadata={"cost": 0.5},
    )
    assert response_cost(response) == 0.5
    unpriced = cantrip.Response(content="hi", usage=cantrip.Usage(100, 100))
    assert response_cost(unpriced) is None
    assert response_cost(unpriced, cantrip.ScriptedLLM([], pricing=PRICES)) == pytest.approx(0.0003)


async def test_the_cost_ward_stops_before_the_call_that_would_go_over() -> None:
    # Each call costs $0.001; after two the budget of $0.0025 cannot afford a third.
    s = spell([echo_call(), echo_call(), echo_call(), finish()], cantrip.max_cost_usd(0.0025))
    outcome = await s.cast_async("spend")
    assert len(s.llm.invocations) == 2  # type: ignore[attr-defined]
    assert outcome.truncated and not outcome.terminated
    assert outcome.reason == "max_cost_usd"
    last = outcome.turns[-1]
    assert last.truncated and last.reason == "max_cost_usd"
    assert "$0.0025 budget" in last.observation
    assert outcome.cost_usd == pytest.approx(0.002)


async def test_a_turn_that_spends_the_budget_ends_the_cast() -> None:
    s = spell([echo_call(prompt=5000), finish()], cantrip.max_cost_usd(0.004))
    outcome = await s.cast_async("spend")
    assert len(outcome.turns) == 1
    assert outcome.reason == "max_cost_usd"
    assert outcome.turns[0].gate_calls[0].result == "x"  # the call that ran kept its result


async def test_a_budget_on_an_unpriced_model_refuses_before_its_first_request() -> None:
    """A model with no price cannot keep a budget: the cast is refused before it spends
    anything (it used to make one call first, then stop), naming the ward and the model;
    the refusal is the cast's ending in the loom, as any ward stop is (issue 39, item 16)."""
    s = spell([echo_call(), finish()], cantrip.max_cost_usd(1.0), pricing=None)
    outcome = await s.cast_async("spend")
    assert len(s.llm.invocations) == 0  # type: ignore[attr-defined]
    assert (outcome.reason, outcome.truncated, outcome.terminated) == ("max_cost_usd", True, False)
    (cut,) = outcome.turns
    assert (cut.truncated, cut.reason, cut.gate_calls) == (True, "max_cost_usd", ())
    assert cut.observation == (
        "max_cost_usd $1 cannot be kept: the model 'scripted' has no price, so no call to "
        "it can be priced (add cost_input_per_1m / cost_output_per_1m for it to the "
        "provider config, or give the LLM a pricing)"
    )
    assert list(s.loom.entity_turns(outcome.entity_id)) == [cut]
    assert outcome.cost_usd == 0.0  # nothing was spent


async def test_an_unpriced_provider_model_is_refused_with_zero_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loopback OpenAI server counting requests: the budget refuses the cast before
    the first request reaches it, naming the provider's model."""
    from fake_providers import Answer, Call, isolate, running

    isolate(monkeypatch, tmp_path)
    script = [Answer(calls=(Call("done", {"answer": "spent"}),))]
    async with running("openai", script, model="nobody-priced-me") as (fake, llm):
        s = cantrip.Cantrip(
            llm=llm,
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done], [cantrip.max_turns(5), cantrip.max_cost_usd(0.25)]),
        )
        outcome = await s.cast_async("spend")
    assert fake.requests == []
    assert outcome.reason == "max_cost_usd" and outcome.truncated
    assert outcome.turns[-1].observation.startswith(
        "max_cost_usd $0.25 cannot be kept: the model 'nobody-priced-me' of provider "
        "'openai' has no price"
    )


async def test_a_provider_that_reports_its_own_cost_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRouter reports what each call cost, so a model its catalogue does not price
    can still keep a budget: the cast runs and is charged the reported cost."""
    from fake_providers import Answer, Call, isolate, running

    isolate(monkeypatch, tmp_path)
    script = [Answer(calls=(Call("done", {"answer": "spent"}),))]
    async with running("openrouter", script, model="vendor/unlisted") as (fake, llm):
        s = cantrip.Cantrip(
            llm=llm,
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done], [cantrip.max_turns(5), cantrip.max_cost_usd(0.25)]),
        )
        outcome = await s.cast_async("spend")
    assert len(fake.requests) == 1
    assert outcome.terminated and outcome.result == "spent"
    assert outcome.cost_usd == pytest.approx(0.000123)


async def test_an_unpriced_child_under_the_parents_budget_never_calls_its_model() -> None:
    child_llm = cantrip.ScriptedLLM([finish("child")], name="unpriced-child")
    parent_llm = cantrip.ScriptedLLM(
        [{"tool_calls": [{"gate": "call_agent", "args": {"intent": "work"}}]}, finish("parent")],
        pricing=PRICES,
    )
    s = cantrip.Cantrip(
        llm=parent_llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent],
            [cantrip.max_turns(10), cantrip.max_depth(1), cantrip.max_cost_usd(1.0)],
        ),
        llms={"child_llm": child_llm},
    )
    outcome = await s.cast_async("delegate")
    assert child_llm.invocations == []
    (child,) = [t for t in s.loom.turns if t.entity_id != outcome.entity_id]
    assert child.reason == "max_cost_usd" and child.truncated
    assert "the model 'unpriced-child' has no price" in child.observation
    assert outcome.terminated and outcome.result == "parent"


async def test_a_budget_with_an_unknown_cost_stops_rather_than_spend_blindly() -> None:
    """A priced model whose one answer's cost is still unknown (no usage reported):
    its turn keeps its gate result, and the next call is refused, saying why."""
    no_usage = [
        {"tool_calls": [{"gate": "echo", "args": {"text": "x"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(no_usage, usage=cantrip.Usage(missing=True), pricing=PRICES),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(10), cantrip.max_cost_usd(1.0)]),
    )
    outcome = await s.cast_async("spend")
    assert outcome.reason == "max_cost_usd"
    assert len(s.llm.invocations) == 1  # type: ignore[attr-defined]
    ran, cut = outcome.turns
    assert [c.result for c in ran.gate_calls] == ["x"] and not ran.truncated
    assert (cut.truncated, cut.reason, cut.gate_calls) == (True, "max_cost_usd", ())
    assert "reported no token usage" in cut.observation
    assert outcome.cost_usd is None


async def test_children_spend_the_parents_budget_and_the_whole_tree_stops() -> None:
    # Each child call costs $0.001. The parent's budget is $0.0035: the child runs
    # three calls ($0.003 + the parent's own $0.001 = $0.004 would be over), so the
    # child is stopped by the tree's budget, and the parent stops right after.
    child_llm = cantrip.ScriptedLLM(
        [echo_call("c1"), echo_call("c2"), echo_call("c3"), echo_call("c4"), finish("child")],
        pricing=PRICES,
    )
    parent_llm = cantrip.ScriptedLLM(
        [
            {
                "tool_calls": [{"gate": "call_agent", "args": {"intent": "work"}}],
                "usage": {"prompt_tokens": 1000},
            },
            finish("parent"),
        ],
        pricing=PRICES,
    )
    s = cantrip.Cantrip(
        llm=parent_llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent],
            [cantrip.max_turns(10), cantrip.max_depth(1), cantrip.max_cost_usd(0.0035)],
        ),
        llms={"child_llm": child_llm},
    )
    outcome = await s.cast_async("delegate")
    child_turns = [t for t in s.loom.turns if t.entity_id != outcome.entity_id]
    assert child_turns[-1].reason == "max_cost_usd"
    assert len(child_llm.invocations) == 2
    assert outcome.reason == "max_cost_usd" and outcome.truncated
    assert len(parent_llm.invocations) == 1  # the parent's next call was never made
    # the tree's cost: the parent's call plus the child's two
    assert outcome.cost_usd == pytest.approx(0.003)


async def test_a_childs_own_smaller_budget_stops_only_the_child() -> None:
    child_llm = cantrip.ScriptedLLM(
        [echo_call("c1"), echo_call("c2"), finish("child")], pricing=PRICES
    )
    delegate = {"intent": "work", "wards": [{"max_cost_usd": 0.0015}]}
    parent_llm = cantrip.ScriptedLLM(
        [
            {"tool_calls": [{"gate": "call_agent", "args": delegate}]},
            finish("parent", prompt=0),
        ],
        pricing=PRICES,
    )
    s = cantrip.Cantrip(
        llm=parent_llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent],
            [cantrip.max_turns(10), cantrip.max_depth(1), cantrip.max_cost_usd(1.0)],
        ),
        llms={"child_llm": child_llm},
    )
    outcome = await s.cast_async("delegate")
    assert outcome.terminated and outcome.result == "parent"
    assert len(child_llm.invocations) == 1  # a second $0.001 call would pass $0.0015
    child_turns = [t for t in s.loom.turns if t.entity_id != outcome.entity_id]
    assert child_turns[-1].reason == "max_cost_usd"
    assert outcome.cost_usd == pytest.approx(0.001)


def test_the_ward_composes_by_minimum_and_parses_from_a_mapping() -> None:
    wards = cantrip.WardSet.resolve(
        [*cantrip.Ward.parse({"max_cost_usd": 0.5}), cantrip.max_cost_usd(0.2)]
    )
    assert wards.get("max_cost_usd") == 0.2
    with pytest.raises(cantrip.ConstructionError, match="must not be negative"):
        cantrip.max_cost_usd(-1)


def test_loom_show_and_list_report_cost_per_turn_and_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "costs.db"
    s = spell([echo_call(), finish()], loom=cantrip.Loom.open(path))
    outcome = s.cast("spend")
    s.loom.close()
    assert loom_main([str(path), "show", outcome.entity_id]) == 0
    shown = capsys.readouterr().out
    assert "$0.002000" in shown  # the thread and the tree
    assert shown.count("$0.001000") == 2  # each turn
    assert loom_main([str(path), "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["entities"][0]["cost_usd"] == pytest.approx(0.002)
    assert listed["threads"][0]["cost_usd"] == pytest.approx(0.002)


def test_loom_show_says_unknown_for_an_unpriced_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "unpriced.db"
    s = spell([echo_call(), finish()], pricing=None, loom=cantrip.Loom.open(path))
    outcome = s.cast("spend")
    s.loom.close()
    assert loom_main([str(path), "show", outcome.entity_id]) == 0
    shown = capsys.readouterr().out
    assert "cost unknown" in shown and "$0.0" not in shown


def test_cast_json_reports_cost_and_the_ward_from_a_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "budget.toml"
    spec.write_text(
        """
[llm]
provider = "scripted"
responses = [
  {tool_calls = [{gate = "echo", args = {text = "a"}}], usage = {prompt_tokens = 10}},
  {tool_calls = [{gate = "done", args = {answer = "b"}}], usage = {prompt_tokens = 10}},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{max_turns = 5}, {max_cost_usd = 0.5}]
"""
    )
    code = cli_main(["cast", "--json", "-q", str(spec), "spend"])
    data = json.loads(capsys.readouterr().out)
    # a scripted LLM from a spec has no prices: the budget cannot be kept, and the
    # cast is refused before it spends anything
    assert data["cost_usd"] == 0.0 and data["turns"] == 1
    assert data["reason"] == "max_cost_usd" and code == 2


# -- a provider that reports no usage (issue 28, item 11) -------------------------------


@pytest.mark.parametrize(
    "parse",
    [
        "cantrip.llm._openai_chat",
        "cantrip.llm.providers.anthropic",
        "cantrip.llm.providers.gemini",
        "cantrip.llm.providers.openai_responses",
    ],
)
def test_no_usage_from_any_adapter_is_an_unknown_cost(parse: str) -> None:
    import importlib

    usage = importlib.import_module(parse).parse_usage(None)
    assert usage.missing and usage == cantrip.Usage(missing=True)
    response = cantrip.Response(content="hi", usage=usage)
    assert response_cost(response, cantrip.ScriptedLLM([], pricing=PRICES)) is None
    reported = cantrip.Response(content="hi", usage=usage, metadata={"cost": 0.25})
    assert response_cost(reported) == 0.25  # a cost the provider reports still counts


async def test_a_provider_without_usage_cannot_walk_past_the_cost_ward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$100 per million tokens, a $0.01 budget, and a server that never reports usage:
    each call used to be recorded at $0, so nine ran. The first call's cost is
    unknown; the budget cannot be kept, and the cast stops saying why."""
    from fake_providers import Answer, Call, isolate, running

    from cantrip.llm import clear_cache

    isolate(monkeypatch, tmp_path)
    user = tmp_path / "user-providers"
    user.mkdir()
    (user / "openai.toml").write_text(
        '[models."priced"]\ncost_input_per_1m = 100.0\ncost_output_per_1m = 100.0\n'
    )
    clear_cache()
    script = [Answer(calls=(Call("echo", {"text": f"c{i}"}),), usage=False) for i in range(9)]
    script.append(Answer(calls=(Call("done", {"answer": "spent"}),), usage=False))
    async with running("openai", script, model="priced") as (fake, llm):
        loom = cantrip.Loom()
        s = cantrip.Cantrip(
            llm=llm,
            identity=cantrip.Identity(),
            circle=cantrip.Circle(
                [done, echo], [cantrip.max_turns(20), cantrip.max_cost_usd(0.01)]
            ),
            loom=loom,
        )
        outcome = await s.cast_async("spend")
    assert len(fake.requests) == 1
    assert outcome.reason == "max_cost_usd" and outcome.truncated
    assert outcome.cost_usd is None and result_dict(outcome)["cost_usd"] is None
    first, last = outcome.turns
    assert first.metadata.cost_usd is None and first.metadata.usage_missing
    assert last.observation == (
        "max_cost_usd $0.01 cannot be kept: the provider reported no token usage for a "
        "call, so what it cost is unknown (a missing usage is never counted as $0)"
    )
    # the loom says so too: a result rebuilt from it reports the same unknown cost
    stored = loom.get(first.id)
    assert stored.metadata.usage_missing and stored.metadata.to_dict()["usage_missing"]
    from cantrip.loom._summary import cost

    assert cost(loom.entity_turns(outcome.entity_id)) is None


# -- one cast, one cost: live and rebuilt from the loom (issue 28, item 11) ----------


def delegating_spell(loom: cantrip.Loom) -> cantrip.Cantrip:
    """The parent spends $0.002 (two calls), its child $0.002: the tree $0.004."""
    child_llm = cantrip.ScriptedLLM([echo_call("c"), finish("child")], pricing=PRICES)
    parent_llm = cantrip.ScriptedLLM(
        [
            {
                "tool_calls": [{"gate": "call_agent", "args": {"intent": "work"}}],
                "usage": {"prompt_tokens": 1000},
            },
            finish("parent"),
        ],
        pricing=PRICES,
    )
    return cantrip.Cantrip(
        llm=parent_llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent], [cantrip.max_turns(10), cantrip.max_depth(1)]
        ),
        llms={"child_llm": child_llm},
        loom=loom,
    )


async def test_an_idempotent_replay_reports_the_same_tree_cost_as_the_live_result() -> None:
    from cantrip.protocols.sessions._hub import SessionHub

    hub = SessionHub(delegating_spell(cantrip.Loom()))
    session, _ = hub.create()
    live = await hub.prompt(session, "delegate", key="k-1")
    replayed = await hub.prompt(session, "delegate", key="k-1")  # a retry: nothing runs again
    assert live is not None and replayed is not None
    assert replayed.turns == live.turns
    assert result_dict(live)["cost_usd"] == pytest.approx(0.004)
    assert result_dict(replayed)["cost_usd"] == pytest.approx(0.004)  # was $0.002: no child
    await hub.aclose()


async def test_a_result_rebuilt_from_postgres_counts_the_whole_tree(pg_url: str) -> None:
    """What ``serve --db`` answers: the cast rebuilt from the database's turns."""
    from cantrip._outcome import recorded_cast
    from cantrip.loom._postgres import PostgresStore

    loom = cantrip.Loom.open(pg_url)
    try:
        live = await delegating_spell(loom).cast_async("delegate")
        await loom.sync(live.entity_id)
        store = loom.store
        assert isinstance(store, PostgresStore)
        rebuilt = recorded_cast(store.entity_turns(live.entity_id), 0, store)
    finally:
        loom.close()
    assert live.cost_usd == pytest.approx(0.004)
    assert rebuilt.cost_usd == pytest.approx(0.004)


async def test_a_workers_outcome_reports_the_tree_cost() -> None:
    """What ``cast --db --json`` prints for a cast a worker ran."""
    from cantrip.distributed._outcome import outcome_of

    live = await delegating_spell(cantrip.Loom()).cast_async("delegate")
    assert outcome_of(live)["cost_usd"] == pytest.approx(0.004)
