"""Compare in the viewer (``/api/compare``, issue 45.2): two threads aligned from their
common ancestor, the first difference marked, what differs within a turn named -- on
SQLite and PostgreSQL looms, behind the token, and drawn in a real browser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect
from test_viewer_api import viewing
from test_viewer_browser import CANTRIP, browser, new_page, started  # noqa: F401
from test_viewer_timeline import loom_url  # noqa: F401 -- the fixture
from test_viewer_timeline_browser import _screenshot

from cantrip.loom import EntityRecord, GateCallRecord, Loom, Turn
from cantrip.protocols.viewer._api import LoomViews, ViewerError


def _turn(tid: str, parent: str | None, entity: str, seq: int, flight: str, **kw: Any) -> Turn:
    call = GateCallRecord("echo", {"text": flight}, f"booked {flight}")
    return Turn(
        tid, parent, entity, seq, utterance="Booking.", content="Booking.",
        gate_calls=(call,), observation=f"booked {flight}", **kw,
    )  # fmt: skip


def build_pair(loom: Loom, turns: int = 3, differ_at: int = 2) -> Loom:
    """``entity-a`` (turns ``a1``..), ``entity-b`` forked from ``a1`` and differing from
    turn ``differ_at`` on (another flight), and ``entity-r``: a separate cast with
    ``entity-a``'s contents (a replay of it)."""
    for entity in ("entity-a", "entity-r"):
        loom.register_entity(EntityRecord(entity, "spell"))
    loom.register_entity(EntityRecord("entity-b", "spell", forked_from="a1"))
    parents: dict[str, str | None] = {"a": None, "b": "a1", "r": None}
    for n in range(1, turns + 1):
        last = n == turns
        ending: dict[str, Any] = {"terminated": True, "reason": "done", "result": "ok"}
        for side in ("a", "b", "r"):
            if side == "b" and n == 1:
                continue
            flight = "LX999" if side == "b" and n >= differ_at else "LX318"
            intent = "Book a flight" if n == 1 else None
            turn = _turn(
                f"{side}{n}", parents[side], f"entity-{side}", n, flight, intent=intent,
                **(ending if last else {}),
            )  # fmt: skip
            loom.append(turn)
            parents[side] = turn.id
    return loom


def pair_views(url: str, **shape: int) -> tuple[Loom, LoomViews]:
    build_pair(Loom.open(url), **shape).close()
    loom = Loom.open(url)
    return loom, LoomViews(lambda: loom)


def q(**params: Any) -> dict[str, list[str]]:
    return {k: [str(v)] for k, v in params.items()}


def test_two_forks_align_after_their_common_ancestor_and_name_what_differs(
    loom_url: str,  # noqa: F811
) -> None:
    loom, views = pair_views(loom_url)
    page = views.compare(q(a="entity-a", b="entity-b"))
    assert page["common"] == 1 and page["ancestor"]["id"] == "a1"
    assert (page["a"]["leaf"], page["b"]["leaf"]) == ("a3", "b3")
    assert [(p["a"]["id"], p["b"]["id"]) for p in page["items"]] == [("a2", "b2"), ("a3", "b3")]
    assert page["first_difference"] == 0 and page["different"] == 2
    assert page["items"][0]["differs"] == [
        "gate_calls[0].args",
        "gate_calls[0].result",
        "observation",
    ]  # the same utterance and request: only the call and what it returned
    # A replay of a cast shares no turn with it: aligned from the roots, and the same.
    same = views.compare(q(a="entity-a", b="entity-r"))
    assert same["common"] == 0 and same["ancestor"] is None
    assert same["first_difference"] is None and same["different"] == 0
    assert [p["differs"] for p in same["items"]] == [[], [], []]
    # A turn id is a thread's leaf too; a shorter thread's missing turns are named.
    short = views.compare(q(a="a2", b="entity-b"))
    assert [p["differs"] for p in short["items"]][-1] == ["missing"]
    loom.close()


def test_a_long_pair_is_paged_and_the_first_difference_found_anywhere(
    loom_url: str,  # noqa: F811
) -> None:
    loom, views = pair_views(loom_url, turns=1000, differ_at=700)
    page = views.compare(q(a="entity-a", b="entity-b", limit=100))
    assert page["total"] == 999 and len(page["items"]) == 100
    assert page["first_difference"] == 698  # pair 699: turn 700 (turn 1 is shared)
    at = views.compare(q(a="entity-a", b="entity-b", offset=600, limit=100))
    marked = next(p for p in at["items"] if p["index"] == 698)
    assert (marked["a"]["id"], marked["b"]["id"]) == ("a700", "b700") and marked["differs"]
    assert all(not p["differs"] for p in at["items"] if p["index"] < 698)
    loom.close()


def test_bad_compare_requests_are_clear_errors() -> None:
    loom = build_pair(Loom())
    views = LoomViews(lambda: loom)
    with pytest.raises(ViewerError, match="name both threads") as missing:
        views.compare(q(a="entity-a"))
    assert missing.value.status == 400
    with pytest.raises(ViewerError, match="no turn or entity 'nope'") as unknown:
        views.compare(q(a="entity-a", b="nope"))
    assert unknown.value.status == 404


def test_compare_is_behind_the_token(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    build_pair(Loom.open(path)).close()
    token = "compare-token-0452"
    with (
        viewing(path, "--token", token) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        assert http.get("/api/compare?a=entity-a&b=entity-b").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        page = http.get("/api/compare?a=entity-a&b=entity-b", headers=auth).json()
        assert page["first_difference"] == 0
        assert http.get("/ui/compare.js").status_code == 200


def test_compare_in_the_browser_marks_the_first_difference_and_what_differs(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = tmp_path / "loom.db"
    build_pair(Loom.open(path), turns=4, differ_at=3).close()
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/#/e/entity-a/t/a1")  # a fork starts here: compare it
        page.locator("#turn .compare-link").click()
        expect(page).to_have_url(url + "/#/compare/entity-a/entity-b")
        pairs = page.locator(".pair[data-index]")
        expect(pairs).to_have_count(3)
        expect(page.locator("#compare-summary")).to_contain_text("1 turn shared")
        first = page.locator("#first-difference")
        expect(first).to_have_attribute("data-index", "1")  # a2 = b2; a3 and b3 differ
        expect(first).to_contain_text("first difference")
        expect(pairs.nth(0)).to_have_class("pair same")
        # The first difference opens: both turns, the differing sections marked.
        sides = page.locator("#compare-detail .compare-side")
        expect(sides).to_have_count(2)
        for side in ("a", "b"):
            panel = page.locator(f'.compare-side[data-side="{side}"]')
            expect(panel.locator('[data-field="gate_calls[0]"]')).to_have_class("call differs")
            expect(panel.locator('[data-field="observation"]')).to_have_class("differs")
            expect(panel.locator('[data-field="gate_calls[0].args"]')).to_have_class("args differs")
            expect(panel.locator('[data-field="utterance"]')).not_to_have_class("differs")
        expect(page.locator('.compare-side[data-side="b"]')).to_contain_text("LX999")
        _screenshot(page, "viewer-compare.png")
        pairs.nth(0).click()  # a pair that is the same: nothing marked
        expect(page.locator("#compare-detail .differs")).to_have_count(0)
        page.close()
    assert errors == []
