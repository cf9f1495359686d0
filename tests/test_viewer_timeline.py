"""The viewer's timeline of a cast (``/api/entities/{id}/timeline``) and the tree's
branches, on SQLite and PostgreSQL looms; the page is driven in a real browser in
test_viewer_timeline_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_viewer_api import viewing
from timeline_looms import KID_TURN_MS, WAIT_MS, build_cast

from cantrip.loom import EntityRecord, Loom, Turn, TurnMetadata
from cantrip.protocols.viewer._api import LoomViews, ViewerError
from cantrip.protocols.viewer._timeline import SEVERITY

FINE = {"px": ["0.001"]}


@pytest.fixture(params=["sqlite", "postgresql"])
def loom_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a loom is kept: an SQLite file, or a PostgreSQL database of its own."""
    if request.param == "sqlite":
        yield str(tmp_path / "loom.db")
    else:
        yield request.getfixturevalue("pg_url")


def cast_views(url: str, **shape: Any) -> tuple[Loom, LoomViews]:
    """The cast written (and committed: a PostgreSQL loom queues its writes) and read
    back as the viewer reads a loom another process wrote."""
    loom = build_cast(Loom.open(url), **shape)
    if url != ":memory:":
        loom.close()
        loom = Loom.open(url)
    return loom, LoomViews(lambda: loom)


def bars_of(page: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {row["entity_id"]: row["bars"] for row in page["items"]}


def test_a_row_per_entity_under_the_parent_that_spawned_it_and_a_bar_per_turn(
    loom_url: str,
) -> None:
    loom, views = cast_views(loom_url)
    page = views.timeline("entity-root", FINE)
    rows = [(r["entity_id"], r["depth"], r["spawned_from"]) for r in page["items"]]
    assert rows == [
        ("entity-root", 0, None),
        ("entity-kid1", 1, "turn-r2"),
        ("entity-kid2", 1, "turn-r4"),
        ("entity-kid3", 1, "turn-r6"),
        ("entity-kid4", 1, "turn-r8"),
    ]  # the fork is not spawned by the cast: not a row of it
    bars = bars_of(page)
    assert [r["turns"] for r in page["items"]] == [17, 2, 1, 1, 1]  # every store kept them all
    for row in page["items"]:
        turns = loom.entity_turns(row["entity_id"])
        assert [b["id"] for b in bars[row["entity_id"]]] == [t.id for t in turns]
        assert all(b["turns"] == 1 for b in bars[row["entity_id"]])
        assert row["turns"] == len(turns)
    root = page["items"][0]
    assert root["tokens"] == sum(b["tokens"] for b in bars["entity-root"])
    assert root["cost_usd"] == pytest.approx(sum(b["cost_usd"] for b in bars["entity-root"]))
    # a child starts when the call that started it did: after its parent's checkpoint
    checkpoint = next(b for b in bars["entity-root"] if b["id"] == "turn-r2")
    assert bars["entity-kid1"][0]["start_ms"] == pytest.approx(checkpoint["end_ms"])
    assert page["span_ms"] == pytest.approx(max(b["end_ms"] for b in bars["entity-root"]))
    # paged by rows, like every list
    second = views.timeline("entity-root", {**FINE, "offset": ["3"], "limit": ["1"]})
    assert second["total"] == 5 and [r["entity_id"] for r in second["items"]] == ["entity-kid3"]
    loom.close()


def test_a_turn_is_split_into_model_gate_and_waiting_for_a_human() -> None:
    _, views = cast_views(":memory:")
    bars = {b["id"]: b for b in bars_of(views.timeline("entity-root", FINE))["entity-root"]}
    plain = bars["turn-r1"]
    assert (plain["model_ms"], plain["gate_ms"], plain["wait_ms"]) == (400.0, 100.0, 0.0)
    # A delegation's continuation is stamped with its checkpoint's start: its bar starts
    # where the checkpoint ended and is all gate time (the child ran in there).
    checkpoint, continued = bars["turn-r2"], bars["turn-r2c"]
    assert checkpoint["model_ms"] == 400.0 and checkpoint["status"] == "delegating"
    assert continued["start_ms"] == pytest.approx(checkpoint["end_ms"])
    assert continued["model_ms"] == 0.0
    assert continued["gate_ms"] == pytest.approx(2 * KID_TURN_MS)
    # After a pause, the time until the answer is waiting for a human.
    paused, answered = bars["turn-r3"], bars["turn-r3c"]
    assert paused["status"] == "paused"
    assert answered["start_ms"] == pytest.approx(paused["end_ms"])
    assert answered["wait_ms"] == pytest.approx(WAIT_MS)
    assert (answered["model_ms"], answered["gate_ms"]) == (0.0, 100.0)


def test_cut_off_failed_cancelled_and_paused_turns_say_so_and_a_cut_turn_costs_unknown(
    loom_url: str,
) -> None:
    loom, views = cast_views(loom_url)
    page = views.timeline("entity-root", FINE)
    last = {row["entity_id"]: row["bars"][-1] for row in page["items"]}
    assert {k: b["status"] for k, b in last.items()} == {
        "entity-root": "terminated",
        "entity-kid1": "terminated",
        "entity-kid2": "truncated",
        "entity-kid3": "failed",
        "entity-kid4": "cancelled",
    }
    assert last["entity-kid2"]["reason"] == "max_turns"
    # The cut-off turn recorded no usage: its cost is unknown, never $0 -- on the
    # timeline, in the tree, in the turn's detail and in its row's total.
    assert last["entity-kid2"]["cost_usd"] is None
    assert views.turn("turn-kid2-1")["cost"] is None
    row = next(r for r in views.tree("entity-root", {})["items"] if r["id"] == "turn-kid2-1")
    assert row["cost_usd"] is None and row["status"] == "truncated"
    kid2 = next(r for r in page["items"] if r["entity_id"] == "entity-kid2")
    assert kid2["cost_usd"] is None and kid2["status"] == "truncated"
    assert views.turn("turn-r1")["cost"] == pytest.approx(0.002)
    # A paused checkpoint reads "paused" everywhere (it read "delegating").
    assert views.turn("turn-r3")["status"] == "paused"
    loom.close()


def test_narrow_turns_come_as_groups_and_a_window_holds_only_its_turns(loom_url: str) -> None:
    """A 1,000-turn cast with 50 children over a 200-pixel track: each row sends at most
    a few items a pixel, each group counts its turns and keeps its worst status, and a
    window (zoomed in) sends only the turns inside it, one bar each."""
    loom, views = cast_views(loom_url, turns=1000, children=50)
    page = views.timeline("entity-root", {"width": ["200"]})  # a 200-pixel track
    assert page["total"] == 51
    root = page["items"][0]
    sent = root["bars"]
    assert len(sent) < root["turns"] / 2  # grouped ...
    assert len(sent) <= 2 * 200 + 1  # ... at most two items a pixel
    assert sum(b["turns"] for b in sent) == root["turns"]  # ... and none lost
    groups = [b for b in sent if b["turns"] > 1]
    assert groups and all(sum(g["statuses"].values()) == g["turns"] for g in groups)
    for group in groups:  # the worst of the group shows
        assert group["status"] == max(group["statuses"], key=SEVERITY.index)
    assert any(g["status"] == "delegating" for g in groups)
    for bar in sent:
        assert bar["end_ms"] - bar["start_ms"] <= page["px"] or bar["turns"] == 1
    # Zoomed in on one second in the middle: only the turns that overlap it, one bar each.
    middle = page["span_ms"] / 2
    zoomed = views.timeline(
        "entity-root", {"from": [str(middle)], "to": [str(middle + 1000)], "px": ["1"]}
    )
    inside = zoomed["items"][0]["bars"]
    assert 1 <= len(inside) <= 5 and all(b["turns"] == 1 for b in inside)
    assert all(b["end_ms"] >= middle and b["start_ms"] <= middle + 1000 for b in inside)
    expected = [
        t.id
        for t, (start, end) in _spans(loom, views, "entity-root")
        if end >= middle and start <= middle + 1000
    ]
    assert [b["id"] for b in inside] == expected
    loom.close()


def _spans(loom: Loom, views: LoomViews, entity_id: str) -> list[tuple[Turn, tuple[float, float]]]:
    fine = views.timeline(entity_id, FINE)["items"][0]["bars"]
    by_id = {t.id: t for t in loom.entity_turns(entity_id)}
    return [(by_id[b["id"]], (b["start_ms"], b["end_ms"])) for b in fine]


def test_bad_timeline_queries_are_clear_errors() -> None:
    _, views = cast_views(":memory:")
    for params, status in (
        ({"from": ["soon"]}, 400),
        ({"px": ["0"]}, 400),
        ({"width": ["-3"]}, 400),
        ({"to": ["nan"]}, 400),
        ({"offset": ["-1"]}, 400),
    ):
        with pytest.raises(ViewerError) as caught:
            views.timeline("entity-root", params)
        assert caught.value.status == status, params
    with pytest.raises(ViewerError, match="no entity 'entity-zz'") as missing:
        views.timeline("entity-zz", {})
    assert missing.value.status == 404


def test_the_timeline_grows_as_turns_land() -> None:
    loom, views = cast_views(":memory:")
    before = bars_of(views.timeline("entity-root", FINE))["entity-kid1"]
    stamp = "2026-03-01T11:00:00+00:00"
    loom.append(
        Turn(
            "turn-kid1-3", "turn-kid1-2", "entity-kid1", 3, utterance="later",
            metadata=TurnMetadata(duration_ms=10.0, timestamp=stamp),
        )
    )  # fmt: skip
    page = views.timeline("entity-root", FINE)
    after = bars_of(page)["entity-kid1"]
    assert sum(b["turns"] for b in after) == len(before) + 1 == 3
    assert after[-1]["id"] == "turn-kid1-3" and after[-1]["turns"] == 1
    assert page["span_ms"] > 3_590_000  # an hour later: the axis grew with it


def test_a_rolled_back_branch_is_drawn_after_the_turn_it_left_and_the_thread_goes_on() -> None:
    """Issue 45.4: a rewound entity (double-texting's rollback) has two children of its
    own at one turn. The thread goes on through the newer one; the branch it was rewound
    from is drawn right after the turn it branched from, one level deeper, marked
    ``rollback`` -- it was drawn at the thread's own depth, below the new thread, which
    was nested as if it were the branch."""
    loom = Loom()
    loom.register_entity(EntityRecord("entity-e", "spell"))

    def turn(tid: str, parent: str | None, seq: int, **fields: Any) -> None:
        loom.append(Turn(tid, parent, "entity-e", seq, utterance=tid, **fields))

    turn("t1", None, 1, intent="first")
    turn("t2", "t1", 2, intent="second", truncated=True, reason="interrupted")
    turn("t3", "t1", 3, intent="third")  # rolled back to t1, then the new prompt
    turn("t4", "t3", 4, terminated=True, reason="done")
    views = LoomViews(lambda: loom)
    rows = [(r["id"], r["depth"], r["branch"]) for r in views.tree("entity-e", {})["items"]]
    assert rows == [
        ("t1", 0, None),
        ("t2", 1, "rollback"),
        ("t3", 0, None),
        ("t4", 0, None),
    ]
    branches = {b["id"]: b["branch"] for b in views.turn("t1")["branches"]}
    assert branches == {"t2": "rollback", "t3": "next"}


def test_no_branch_is_ever_drawn_above_the_turn_it_branched_from() -> None:
    """Every row's parent turn, where it is in the tree, is drawn before it -- with
    children, forks, a pause and cut-offs in the loom."""
    _, views = cast_views(":memory:", turns=40, children=6)
    items = views.tree("entity-root", {"limit": ["500"]})["items"]
    position = {r["id"]: i for i, r in enumerate(items)}
    assert len(position) == len(items)
    for index, row in enumerate(items):
        if row["parent_id"] in position:
            assert position[row["parent_id"]] < index, row["id"]
        if row["branch"]:
            assert items[index - 1]["id"] == row["parent_id"] or row["depth"] > 0


def test_the_timeline_route_is_behind_the_token_on_sqlite_and_postgresql(loom_url: str) -> None:
    build_cast(Loom.open(loom_url)).close()
    token = "timeline-token-0451"
    with (
        viewing(loom_url, "--token", token) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        refused = http.get("/api/entities/entity-root/timeline")
        assert refused.status_code == 401
        assert http.get(f"/api/entities/entity-root/timeline?token={token}").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        page = http.get("/api/entities/entity-root/timeline", headers=auth).json()
        assert [r["entity_id"] for r in page["items"]][:2] == ["entity-root", "entity-kid1"]
        assert http.get("/ui/timeline.js").status_code == 200  # code, no loom data
        missing = http.get("/api/entities/entity-zz/timeline", headers=auth)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_entity"


def test_an_entity_without_turns_has_an_empty_timeline() -> None:
    loom = Loom()
    loom.register_entity(EntityRecord("entity-new", "spell"))
    page = LoomViews(lambda: loom).timeline("entity-new", {})
    assert page["origin"] is None and page["span_ms"] == 0.0
    assert [(r["entity_id"], r["turns"], r["status"], r["bars"]) for r in page["items"]] == [
        ("entity-new", 0, "new", [])
    ]
