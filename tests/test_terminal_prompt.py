"""The terminal as a person sees it: `cantrip cast` under a real pseudo-terminal.

The approval prompt, the live status line and what a wait shows are drawn only
when stderr is a terminal, so these tests run the command in a pty (pexpect) and
read what the terminal received (issue 30, items 6 and 7).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pexpect

import cantrip

ROOT = Path(__file__).resolve().parents[1]

APPROVING_SPEC = """
[llm]
provider = "scripted"
latency_ms = 300
responses = [
  {tool_calls = [{gate = "echo", args = {text = "risky"}}]},
  {tool_calls = [{gate = "done", args = {answer = "finished"}}]},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{max_turns = 4}]
approve = ["ech*"]

[loom]
path = "loom.db"
"""


def spawn(tmp_path: Path, spec_text: str, *args: str) -> pexpect.spawn:
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "COLUMNS": "160",
        "LINES": "40",
    }
    env.pop("NO_COLOR", None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "cantrip", "cast", str(spec), *args],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 160),
    )


def test_the_approval_prompt_is_legible_and_stays_put(tmp_path: Path) -> None:
    child = spawn(tmp_path, APPROVING_SPEC, "go")
    child.expect("approval needed")
    # The menu arrives whole: its brackets are not eaten as markup.
    child.expect_exact("[y]es / [n]o / [a]lways for this gate / [e]dit the arguments>")
    # While the human reads it, nothing is drawn over it: the live status line
    # (which redraws 8 times a second) is held until the answer.
    child.expect(pexpect.TIMEOUT, timeout=1.5)
    assert "gate call(s)" not in child.before, child.before
    # `e` says what it does and shows what is being edited.
    child.sendline("e")
    child.expect("editing the arguments of echo")
    child.expect_exact('{"text": "risky"}')
    child.expect_exact("new arguments (JSON)>")
    child.sendline('{"text": "safe"}')
    # An edit is a new call, judged by the approval policy again: asked once more.
    child.expect_exact('"text": "safe"')
    child.expect_exact("[e]dit the arguments>")
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    loom = cantrip.Loom.open(tmp_path / "loom.db")
    echoed = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
    assert echoed[-1].result == "safe"
    # The edited call ran (the second pause approved it), the original never did.
    assert echoed[-1].detail["approval"]["decision"] == "approve"
    assert [r.result for r in echoed if r.status == "ok"] == ["safe"]
    loom.close()


def test_an_empty_edit_goes_back_to_the_choices(tmp_path: Path) -> None:
    child = spawn(tmp_path, APPROVING_SPEC, "go")
    child.expect_exact("[e]dit the arguments>")
    child.sendline("e")
    child.expect_exact("new arguments (JSON)>")
    child.sendline("")
    child.expect_exact("[e]dit the arguments>")
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_wait_for_the_provider_says_what_it_waits_for(tmp_path: Path) -> None:
    port = _closed_port()  # nothing listens there once the socket is closed
    spec = f"""
[llm]
provider = "ollama"
model = "llama3.1:8b"
base_url = "http://127.0.0.1:{port}/v1"

[circle]
medium = "conversation"
gates = ["done"]
wards = [{{max_turns = 10}}]

[loom]
path = "loom.db"
"""
    child = spawn(tmp_path, spec, "hi")
    child.expect_exact(f"waiting for ollama llama3.1:8b at http://127.0.0.1:{port}/v1")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert f"cannot connect to http://127.0.0.1:{port}/v1" in child.before
    assert "is the server running?" in child.before
    # One turn records the failure; the turn budget is not spent on observations of it.
    loom = cantrip.Loom.open(tmp_path / "loom.db")
    assert [(t.reason, t.truncated) for t in loom.turns] == [("llm_error", True)]
    loom.close()
