"""Loom exports (turn JSONL, chat format), redaction at every exit, the loom CLI."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import gates
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, Ward, _redact, max_turns
from cantrip._chat_export import chat_conversation, export_chat
from cantrip.cli._grammar import add_loom_parser
from cantrip.cli._loom import resolve_ref, run_loom
from cantrip.loom import export_jsonl, export_thread_jsonl, load_jsonl
from gates.fixtures import fixture_gate
from mediums.js import JsMedium

ROOT = Path(__file__).resolve().parents[1]

SECRETS = {
    "openai": "sk-proj-FAKEopenaiKey000000000000",
    "anthropic": "sk-ant-api03-FAKEanthropicKey00000000",
    "openrouter": "sk-or-v1-FAKEopenrouterKey000000000",
    "google": "AIzaFAKEgoogleKey000000000000000000",
    "github": "ghp_FAKE0000000000githubToken0000",
    "github_pat": "github_pat_FAKE00000000000000000000000",
    "aws": "AKIAFAKE0000TEST1234",
    "slack": "xoxb-FAKE0000-slackToken",
    "bearer": "Bearer fakeBearerValue.0123456789abcdef",
    "api_key": "api_key=notARealKey987654",
    "password": "password: hunter2-not-real",
}
"""One credential of each shape the redactor knows (Decisions, own 8)."""

ENV_SECRET = "plain-looking-env-value-4711"
"""No known shape: only redacted because an environment variable holds it."""


def echo_call(text: str, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"gate": "echo", "args": {"text": text}}
    if call_id:
        call["id"] = call_id
    return {"tool_calls": [call]}


def done_call(answer: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": "done", "args": {"answer": answer}}]}


def spell_with(script: Sequence[dict[str, Any]], loom: Loom | None = None, **kw: Any) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="You are careful."),
        circle=Circle(
            [gates.done, gates.echo, *kw.pop("extra", ())],
            [max_turns(kw.pop("turns", 8)), *kw.pop("wards", ())],
        ),
        loom=loom if loom is not None else Loom(),
        **kw,
    )


def all_secrets() -> list[str]:
    return [*SECRETS.values(), ENV_SECRET]


@pytest.fixture
def env_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("LOOM_TEST_SERVICE_TOKEN", ENV_SECRET)
    monkeypatch.setattr(_redact, "KEY_ENV_VARS", {*_redact.KEY_ENV_VARS, "LOOM_TEST_SERVICE_TOKEN"})
    return ENV_SECRET


async def leaky_cast(loom: Loom | None = None) -> Cantrip:
    """A cast whose gate results, arguments and answer all carry credentials."""
    script = [echo_call(f"{name} {value}") for name, value in SECRETS.items()]
    script.append(echo_call(f"env {ENV_SECRET}"))
    script.append(done_call(f"done with {SECRETS['aws']}"))
    spell = spell_with(script, loom, turns=len(script))
    outcome = await spell.cast_async(f"Audit {SECRETS['openai']}")
    assert outcome.terminated
    return spell


# -- exports -------------------------------------------------------------------------


async def test_export_round_trip_gives_the_same_turns() -> None:
    spell = spell_with([echo_call("one"), echo_call("two"), done_call({"n": [1, 2]})])
    outcome = await spell.cast_async("Count")
    spell.loom.annotate_reward(outcome.turns[-1].id, 0.75)
    text = export_jsonl(spell.loom)
    loaded = load_jsonl(text)
    assert [e.turn for e in loaded] == list(spell.loom.turns)
    assert [e.reward for e in loaded] == [None, None, 0.75]
    # and the file form, and a second export of what was read, agree
    again = Loom()
    for record in spell.loom.entities.values():
        again.register_entity(record)
    for exported in loaded:
        again.append(exported.turn)
        if exported.reward is not None:
            again.annotate_reward(exported.turn.id, exported.reward)
    assert export_jsonl(again) == text


async def test_load_jsonl_reads_files_and_names_bad_lines(tmp_path: Path) -> None:
    spell = spell_with([done_call("ok")])
    await spell.cast_async("Go")
    path = tmp_path / "turns.jsonl"
    path.write_text(export_jsonl(spell.loom), encoding="utf-8")
    assert [e.turn for e in load_jsonl(path)] == list(spell.loom.turns)
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(export_jsonl(spell.loom) + '{"no": "turn"}\n')


async def test_thread_export_holds_the_shared_prefix_of_a_fork() -> None:
    spell = spell_with([echo_call("root"), echo_call("main line"), done_call("main")])
    original = await spell.cast_async("Branch")
    forked = await spell.fork_async(
        original.turns[0], "Other way", llm=ScriptedLLM([done_call("side")])
    )
    thread = [e.turn for e in load_jsonl(export_thread_jsonl(spell.loom, forked.turns[-1].id))]
    assert [t.id for t in thread] == [original.turns[0].id, forked.turns[-1].id]
    assert thread[0].parent_id is None and thread[1].parent_id == original.turns[0].id


async def test_chat_export_has_the_openai_fine_tuning_shape() -> None:
    blob = fixture_gate("blob", result="x" * 500).with_options(ephemeral=True)
    script = [
        {
            "content": "Looking.",
            "tool_calls": [
                {"gate": "echo", "args": {"text": "a"}, "id": "c1"},
                {"gate": "blob", "args": {}, "id": "c2"},
            ],
        },
        done_call("finished"),
    ]
    spell = spell_with(script, extra=[blob])
    outcome = await spell.cast_async("Do the thing")
    spell.loom.annotate_reward(outcome.turns[-1].id, 1.0)
    lines = export_chat(spell.loom).splitlines()
    assert len(lines) == 1, "one conversation per thread"
    example = json.loads(lines[0])
    messages = example["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert messages[0] == {"role": "system", "content": "You are careful."}
    assert messages[1] == {"role": "user", "content": "Do the thing"}
    assistant = messages[2]
    assert assistant["content"] == "Looking."
    assert assistant["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "echo", "arguments": '{"text": "a"}'},
    }
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "a"}
    assert messages[4] == {"role": "tool", "tool_call_id": "c2", "content": "[ephemeral:blob]"}
    done_call_id = messages[5]["tool_calls"][0]["id"]
    assert messages[6]["tool_call_id"] == done_call_id
    meta = example["metadata"]
    assert meta["terminated"] is True and meta["truncated"] is False
    assert meta["reason"] == "done" and meta["result"] == "finished"
    assert meta["reward"] == 1.0
    assert meta["turn_rewards"] == [{"turn_id": outcome.turns[-1].id, "sequence": 2, "reward": 1.0}]
    bare = json.loads(export_chat(spell.loom, metadata=False, tools=spell.circle.tools()))
    assert set(bare) == {"messages", "tools"}
    assert bare["tools"][0]["type"] == "function"
    assert bare["tools"][0]["function"]["name"] == "done"


async def test_chat_export_marks_truncated_threads_and_children_separately() -> None:
    child = ScriptedLLM([done_call("child says hi")])
    script = [
        {"tool_calls": [{"gate": "call_agent", "args": {"intent": "greet"}}]},
        echo_call("again"),
    ]
    spell = spell_with(
        script,
        extra=[gates.call_agent],
        wards=[Ward("max_depth", 1), max_turns(2)],
        llms={"child_llm": child},
    )
    outcome = await spell.cast_async("Delegate")
    assert outcome.truncated
    examples = [json.loads(line) for line in export_chat(spell.loom).splitlines()]
    assert len(examples) == 2
    by_entity = {e["metadata"]["entity_id"]: e for e in examples}
    parent = by_entity[outcome.entity_id]
    assert parent["metadata"]["truncated"] is True
    assert parent["metadata"]["reason"] == "max_turns"
    roles = [m["role"] for m in parent["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert parent["messages"][3]["content"] == "child says hi", "the delegation is one turn"
    (child_example,) = [e for k, e in by_entity.items() if k != outcome.entity_id]
    roles = [m["role"] for m in child_example["messages"]]
    assert roles == ["system", "user", "assistant", "tool"], "a child's own conversation"
    assert child_example["messages"][1]["content"] == "greet"
    assert "Delegate" not in json.dumps(child_example), "not its parent's turns"


async def test_chat_export_of_a_code_medium() -> None:
    spell = Cantrip(
        llm=ScriptedLLM([{"code": "var a = 2;"}, {"code": "done(a * 21);"}]),
        identity=Identity(),
        circle=Circle([gates.done], [max_turns(4)], JsMedium()),
    )
    outcome = await spell.cast_async("Compute")
    example = chat_conversation(spell.loom, outcome.turns[-1].id)
    messages = example["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "js",
        "arguments": '{"code": "var a = 2;"}',
    }
    assert "done" in messages[4]["content"] and "42" in messages[4]["content"]


# -- redaction -------------------------------------------------------------------------


async def test_every_secret_shape_is_redacted_from_exports(env_secret: str) -> None:
    spell = await leaky_cast()
    raw_turns = json.dumps([t.to_dict() for t in spell.loom.turns])
    for secret in all_secrets():
        assert secret in raw_turns or secret.split()[-1] in raw_turns, "the loom keeps raw data"
    exports = {
        "jsonl": export_jsonl(spell.loom),
        "chat": export_chat(spell.loom),
        "thread": export_thread_jsonl(spell.loom, spell.loom.leaves()[0].id),
    }
    for kind, text in exports.items():
        for name, secret in [*SECRETS.items(), ("env", env_secret)]:
            value = secret.split("=")[-1].split(": ")[-1].removeprefix("Bearer ")
            assert value not in text, f"{name} leaked into the {kind} export"
        assert "[REDACTED]" in text
    raw = export_jsonl(spell.loom, redaction="none")
    assert SECRETS["github"] in raw and env_secret in raw, "raw export is the explicit opt-in"
    with pytest.raises(ValueError):
        export_jsonl(spell.loom, redaction="partial")  # type: ignore[arg-type]


async def test_logs_never_carry_secrets(env_secret: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await leaky_cast()
    assert any("turn 1" in r.getMessage() for r in caplog.records), "turns were logged"
    log = _redact.get_logger("cantrip.test")
    try:
        raise RuntimeError(f"failed with {SECRETS['anthropic']} and {env_secret}")
    except RuntimeError:
        log.exception("request failed for %s", SECRETS["slack"])
    handler = logging.StreamHandler()
    text = "\n".join(handler.format(r) for r in caplog.records)
    for secret in all_secrets():
        value = secret.split("=")[-1].split(": ")[-1].removeprefix("Bearer ")
        assert value not in text, f"{secret} reached a log line"
    assert "RuntimeError: failed with [REDACTED]" in text, "the traceback is kept, redacted"


# -- the loom CLI ---------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cantrip")
    add_loom_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["loom", *argv])


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_loom(parse(*argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def loom_file(tmp_path: Path) -> Path:
    """A SQLite loom with one finished cast (the CLI tests are synchronous, as the CLI is)."""
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    spell = spell_with(
        [
            {**echo_call("first"), "usage": {"prompt_tokens": 30, "completion_tokens": 5}},
            {**echo_call("second"), "usage": {"prompt_tokens": 40, "completion_tokens": 6}},
            done_call("all done"),
        ],
        loom,
    )
    trio.run(spell.cast_async, "Walk the list")
    loom.close()
    return path


SPEC = """
[llm]
responses = [{ tool_calls = [{ gate = "done", args = { answer = "from the fork" } }] }]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 3 }]
"""


def test_cli_list_and_show(loom_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, str(loom_file), "list")
    assert code == 0
    assert "entities (1)" in out and "threads (1)" in out
    assert "3 turn(s)  terminated (done)  tokens 70+11" in out
    code, out, _ = cli(capsys, str(loom_file), "list", "--json")
    listing = json.loads(out)
    assert listing["threads"][0]["tokens"] == {"prompt": 70, "completion": 11, "cached": 0}
    entity = listing["entities"][0]["entity_id"]
    code, out, _ = cli(capsys, str(loom_file), "show", "#1")
    assert code == 0
    assert out.count("-- turn ") == 3
    assert 'echo({"text": "first"}) -> first' in out
    assert "tokens 30 prompt / 5 completion / 0 cached" in out
    assert "terminated (done): all done" in out
    code, out, _ = cli(capsys, str(loom_file), "show", f"{entity}:2")
    assert out.count("-- turn ") == 2, "the thread from the root to that turn"
    code, _, err = cli(capsys, str(loom_file), "show", "#9")
    assert code == 1 and "1 thread" in err
    code, _, err = cli(capsys, str(tmp_missing := loom_file.with_name("nope.db")), "list")
    assert code == 1 and str(tmp_missing) in err and not tmp_missing.exists()


def test_cli_reward_and_export(loom_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, str(loom_file), "reward", "#1", "0.5")
    assert code == 0 and "0.5" in out
    code, out, _ = cli(capsys, str(loom_file), "export")
    turns = load_jsonl(out)
    assert len(turns) == 3 and turns[-1].reward == 0.5, "the reward reached the file"
    code, out, _ = cli(capsys, str(loom_file), "export", "--format", "chat")
    (example,) = [json.loads(line) for line in out.splitlines()]
    assert example["metadata"]["reward"] == 0.5
    code, _, err = cli(capsys, str(loom_file), "reward", "#1", "lots")
    assert code == 1 and "number" in err
    code, out, _ = cli(capsys, str(loom_file), "reward", "#1", "none")
    code, out, _ = cli(capsys, str(loom_file), "export")
    assert load_jsonl(out)[-1].reward is None


def test_cli_fork_continues_in_the_same_loom(
    loom_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "fork.toml"
    spec.write_text(SPEC, encoding="utf-8")
    loom = Loom.open(loom_file)
    first = loom.turns[0]
    loom.close()
    code, out, _ = cli(capsys, str(loom_file), "fork", first.id[-10:], str(spec), "Go elsewhere")
    assert code == 0 and out.strip() == "from the fork"
    loom = Loom.open(loom_file)
    try:
        assert len(loom.threads()) == 2
        forked = loom.threads()[1]
        assert forked[0].id == first.id and forked[1].parent_id == first.id
        assert forked[1].intent == "Go elsewhere"
        record = loom.entity(forked[1].entity_id)
        assert record.forked_from == first.id and record.fork_strategy == "replay"
    finally:
        loom.close()


def test_cli_output_is_redacted(
    tmp_path: Path, env_secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "leaky.jsonl"
    loom = Loom.open(path)
    trio.run(leaky_cast, loom)
    loom.close()
    outputs = []
    for argv in (("list",), ("show", "#1", "--full"), ("export",), ("export", "--format", "chat")):
        code, out, err = cli(capsys, str(path), *argv)
        assert code == 0
        outputs.append(out + err)
    text = "\n".join(outputs)
    for secret in all_secrets():
        value = secret.split("=")[-1].split(": ")[-1].removeprefix("Bearer ")
        assert value not in text, f"{secret} reached the CLI output"
    code, out, err = cli(capsys, str(path), "export", "--raw")
    assert SECRETS["github"] in out and "NOT redacted" in err


def test_refs_resolve_by_prefix_entity_and_sequence() -> None:
    loom = Loom()
    spell = spell_with([echo_call("a"), done_call("b")], loom)
    outcome = trio.run(spell.cast_async, "Go")
    first, last = outcome.turns
    assert resolve_ref(loom, first.id) == first
    assert resolve_ref(loom, first.id[-8:]) == first, "a unique suffix"
    assert resolve_ref(loom, first.id[:-1]) == first, "a unique prefix"
    assert resolve_ref(loom, outcome.entity_id) == last
    assert resolve_ref(loom, f"{outcome.entity_id[:12]}:1") == first
    assert resolve_ref(loom, "#1") == last


def test_loom_cli_runs_as_a_module(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    Loom.open(path).close()
    done = subprocess.run(
        [sys.executable, "-m", "cantrip.cli._loom", str(path), "list"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "entities (0)" in done.stdout and "threads (0)" in done.stdout
