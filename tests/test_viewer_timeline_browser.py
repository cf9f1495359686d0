"""The timeline of a cast in a real browser (Debian's chromium, headless, as in
test_viewer_browser.py): what is drawn for a generated cast with children, a pause,
cut-offs and a fork; a big cast's grouped bars; a live session's timeline growing.

The screenshot of the first test is the docs' picture (docs/img/viewer-timeline.png,
written when CANTRIP_DOCS_SCREENSHOTS is set) and goes to test-artifacts/viewer/."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from playwright.sync_api import Browser, Page, expect
from test_viewer_browser import (
    ARTIFACTS,
    CANTRIP,
    browser,  # noqa: F401 -- the fixture
    live_session,
    new_page,
    started,
)
from timeline_looms import build_cast

from cantrip.loom import EntityRecord, Loom, Turn

DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def _cast_file(tmp_path: Path, **shape: int) -> Path:
    path = tmp_path / "cast.db"
    build_cast(Loom.open(path), **shape).close()
    return path


def _style(page: Page, selector: str) -> tuple[str, str, str]:
    return tuple(  # type: ignore[return-value]
        page.eval_on_selector(
            selector,
            """(e) => { const s = getComputedStyle(e);
                 return [s.borderTopStyle, s.borderTopColor, s.backgroundImage]; }""",
        )
    )


def _screenshot(page: Page, name: str) -> None:
    page.screenshot(path=ARTIFACTS / name)
    if os.environ.get("CANTRIP_DOCS_SCREENSHOTS"):
        page.screenshot(path=DOCS_IMG / name)


def test_the_timeline_draws_a_row_per_entity_a_bar_per_turn_and_tells_endings_apart(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = _cast_file(tmp_path)
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/#/e/entity-root")
        page.click("#open-timeline")
        rows = page.locator(".tl-row[data-entity]")
        expect(rows).to_have_count(5)
        entities = [rows.nth(i).get_attribute("data-entity") for i in range(5)]
        assert entities == ["entity-root", *(f"entity-kid{n}" for n in range(1, 5))]
        assert [rows.nth(i).get_attribute("data-depth") for i in range(5)] == ["0"] + ["1"] * 4
        # One bar per turn: 12 turns, 4 delegations and a pause recorded in two pieces.
        counts = {e: rows.nth(i).locator(".bar").count() for i, e in enumerate(entities)}
        assert counts == {
            "entity-root": 17,
            "entity-kid1": 2,
            "entity-kid2": 1,
            "entity-kid3": 1,
            "entity-kid4": 1,
        }
        # A child's bar starts right of the checkpoint that spawned it (nested under the call).
        spawn = page.locator('.bar[data-turn="turn-r2"]').bounding_box()
        child = page.locator('.bar[data-turn="turn-kid1-1"]').bounding_box()
        assert spawn and child and child["x"] >= spawn["x"] + spawn["width"] - 1
        assert child["y"] > spawn["y"]
        # Cut-off, failed, cancelled and paused look different from finished (and from ok).
        looks = {
            status: _style(page, f'.tl-row .bar[data-status="{status}"]')
            for status in ("terminated", "truncated", "failed", "cancelled", "paused", "ok")
        }
        assert len(set(looks.values())) == len(looks), looks
        # Waiting for a human is its own segment of the bar after the pause.
        wait = page.locator('.bar[data-turn="turn-r3c"] .seg.wait')
        assert (wait.bounding_box() or {"width": 0})["width"] > 20
        # Cost and tokens per bar; a cut-off turn's cost is unknown, never $0.
        cut = page.locator('.bar[data-turn="turn-kid2-1"]')
        expect(cut).to_have_attribute("data-cost", "unknown")
        title = (
            "turn #1 · truncated (max_turns)\nmodel 300 ms · gates 50 ms\n0 tokens · cost unknown"
        )
        expect(cut).to_have_attribute("title", title)
        expect(page.locator('.bar[data-turn="turn-r1"]')).to_have_attribute("data-tokens", "120")
        # A click opens the turn.
        cut.click()
        expect(page.locator("#turn h2")).to_contain_text("truncated")
        expect(page.locator("#turn .meta .cost")).to_have_text("cost unknown")
        page.locator('.bar[data-turn="turn-r1"]').click()
        expect(page.locator("#turn .meta .cost")).to_have_text("$0.002000")
        _screenshot(page, "viewer-timeline.png")

        # The cut-off outcome in the chat view is not painted as a finished one.
        page.goto(url + "/#/thread/turn-kid2-1")
        outcome = page.locator(".msg.outcome")
        expect(outcome).to_have_class("msg outcome truncated")
        finished = "rgb(227, 243, 233)"
        assert outcome.evaluate("(e) => getComputedStyle(e).backgroundColor") != finished
        page.goto(url + "/#/thread/turn-r12")
        done = page.locator(".msg.outcome")
        assert done.evaluate("(e) => getComputedStyle(e).backgroundColor") == finished

        # The tree: the fork is drawn below the turn it branched from.
        page.goto(url + "/#/e/entity-root")
        fork = page.locator('.tree .row[data-turn="turn-fork1"]')
        expect(fork.locator(".branch")).to_have_text("fork")
        origin = page.locator('.tree .row[data-turn="turn-r2c"]')
        assert (
            int(fork.get_attribute("data-index") or -1)
            == int(origin.get_attribute("data-index") or 0) + 1
        )
        paused = page.locator('.tree .row[data-turn="turn-r3"] .badge').first
        expect(paused).to_have_text("paused")
        page.close()
    assert errors == []


def test_a_big_casts_turns_come_grouped_and_a_group_zooms_in(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = _cast_file(tmp_path, turns=2000, children=20)
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/#/e/entity-root/timeline")
        expect(page.locator(".tl-row[data-entity]")).to_have_count(21)
        root = page.locator('.tl-row[data-entity="entity-root"]')
        groups = root.locator(".bar.group")
        expect(groups.first).to_be_visible()
        turns = root.locator(".bar").evaluate_all(
            "(bars) => bars.reduce((n, b) => n + Number(b.dataset.turns), 0)"
        )
        assert turns == 2000 + 20 + 1  # every turn is in a bar: continuations and the answer
        assert root.locator(".bar").count() < 700  # grouped, not 2,021 elements
        first = groups.first
        count = int(first.get_attribute("data-turns") or 0)
        turn = first.get_attribute("data-turn")
        first.dispatch_event("click")  # zooms in on the group: its turns come one bar each
        single = root.locator(f'.bar[data-turn="{turn}"]')
        expect(single).to_have_attribute("data-turns", "1")
        assert (
            root.locator(".bar").evaluate_all(
                "(bars) => bars.reduce((n, b) => n + Number(b.dataset.turns), 0)"
            )
            >= count
        )
        page.click("#tl-fit")
        expect(root.locator(".bar.group").first).to_be_visible()
        page.close()
    assert errors == []


LIVE_SPEC = """
[llm]
provider = "scripted"
script = "shared"
responses = [
  { tool_calls = [{ gate = "echo", args = { text = "one" } }], usage = { prompt_tokens = 30, completion_tokens = 3 } },
  { tool_calls = [{ gate = "done", args = { answer = "first" } }] },
  { tool_calls = [{ gate = "echo", args = { text = "two" } }] },
  { tool_calls = [{ gate = "done", args = { answer = "second" } }] },
]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 4 }]
"""  # noqa: E501


def test_a_live_sessions_timeline_grows_as_turns_land(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    errors: list[str] = []
    with live_session(browser, tmp_path, LIVE_SPEC, errors) as (url, page):
        entity = page.evaluate("location.hash").removeprefix("#/e/")
        page.fill("#prompt", "First")
        page.click("#send")
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        page.click("#open-timeline")
        row = page.locator(f'.tl-row[data-entity="{entity}"]')
        bars = row.locator(".bar")
        # (turns a millisecond apart may share a bar: the row counts its turns)
        expect(row).to_contain_text("2 turns")
        assert bars.evaluate_all("(bs) => bs.reduce((n, b) => n + Number(b.dataset.turns), 0)") == 2
        expect(page.locator("#timeline")).to_have_attribute("data-following", "live")
        session = "session-" + entity.removeprefix("entity-")
        answer = httpx.post(
            f"{url}/sessions/{session}/prompt", json={"prompt": "Again"}, timeout=30
        )
        assert answer.json()["result"] == "second"
        expect(row).to_contain_text("4 turns")  # the page was told; nothing reloaded it
        assert bars.evaluate_all("(bs) => bs.reduce((n, b) => n + Number(b.dataset.turns), 0)") == 4
        expect(bars.last).to_have_attribute("data-status", "terminated")
        page.close()
    assert errors == []


def test_a_rolled_back_branch_is_drawn_below_the_turn_it_left(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 45.4 in the page: the branch an entity was rewound from sits right after the
    turn it branched from, indented and marked ``rollback``; the live thread goes on
    at its own depth."""
    path = tmp_path / "rewound.db"
    loom = Loom.open(path)
    loom.register_entity(EntityRecord("entity-e", "spell"))
    for tid, parent, seq, extra in (
        ("t1", None, 1, {"intent": "first"}),
        ("t2", "t1", 2, {"intent": "second", "truncated": True, "reason": "interrupted"}),
        ("t3", "t1", 3, {"intent": "third"}),
        ("t4", "t3", 4, {"terminated": True, "reason": "done"}),
    ):
        loom.append(Turn(tid, parent, "entity-e", seq, utterance=tid, **extra))
    loom.close()
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/#/e/entity-e")
        rows = page.locator(".tree .row")
        expect(rows).to_have_count(4)
        order = [rows.nth(i).get_attribute("data-turn") for i in range(4)]
        assert order == ["t1", "t2", "t3", "t4"]
        expect(rows.nth(1).locator(".branch")).to_have_text("rollback")
        expect(rows.nth(1).locator(".badge.cancelled")).to_be_visible()
        indent = [rows.nth(i).evaluate("(e) => parseFloat(e.style.paddingLeft)") for i in range(4)]
        assert indent[1] > indent[0] == indent[2] == indent[3]
        page.close()
    assert errors == []
