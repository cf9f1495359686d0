"""``serve``'s per-session and per-token budgets (issue 43, item 2): set by the server
(``--session-budget``, ``--token-budget``), counted over every prompt of a session and
every child its casts spawn, and out of a client's reach -- the spec's own higher
ward, a child's proposed wards, a restart of the server do not lift them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.cli import _main as _cli
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.sessions._budgets import ServeBudgets
from cantrip.protocols.sessions._hub import SessionHub
from cantrip.protocols.sessions._limits import SessionLimits
from cantrip.spec import build_cantrip, parse_spec

USAGE = {"prompt_tokens": 40, "completion_tokens": 10}  # 50 tokens an answer


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}], "usage": USAGE}


def make_spell(script: list[dict[str, Any]], loom: Path | None = None) -> cantrip.Cantrip:
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": script, "script": "shared"},
        "circle": {
            "medium": "conversation",
            "gates": ["done", "echo", "call_agent"],
            # the spec's own budget is far higher than the server's: it does not lift it
            "wards": [{"max_turns": 8}, {"max_tokens_total": 1_000_000}, {"max_depth": 1}],
        },
    }
    if loom is not None:
        doc["loom"] = {"path": str(loom)}
    return build_cantrip(parse_spec(doc))


def tokens(loom: cantrip.Loom) -> int:
    return sum(t.metadata.tokens_prompt + t.metadata.tokens_completion for t in loom.turns)


async def test_http_sessions_stop_at_the_servers_session_and_token_budgets() -> None:
    script = [
        call("echo", text="a1"), call("done", answer="a1 done"),  # session A: 100
        call("echo", text="a2"),  # A reaches its 150: its cast ends there
        call("echo", text="b1"), call("done", answer="b1 done"),  # B: the token's 250
        call("done", answer="never reached"),
    ]  # fmt: skip
    spell = make_spell(script)
    budgets = ServeBudgets.parse(["max_tokens_total=150"], ["max_tokens_total=250"])
    limits = SessionLimits(budgets=budgets)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                spell, "127.0.0.1", 0, limits=limits, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:

            async def prompt(sid: str, text: str) -> dict[str, Any]:
                answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": text})
                assert answer.status_code == 200, answer.text
                body: dict[str, Any] = answer.json()
                return body

            a = (await http.post("/sessions")).json()["session_id"]
            assert (await prompt(a, "one"))["result"] == "a1 done"
            second = await prompt(a, "two")  # a new cast: the session's 100 count
            assert (second["reason"], second["truncated"], second["turns"]) == (
                "max_tokens_total",
                True,
                1,
            )
            assert second["stop_reason"] == "max_tokens"  # ACP's word, as for the ward
            third = await prompt(a, "three")  # spent: no model call at all
            assert third["reason"] == "max_tokens_total" and third["usage"]["total_tokens"] == 0
            b = (await http.post("/sessions")).json()["session_id"]
            assert (await prompt(b, "one"))["result"] == "b1 done"  # 150 + 100: the 250
            refused = await prompt(b, "two")  # B's own 150 is not spent; the token's is
            assert refused["reason"] == "max_tokens_total"
        nursery.cancel_scope.cancel()
    assert tokens(spell.loom) == 250
    last = spell.loom.turns[-1]
    assert "the entity tree" in last.observation and "of a budget of 250" in last.observation


async def test_a_childs_proposed_wards_do_not_lift_the_session_budget() -> None:
    script = [
        call("call_agent", intent="spend", wards=[{"max_tokens_total": 10_000_000}]),
        *[call("echo", text=f"{i}") for i in range(6)],
    ]
    spell = make_spell(script)
    hub = SessionHub(spell, budgets=ServeBudgets.parse(["max_tokens_total=150"]))
    session, _ = hub.create()
    outcome = await hub.prompt(session, "delegate")
    assert outcome is not None and outcome.reason == "max_tokens_total"
    assert tokens(spell.loom) == 150  # the parent's 50 and the child's two calls
    await hub.aclose()


async def test_a_session_read_again_after_a_restart_is_charged_its_history(
    tmp_path: Path,
) -> None:
    path = tmp_path / "serve.db"
    script = [call("echo", text="1"), call("echo", text="2"), call("done", answer="ok")]
    budgets = ServeBudgets.parse(["max_tokens_total=150"])
    first = make_spell(script, path)
    hub = SessionHub(first, budgets=budgets)
    session, _ = hub.create()
    assert (await hub.prompt(session, "spend")) is not None  # 150: the budget
    sid = session.id
    await hub.aclose()
    first.loom.close()

    again = make_spell([call("done", answer="free again?")], path)
    restarted = SessionHub(again, budgets=budgets)
    outcome = await restarted.prompt(restarted.get(sid), "more")
    assert outcome is not None and outcome.reason == "max_tokens_total"
    assert not any(t.result == "free again?" for t in again.loom.turns)
    await restarted.aclose()
    again.loom.close()


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("max_turns=3", "--session-budget takes WARD=N with WARD one of max_tokens_total"),
        ("max_tokens_total", "--session-budget takes WARD=N"),
        ("max_tokens_total=-5", "must not be negative"),
        ("max_children=1.5", "--session-budget 'max_children=1.5'"),
    ],
)
def test_a_bad_budget_flag_is_refused_in_one_line(
    flag: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('[llm]\nprovider = "scripted"\nresponses = []\n[circle]\ngates = ["done"]\n')
    code = _cli.main(["serve", str(spec), "--session-budget", flag, "--check"])
    assert code != 0
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


# -- serve --db: the workers keep a session's budget ------------------------------------------


async def test_serve_db_workers_keep_the_session_budget(pg_server: str, tmp_path: Path) -> None:
    """A replica started with ``--session-budget`` queues it with each prompt; the worker
    charges the session's history (its earlier prompts, run by whichever worker) and
    stops the cast at the budget, however high the spec's own ward."""
    from pg_cluster import fresh_database
    from test_serve_db import TURNS, open_stack

    url = fresh_database(pg_server, "serve_budgets")
    with open_stack(url, tmp_path, workers=1, replicas=0, delay_s=0.0) as stack:
        base = await trio.to_thread.run_sync(
            lambda: stack.start_replica(options=("--session-budget", "max_gate_calls=3"))
        )
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            first = (await http.post(f"/sessions/{sid}/prompt", json={"prompt": "a"})).json()
            assert first["result"] == "a ok #1" and first["turns"] == TURNS  # 2 echoes
            second = (await http.post(f"/sessions/{sid}/prompt", json={"prompt": "b"})).json()
            # one echo left for the session: the second is refused, the cast ends
            assert (second["reason"], second["truncated"], second["turns"]) == (
                "max_gate_calls",
                True,
                2,
            )
            other = (await http.post("/sessions")).json()["session_id"]
            fresh = (await http.post(f"/sessions/{other}/prompt", json={"prompt": "c"})).json()
            assert fresh["result"] == "c ok #1"  # each session has its own budget


def test_serve_db_refuses_a_token_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('[llm]\nprovider = "scripted"\nresponses = []\n[circle]\ngates = ["done"]\n')
    code = _cli.main(
        ["serve", str(spec), "--db", "postgresql://nowhere/x", "--token-budget", "max_children=1"]
    )
    assert code != 0
    assert "--token-budget is not kept by serve --db" in capsys.readouterr().err
