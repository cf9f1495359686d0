"""Eval runs in the viewer (``/api/evals``, issue 45.3): the runs ``cantrip eval --loom``
recorded, one run's cases (paged, filtered), two runs paired for Compare -- read from
the runs' records on SQLite and PostgreSQL looms, never from the turns, behind the token."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from playwright.sync_api import Browser, expect
from test_evals import greeter
from test_viewer_api import viewing
from test_viewer_browser import CANTRIP, browser, new_page, started  # noqa: F401
from test_viewer_timeline import loom_url  # noqa: F401 -- the fixture
from test_viewer_timeline_browser import _screenshot

from cantrip.evals import Case, EvalReport, Expect, Suite, run_suite
from cantrip.loom import Loom
from cantrip.protocols.viewer._api import LoomViews, ViewerError

FIRST = Suite(
    [
        Case(name="greets", intent="Greet.", expect=Expect(result_contains="greeted")),
        Case(name="waves", intent="Wave.", expect=Expect(result_contains="waved")),
        Case(name="broken", intent="Greet.", expect=Expect(function="json:nothing")),
    ],
    source="first.yaml",
)
SECOND = Suite(  # the same cases, "waves" now passing
    [
        Case(name="greets", intent="Greet.", expect=Expect(result_contains="greeted")),
        Case(name="waves", intent="Wave.", expect=Expect(result_contains="greeted")),
    ],
    source="second.yaml",
)


def record_runs(url: str, tmp_path: Path) -> tuple[EvalReport, EvalReport]:
    """Two runs of the greeter recorded in the loom at ``url``, as ``cantrip eval --loom``
    records them (the first with every case twice)."""
    spec = greeter(tmp_path)

    async def both() -> tuple[EvalReport, EvalReport]:
        loom = Loom.open(url)
        try:
            first = await run_suite(FIRST, spec=spec, loom=loom, repeat=2, concurrency=2)
            second = await run_suite(SECOND, spec=spec, loom=loom)
        finally:
            loom.close()
        return first, second

    return trio.run(both)


@pytest.fixture
def runs(loom_url: str, tmp_path: Path) -> Iterator[tuple[LoomViews, EvalReport, EvalReport]]:  # noqa: F811
    first, second = record_runs(loom_url, tmp_path)
    loom = Loom.open(loom_url)  # read back as the viewer reads a loom another process wrote
    try:
        yield LoomViews(lambda: loom), first, second
    finally:
        loom.close()


def q(**params: Any) -> dict[str, list[str]]:
    return {k: [str(v)] for k, v in params.items()}


def test_the_runs_are_listed_newest_first_with_their_pass_fail_counts(
    runs: tuple[LoomViews, EvalReport, EvalReport],
) -> None:
    views, first, second = runs
    listed = views.evals({})
    assert listed["total"] == 2
    assert [r["run_id"] for r in listed["items"]] == [second.run_id, first.run_id]
    newer, older = listed["items"]
    assert (older["suite"], older["passed"], older["failed"], older["errored"]) == (
        "first.yaml",
        2,
        2,
        2,
    )
    assert (newer["passed"], newer["failed"], newer["errored"]) == (2, 0, 0)
    assert older["summary"]["runs"] == 6 and older["started"] == first.started
    assert "cases" not in older or not isinstance(older["cases"], list)  # a list row, not a run
    # the runs' records are no entities of the list
    entities = views.entities({})
    assert entities["total"] == 8  # 6 + 2 casts
    assert views.overview()["entities"] == 8  # the runs' records are not counted
    assert all(not e["entity_id"].startswith("eval-") for e in entities["items"])


def test_a_runs_cases_say_status_repeat_cast_reason_and_cost(
    runs: tuple[LoomViews, EvalReport, EvalReport],
) -> None:
    views, first, _ = runs
    page = views.eval_run(first.run_id, {})
    assert page["total"] == 6 and page["counts"] == {
        "passed": 2,
        "failed": 2,
        "errored": 2,
        "skipped": 0,
    }
    assert [(c["name"], c["repeat"], c["status"]) for c in page["items"]] == [
        ("greets", 0, "passed"),
        ("greets", 1, "passed"),
        ("waves", 0, "failed"),
        ("waves", 1, "failed"),
        ("broken", 0, "errored"),
        ("broken", 1, "errored"),
    ]
    by_cast = {r.entity_id: r for r in first.runs}
    for case in page["items"]:
        run = by_cast[case["entity_id"]]  # the entity of the case's own cast
        assert (case["name"], case["repeat"]) == (run.case, run.repeat)
        assert case["tokens"] == run.tokens and case["cost_usd"] == run.cost_usd
        assert case["reason"] == "done" and case["turns"] == 2
    failed = page["items"][2]
    assert "waved" in failed["why"]  # why it failed, as the report says
    assert "has no function 'nothing'" in page["items"][4]["why"]
    # the cast of a case is in the loom, tagged with its run and case
    cast = views.timeline(failed["entity_id"], {})
    assert cast["items"][0]["entity_id"] == failed["entity_id"]


def test_a_runs_cases_filter_by_status_and_name_and_page(
    runs: tuple[LoomViews, EvalReport, EvalReport],
) -> None:
    views, first, _ = runs
    failing = views.eval_run(first.run_id, q(status="failed,errored"))
    assert [c["name"] for c in failing["items"]] == ["waves", "waves", "broken", "broken"]
    assert failing["counts"]["passed"] == 2  # the run's counts, whatever the filter
    named = views.eval_run(first.run_id, q(name="WAV"))
    assert {c["name"] for c in named["items"]} == {"waves"} and named["total"] == 2
    both = views.eval_run(first.run_id, q(name="gree", status="failed"))
    assert both["total"] == 0
    paged = views.eval_run(first.run_id, q(offset=1, limit=2))
    assert paged["total"] == 6 and [c["repeat"] for c in paged["items"]] == [1, 0]
    with pytest.raises(ViewerError, match="unknown status passd") as bad:
        views.eval_run(first.run_id, q(status="passd"))
    assert bad.value.status == 400
    with pytest.raises(ViewerError, match="no eval run 'eval-nope'") as unknown:
        views.eval_run("eval-nope", {})
    assert unknown.value.status == 404
    cast = first.runs[0].entity_id
    assert cast is not None
    with pytest.raises(ViewerError, match="no eval run"):  # a cast is no run
        views.eval_run(cast, {})


def test_two_runs_pair_their_cases_for_compare(
    runs: tuple[LoomViews, EvalReport, EvalReport],
) -> None:
    views, first, second = runs
    pairs = views.eval_pairs(first.run_id, second.run_id, {})
    assert pairs["total"] == 6 and pairs["changed"] == 5
    rows = [(p["name"], p["repeat"], p["a"] and p["a"]["status"]) for p in pairs["items"]]
    assert rows[0] == ("greets", 0, "passed") and not pairs["items"][0]["changed"]
    waves = pairs["items"][2]
    assert (waves["a"]["status"], waves["b"]["status"], waves["changed"]) == (
        "failed",
        "passed",
        True,
    )
    assert waves["a"]["entity_id"] != waves["b"]["entity_id"]
    # the two casts open in Compare
    compared = views.compare(q(a=waves["a"]["entity_id"], b=waves["b"]["entity_id"]))
    assert compared["a"]["entity_id"] == waves["a"]["entity_id"]
    only_changed = views.eval_pairs(first.run_id, second.run_id, q(changed=1))
    assert only_changed["total"] == 5
    assert all(p["changed"] for p in only_changed["items"])


def test_listing_runs_and_cases_reads_no_turn(tmp_path: Path) -> None:
    """On a loom of 10,000 turns besides the casts, the eval routes ask the store for
    entity records only: every statement they run is traced and none reads ``turns``."""
    path = tmp_path / "big.db"
    first, _ = record_runs(str(path), tmp_path)
    _pad(path, 10_000)
    loom = Loom.open(path)
    try:
        assert len(loom) > 10_000
        views = LoomViews(lambda: loom)
        statements: list[str] = []
        db: sqlite3.Connection = loom.store._db  # type: ignore[attr-defined]
        db.set_trace_callback(statements.append)
        assert views.evals({})["total"] == 2
        assert views.eval_run(first.run_id, q(status="failed"))["total"] == 2
        db.set_trace_callback(None)
    finally:
        loom.close()
    assert statements and not [s for s in statements if "turns" in s.lower()]


def _pad(path: Path, count: int) -> None:
    """``count`` more turns in one long cast of another entity."""
    from cantrip.loom import EntityRecord, Turn

    loom = Loom.open(path)
    try:
        loom.register_entity(EntityRecord("entity-long", "spell"))
        parent = None
        for n in range(count):
            turn = loom.append(Turn(f"long-{n}", parent, "entity-long", n + 1, utterance="."))
            parent = turn.id
    finally:
        loom.close()


def test_the_eval_routes_are_behind_the_token(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    first, second = record_runs(str(path), tmp_path)
    token = "evals-token-0453"
    with (
        viewing(path, "--token", token) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        routes = [
            "/api/evals",
            f"/api/evals/{first.run_id}?status=failed",
            f"/api/evals/{first.run_id}/vs/{second.run_id}",
        ]
        for route in routes:
            assert http.get(route).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert http.get("/api/evals", headers=auth).json()["total"] == 2
        cases = http.get(routes[1], headers=auth).json()
        assert [c["status"] for c in cases["items"]] == ["failed", "failed"]
        assert http.get(routes[2], headers=auth).json()["changed"] == 5
        missing = http.get("/api/evals/eval-nope", headers=auth)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_run"
        assert http.get("/api/evals/a/b", headers=auth).status_code == 404
        assert http.get("/ui/evals.js").status_code == 200


SUITE = """
spec: spec.toml
cases:
  - name: greets
    intent: Greet the world.
    expect: {{ result_contains: greeted }}
  - name: waves
    intent: Wave at the world.
    expect: {{ result_contains: {waves} }}
  - name: greets-briefly
    intent: Greet briefly.
    expect: {{ gates: [echo, done] }}
"""


def eval_cli(tmp_path: Path, suite: str, waves: str, code: int) -> str:
    """A real ``cantrip eval --loom evals.db``; the run's id."""
    greeter(tmp_path)
    (tmp_path / suite).write_text(SUITE.format(waves=waves), encoding="utf-8")
    done = subprocess.run(
        [CANTRIP, "eval", suite, "--loom", "evals.db", "--json", "report.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    return str(json.loads((tmp_path / "report.json").read_text())["run_id"])


def test_the_eval_runs_page_lists_runs_filters_cases_and_opens_timeline_and_compare(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    first = eval_cli(tmp_path, "first.yaml", waves="waved", code=1)  # "waves" fails
    second = eval_cli(tmp_path, "second.yaml", waves="greeted", code=0)  # and now passes
    errors: list[str] = []
    with started([CANTRIP, "loom", "evals.db", "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/")
        page.click("#nav-evals")
        runs = page.locator("tr.eval-run")
        expect(runs).to_have_count(2)
        expect(runs.nth(0)).to_have_attribute("data-run", second)  # newest first
        expect(runs.nth(1).locator(".badge.passed")).to_have_text("2 passed")
        expect(runs.nth(1).locator(".badge.failed")).to_have_text("1 failed")
        expect(runs.nth(0).locator(".badge.failed")).to_have_text("0 failed")
        runs.nth(1).click()
        expect(page).to_have_url(f"{url}/#/evals/{first}")
        cases = page.locator("tr.eval-case")
        expect(cases).to_have_count(3)
        expect(page.locator("#eval-head .badge.passed")).to_have_text("2 passed")
        failing = page.locator('tr.eval-case[data-status="failed"]')
        expect(failing).to_have_count(1)
        expect(failing).to_have_attribute("data-case", "waves")
        expect(failing.locator(".badge.failed")).to_be_visible()
        expect(failing).to_contain_text("waved")  # why it failed
        _screenshot(page, "viewer-evals.png")
        page.select_option("#eval-status", "failed,errored")
        expect(cases).to_have_count(1)
        page.select_option("#eval-status", "")
        page.fill("#eval-name", "greets")
        expect(cases).to_have_count(2)
        page.fill("#eval-name", "briefly")
        expect(cases).to_have_count(1)
        cast = cases.first.get_attribute("data-entity")
        cases.first.click()  # a case opens its cast's timeline
        expect(page).to_have_url(f"{url}/#/e/{cast}/timeline")
        expect(page.locator(".tl-row[data-entity]")).to_have_count(1)
        # two runs picked: their cases paired, a pair opens Compare on the two casts
        page.goto(url + "/#/evals")
        expect(runs).to_have_count(2)
        expect(page.locator("#compare-runs")).to_be_disabled()
        page.locator("tr.eval-run input.pick").nth(1).check()
        page.locator("tr.eval-run input.pick").nth(0).check()
        page.click("#compare-runs")
        expect(page).to_have_url(f"{url}/#/evals/{first}/vs/{second}")
        pairs = page.locator("tr.eval-pair")
        expect(pairs).to_have_count(3)
        expect(page.locator("#eval-changed-count")).to_have_text("1 case changed")
        page.check("#eval-changed")
        expect(pairs).to_have_count(1)
        expect(pairs.first.locator(".badge")).to_have_text(["failed", "passed"])
        pairs.first.click()
        expect(page).to_have_url(re.compile(r"#/compare/entity-[^/]+/entity-[^/]+$"))
        expect(page.locator("#compare-summary")).to_be_visible()
        expect(page.locator(".pair[data-index]").first).to_be_visible()
        page.close()
    assert errors == []
