"""The loom viewer in a real browser: Debian's chromium, headless, driven by
Playwright (its own browser downloads are never used), against a ``cantrip
serve`` and a ``cantrip loom FILE view`` started here with scripted LLMs.

Screenshots and the measured timings go to ``test-artifacts/viewer/``
(``CANTRIP_TEST_ARTIFACTS`` moves it); .ci/run installs chromium.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from viewer_looms import SECRET, build

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
CHROMIUM = os.environ.get("CANTRIP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_TIMEOUT_MS = 15_000
"""How long a page action *and* an expectation may wait. Playwright's ``expect`` does
not follow the page's default timeout but has its own, 5 s: at load 10 on two cores the
live-session test's fork (a new session, its page, its first prompt) outlasted it."""
expect.set_options(timeout=PAGE_TIMEOUT_MS)

ARTIFACTS = (
    Path(os.environ.get("CANTRIP_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))
    / "viewer"
)

SPEC = """
[llm]
provider = "scripted"
script = "shared"  # one script for the session's prompts, in order
responses = [
  { content = "Booking it.", tool_calls = [{ gate = "echo", args = { text = "flight LX318 booked" } }, { gate = "nosuch", args = {} }], usage = { prompt_tokens = 50, completion_tokens = 5 } },
  { tool_calls = [{ gate = "done", args = { answer = "Your flight is booked." } }] },
  { content = "Let me think about this for a long while.", delay_ms = 120000 },
  { content = "A train, then.", tool_calls = [{ gate = "done", args = { answer = "Train booked." } }] },
]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 4 }]
[loom]
path = "loom.jsonl"
"""  # noqa: E501


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@contextmanager
def started(command: list[str], cwd: Path, marker: str) -> Iterator[str]:
    """A cantrip server process; yields the URL it prints, stops it afterwards."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert marker in line, line
        yield re.findall(r"http://\S+", line)[0].rstrip("/")
        process.terminate()
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def new_page(browser: Browser, errors: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1200, "height": 700})
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page


@contextmanager
def live_session(
    browser: Browser, tmp_path: Path, spec: str, errors: list[str]
) -> Iterator[tuple[str, Page]]:
    """``cantrip serve`` of ``spec`` and a page on it with a new live session, idle;
    yields the server's URL and the page."""
    (tmp_path / "spell.toml").write_text(spec)
    with started([CANTRIP, "serve", "spell.toml", "--port", "0"], tmp_path, "serving") as url:
        page = new_page(browser, errors)
        page.goto(url + "/")
        page.click("#new-session")
        expect(page.locator("#live-status")).to_have_text("idle")
        yield url, page


def test_watch_prompt_inspect_cancel_and_fork_a_live_session(
    browser: Browser, tmp_path: Path
) -> None:
    errors: list[str] = []
    with live_session(browser, tmp_path, SPEC, errors) as (url, page):
        entity = page.evaluate("location.hash").removeprefix("#/e/")

        # A prompt: its text streams into the live panel, its turns into the tree.
        page.fill("#prompt", f"Book a flight with key {SECRET}")
        page.click("#send")
        expect(page.locator("#live-stream")).to_contain_text("Booking it.")
        expect(page.locator("#live-stream")).to_contain_text("→ echo")
        expect(page.locator(".tree .row")).to_have_count(2)
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        assert SECRET not in page.content()
        expect(page.locator(".tree .row").first).to_contain_text("[REDACTED]")

        # Open a turn: its gate calls, arguments, results; the failed one in red.
        page.locator(".tree .row").first.click()
        echo = page.locator('#turn .call[data-gate="echo"]')
        expect(echo).to_contain_text("flight LX318 booked")
        failed = page.locator('#turn .call[data-gate="nosuch"]')
        expect(failed).to_have_class(re.compile(r"\berror\b"))
        expect(failed).to_contain_text("unknown gate")
        expect(page.locator("#turn .meta")).to_contain_text("50 prompt / 5 completion")
        page.screenshot(path=ARTIFACTS / "turn.png")

        # Cancel a running cast: the cut-off turn is recorded and shows up.
        page.fill("#prompt", "Think it over")
        page.click("#send")
        expect(page.locator("#live-status")).to_contain_text("thinking")
        expect(page.locator("#cancel")).to_be_enabled()
        page.click("#cancel")
        expect(page.locator("#live-result")).to_contain_text("done: cancelled")
        expect(page.locator("#live-status")).to_contain_text("recorded (cancelled)")
        expect(page.locator(".tree .row")).to_have_count(3)
        expect(page.locator(".tree .row").last.locator(".badge")).to_have_text("cancelled")
        page.screenshot(path=ARTIFACTS / "cancelled.png")

        # Fork from the first turn with a new intent: a new session continues there.
        page.locator(".tree .row").first.click()
        page.fill("#fork-intent", "Book a train instead")
        page.click("#fork")
        expect(page).not_to_have_url(re.compile(re.escape(entity)))
        expect(page.locator(".tree .row")).to_have_count(1)
        expect(page.locator(".tree .row")).to_contain_text("Book a train instead")
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        expect(page.locator(".entity-head")).to_contain_text("forked from")
        page.locator(".tree .row").first.click()
        expect(page.locator("#turn")).to_contain_text("Train booked.")

        # The thread reads as a chat: the original intent, then the fork's.
        page.click("#open-thread")
        transcript = page.locator("#transcript")
        expect(transcript.locator(".msg.user")).to_have_count(2)
        expect(transcript.locator(".msg.user").last).to_contain_text("Book a train instead")
        expect(transcript.locator(".msg.outcome")).to_contain_text("Train booked.")

        # The original entity's tree now holds the fork, nested under its turn.
        page.goto(f"{url}/#/e/{entity}")
        expect(page.locator(".tree .row")).to_have_count(4)
        expect(page.locator(".tree .row").nth(1).locator(".branch")).to_have_text("fork")
        page.locator(".tree .row").first.click()
        expect(page.locator('#turn .call[data-gate="echo"]')).to_be_visible()
        page.screenshot(path=ARTIFACTS / "viewer.png")
        page.goto(url + "/")
        expect(page.locator("tr.entity")).to_have_count(2)
        page.fill('input[type="search"]', "train")
        expect(page.locator("tr.entity")).to_have_count(1)
        page.screenshot(path=ARTIFACTS / "entities.png")
        page.close()
    assert errors == []


SLOW_SPEC = """
[llm]
provider = "scripted"
script = "shared"
responses = [
  { tool_calls = [{ gate = "done", args = { answer = "First done." } }] },
  { content = "Let me think about this for a long while.", delay_ms = 120000 },
]

[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 3 }]
"""


def test_a_cancel_clicked_before_the_prompts_answer_arrives_cuts_that_prompt_off(
    browser: Browser, tmp_path: Path
) -> None:
    """The Cancel button is live from the moment a prompt is sent, before its answer
    (and the ``Prompt-Id`` it carries) arrives. A click then named the page's previous
    prompt, long ended: nothing was cancelled and the cast ran on (under load the
    live-session test clicked in that window). The page names each prompt by a key of
    its own from the start, so the cancel is armed for that prompt and cuts it off."""
    errors: list[str] = []
    with live_session(browser, tmp_path, SLOW_SPEC, errors) as (_, page):
        page.fill("#prompt", "First")
        page.click("#send")
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        held: list[Any] = []  # the second prompt's request, held back

        def hold(route: Any) -> None:
            held.append(route)

        page.route("**/prompt?stream=1", hold)
        page.fill("#prompt", "Think it over")
        page.click("#send")
        expect(page.locator("#live-status")).to_have_text("sending…")
        deadline = time.monotonic() + 15
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)  # lets Playwright call the route handler
        assert len(held) == 1
        page.click("#cancel")
        expect(page.locator("#live-result")).to_have_text("cancel requested")
        held[0].continue_()
        expect(page.locator("#live-result")).to_contain_text("done: cancelled")
        page.close()
    assert errors == []


def test_a_fork_intent_typed_while_its_turn_is_fetched_again_is_kept(
    browser: Browser, tmp_path: Path
) -> None:
    """Clicking a turn fetches it and then replaces its panel: an intent typed into the
    fork box meanwhile went with the old panel, and Fork did nothing (an empty intent)
    -- the live-session test's failure under load, which clicks the turn that is already
    open and types at once. The panel of the same turn keeps what was typed."""
    errors: list[str] = []
    with live_session(browser, tmp_path, SLOW_SPEC, errors) as (_, page):
        page.fill("#prompt", "First")
        page.click("#send")
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        page.locator(".tree .row").first.click()
        expect(page.locator("#turn")).to_contain_text("First done.")
        held: list[Any] = []  # the turn's second fetch, held back

        def hold(route: Any) -> None:
            held.append(route)

        page.route("**/api/turns/*", hold)
        page.locator(".tree .row").first.click()
        deadline = time.monotonic() + 15
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)  # lets Playwright call the route handler
        assert len(held) == 1
        page.evaluate("document.querySelector('#fork-intent').dataset.old = '1'")
        page.fill("#fork-intent", "Try again")
        held[0].continue_()
        fresh = page.locator("#fork-intent:not([data-old])")
        expect(fresh).to_have_value("Try again")
        page.close()
    assert errors == []


def test_a_recorded_loom_reads_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    build(path, cut=True).close()
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/")
        expect(page.locator("#mode")).to_contain_text("read-only")
        expect(page.locator("#new-session")).to_have_count(0)
        expect(page.locator("tr.entity")).to_have_count(3)
        page.locator('tr.entity[data-entity="entity-a"]').click()
        rows = page.locator(".tree .row")
        expect(rows).to_have_count(10)
        expect(rows.nth(2).locator(".branch")).to_have_text("fork")
        expect(rows.nth(5).locator(".branch")).to_have_text("child")
        expect(rows.nth(4).locator(".badge").first).to_have_text("delegating")
        expect(page.locator("#prompt")).to_have_count(0)  # read-only: no live controls
        # Thinking is folded; a code medium's code is highlighted.
        rows.first.click()
        cut = page.locator("#turn .call .badge.cut")  # a result stored in part (max_record_chars)
        expect(cut).to_have_text("stored 1048576 of 30000000 characters")
        expect(cut).to_have_attribute("title", "sha256 " + "ab" * 32)
        expect(page.locator("#turn details")).to_contain_text("thinking")
        expect(page.locator("#turn details")).not_to_have_attribute("open", "")
        expect(page.locator("#fork")).to_have_count(0)
        rows.nth(5).click()
        code = page.locator("#turn pre.code")
        expect(code.locator(".com")).to_have_text("# add them")
        expect(code.locator(".kw").first).to_have_text("for")
        expect(code.locator(".str")).to_have_text("'sum'")
        expect(page.locator("#turn .meta")).to_contain_text("cost unknown")
        page.screenshot(path=ARTIFACTS / "code-turn.png")
        page.goto(url + "/#/thread/turn-f2")
        expect(page.locator("#transcript .msg.tool.error")).to_contain_text("unknown gate")
        assert SECRET not in page.content()
        page.close()
    assert errors == []


def test_the_token_leaves_the_address_bar_and_history(browser: Browser, tmp_path: Path) -> None:
    """Issue 28.4: the page takes ``?token=`` once, then takes it out of the address (and
    so out of history, bookmarks and any Referer); the tab keeps it in sessionStorage."""
    path = tmp_path / "loom.jsonl"
    build(path).close()
    token = "view-token-5150-abcdef"
    errors: list[str] = []
    command = [CANTRIP, "loom", str(path), "view", "--token", token]
    with started(command, tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        response = page.goto(f"{url}/?token={token}#/e/entity-a")
        assert response is not None and response.headers["referrer-policy"] == "no-referrer"
        expect(page.locator(".tree .row")).to_have_count(10)  # the API calls carry it
        assert token not in page.url and page.url.endswith("/#/e/entity-a")
        assert token not in page.evaluate("history.state ? JSON.stringify(history.state) : ''")
        page.reload()  # the same tab: the token is still known, not in the address
        expect(page.locator(".tree .row")).to_have_count(10)
        assert token not in page.url
        page.close()
    assert errors == []


def test_a_ten_thousand_turn_loom_opens_and_scrolls(browser: Browser, tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    build(path, turns=10_000).close()
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        began = time.perf_counter()
        page.goto(f"{url}/#/e/entity-a")
        expect(page.locator(".tree .row").first).to_contain_text("#1")
        expect(page.locator(".tree .row").nth(20)).to_be_attached()
        for _ in range(250):  # the mark is set on the frame after the rows were built
            if page.evaluate("performance.getEntriesByName('cantrip-tree-painted').length"):
                break
            page.wait_for_timeout(20)
        wall_first_rows = time.perf_counter() - began
        timings: dict[str, Any] = page.evaluate(
            """() => ({
              tree_painted_ms: performance.getEntriesByName('cantrip-tree-painted')[0].startTime,
              first_contentful_paint_ms:
                (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime,
              rows_in_dom: document.querySelectorAll('.tree .row').length,
              spacer_px: document.querySelector('.tree .spacer').offsetHeight,
            })"""
        )
        assert timings["rows_in_dom"] < 120  # virtualised: the rows on screen, not 10,004
        assert timings["spacer_px"] == 10_004 * 26

        # Jump to the end and back to the middle: each lands within a page fetch.
        began = time.perf_counter()
        page.evaluate("document.querySelector('.tree').scrollTop = 1e9")
        expect(page.locator('.tree .row[data-turn="turn-a10000"]')).to_be_visible()
        scroll_end_s = time.perf_counter() - began
        began = time.perf_counter()
        page.evaluate("document.querySelector('.tree').scrollTop = 5000 * 26")
        expect(page.locator('.tree .row[data-turn="turn-a4997"]')).to_be_attached()
        scroll_middle_s = time.perf_counter() - began
        assert page.locator(".tree .row").count() < 120
        page.locator('.tree .row[data-turn="turn-a4997"]').click()
        expect(page.locator("#turn")).to_contain_text("Working on step 4997.")
        page.screenshot(path=ARTIFACTS / "ten-thousand.png")
        page.close()
    timings.update(
        wall_to_first_rows_s=round(wall_first_rows, 3),
        scroll_to_end_s=round(scroll_end_s, 3),
        scroll_to_middle_s=round(scroll_middle_s, 3),
        turns=len(build_turn_count(path)),
    )
    (ARTIFACTS / "timings.json").write_text(json.dumps(timings, indent=2))
    print("viewer timings (10,004-turn loom):", json.dumps(timings))
    assert errors == []


def build_turn_count(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if '"type":"turn"' in line]


STEER_SPEC = """
[llm]
provider = "scripted"
responses = [
  { content = "Working.", delay_ms = 2500, tool_calls = [{ gate = "echo", args = { text = "step one" } }] },
  { content = "Done.", delay_ms = 1500, tool_calls = [{ gate = "done", args = { answer = "finished" } }] },
]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 4 }]
[loom]
path = "loom.jsonl"
"""  # noqa: E501


def test_a_message_typed_while_a_cast_runs_joins_its_next_turn(
    browser: Browser, tmp_path: Path
) -> None:
    errors: list[str] = []
    with live_session(browser, tmp_path, STEER_SPEC, errors) as (_, page):
        page.fill("#prompt", "Do the work")
        page.click("#send")
        expect(page.locator("#send")).to_have_text("Send to the running cast")
        page.fill("#prompt", "Please use metric units")
        page.click("#send")
        expect(page.locator("#live-status")).to_contain_text("joins the next turn")
        expect(page.locator("#live-result")).to_contain_text("done: end_turn")
        expect(page.locator("#send")).to_have_text("Send")
        expect(page.locator(".tree .row")).to_have_count(2)
        page.locator(".tree .row").last.click()
        expect(page.locator("#steering")).to_contain_text("Please use metric units")
        page.screenshot(path=ARTIFACTS / "steering.png")
        page.close()
    assert errors == []


def test_the_viewer_lists_eval_runs_and_links_their_cases(browser: Browser, tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    done = subprocess.run(
        [CANTRIP, "eval", str(examples / "evals" / "hello.yaml"), "--replay", "--loom",
         "evals.db", "--json", "report.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = json.loads((tmp_path / "report.json").read_text())["run_id"]
    errors: list[str] = []
    with started([CANTRIP, "loom", "evals.db", "view", "--port", "0"], tmp_path, "http") as url:
        page = new_page(browser, errors)
        page.goto(url + "/")
        runs = page.locator("#eval-runs")
        expect(runs).to_be_visible()
        runs.select_option(run_id)
        expect(page.locator("tr.entity")).to_have_count(2)
        expect(page.locator("tr.entity .badge.eval")).to_have_count(2)
        expect(page.locator("tr.entity").first).to_contain_text("greets")
        page.locator("tr.entity").first.click()
        expect(page.locator(".tree .row")).to_have_count(2)
        page.screenshot(path=ARTIFACTS / "eval-runs.png")
        page.close()
    assert errors == []
