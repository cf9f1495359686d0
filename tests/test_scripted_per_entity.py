"""A scripted LLM in a spec answers each entity from its own progress (issue 30, item 5).

The shipped example (examples/hello.toml, two answers) is served to several
sessions with several prompts each, invoked line after line, run by a worker for
several casts, and continued by a second process after the first was killed in
the middle of a cast -- each cast plays the script from its first entry, and a
continued cast picks up at the answer its conversation has reached.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

import cantrip
from cantrip import ProviderError, ScriptedLLM
from cantrip.llm import Message
from cantrip.spec import build_cantrip, load_spec_file, parse_spec

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "examples" / "hello.toml"
CANTRIP = str(Path(sys.executable).with_name("cantrip"))
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def hello_copy(folder: Path) -> Path:
    """The shipped example in a folder of the test's own (its loom lands beside it)."""
    spec = folder / "hello.toml"
    shutil.copy(HELLO, spec)
    return spec


# -- the rule, on the LLM itself -------------------------------------------------------


def ask(llm: ScriptedLLM, *messages: Message) -> str:
    response = trio.run(llm.query, list(messages))
    return response.content or ""


def test_each_conversation_plays_the_script_from_its_own_position() -> None:
    llm = ScriptedLLM([{"content": "one"}, {"content": "two"}], per_entity=True)
    system = Message("system", "be brief")
    a, b = Message("user", "first entity"), Message("user", "second entity")
    assert ask(llm, system, a) == "one"
    assert ask(llm, system, b) == "one"  # another entity: its own script
    assert ask(llm, system, a, Message("assistant", "one"), Message("user", "go on")) == "two"
    # A new intent after a finished cast (a tool result before it) starts over.
    done_call = cantrip.ToolCall("c1", "done", {"answer": "x"})
    later = [
        system,
        a,
        Message("assistant", tool_calls=[done_call]),
        Message("tool", "x", tool_call_id="c1", name="done"),
        Message("user", "next line"),
    ]
    assert ask(llm, *later) == "one"
    with pytest.raises(cantrip.ScriptExhaustedError, match="turn 3 of this cast"):
        ask(llm, system, a, Message("assistant", "one"), Message("assistant", "two"))


def test_an_error_entry_is_raised_once_per_conversation_and_the_retry_moves_on() -> None:
    script = [{"error": {"status": 503, "message": "busy"}}, {"content": "ok"}]
    llm = ScriptedLLM(script, per_entity=True)
    intent = Message("user", "hi")
    with pytest.raises(ProviderError, match="busy"):
        ask(llm, intent)
    assert ask(llm, intent) == "ok"
    # The next intent is a new cast: the script from its first entry, error included.
    following = [intent, Message("assistant", "ok"), Message("user", "more")]
    with pytest.raises(ProviderError, match="busy"):
        ask(llm, *following)
    assert ask(llm, *following) == "ok"


def test_a_spec_plays_per_entity_and_the_python_default_stays_shared() -> None:
    circle = {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]}
    spell = build_cantrip(parse_spec({"llm": {"responses": [{"content": "a"}]}, "circle": circle}))
    assert isinstance(spell.llm, ScriptedLLM) and spell.llm.per_entity
    assert not ScriptedLLM([{"content": "a"}]).per_entity
    shared = parse_spec({"llm": {"script": "shared", "responses": [{"content": "a"}]}})
    assert shared.llm is not None and shared.llm.script == "shared"


# -- the front ends ----------------------------------------------------------------------


def test_serve_answers_two_sessions_with_several_prompts_each_and_after_a_restart(
    tmp_path: Path,
) -> None:
    spec = hello_copy(tmp_path)

    def serving() -> tuple[subprocess.Popen[str], str]:
        process = subprocess.Popen(
            [CANTRIP, "serve", str(spec), "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "serving" in line, line
        return process, line.strip().rsplit(" ", 1)[-1]

    def stop(process: subprocess.Popen[str]) -> None:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0

    process, base = serving()
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            sessions = [http.post("/sessions").json()["session_id"] for _ in range(2)]
            for round_ in range(3):
                for sid in sessions:
                    answer = http.post(
                        f"/sessions/{sid}/prompt", json={"prompt": f"greet {round_}"}
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["result"] == "I greeted the world.", answer.json()
        stop(process)
        process, base = serving()  # a restart: the sessions come back from the loom file
        with httpx.Client(base_url=base, timeout=30) as http:
            for sid in sessions:
                answer = http.post(f"/sessions/{sid}/prompt", json={"prompt": "once more"})
                assert answer.json()["result"] == "I greeted the world.", answer.json()
                turns = http.get(f"/sessions/{sid}/thread").json()["turns"]
                assert len(turns) == 8  # four casts of two turns each
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_invoke_answers_every_line(tmp_path: Path) -> None:
    spec = hello_copy(tmp_path)
    done = subprocess.run(
        [CANTRIP, "invoke", str(spec)],
        input="Greet the world.\nAgain, please.\nAnd once more.\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["I greeted the world."] * 3
    assert "3 cast(s) this session" in done.stderr


def test_a_worker_runs_several_casts_of_the_example(pg_url: str, tmp_path: Path) -> None:
    from cantrip.distributed._dispatcher import Dispatcher
    from cantrip.distributed._spells import spell_from_spec
    from cantrip.distributed._worker import Worker

    spell = spell_from_spec(hello_copy(tmp_path))

    async def main() -> list[str]:
        dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
        results = []
        async with trio.open_nursery() as nursery:
            await nursery.start(Worker(pg_url, concurrency=2).run)
            for n in range(3):
                work, _ = await trio.to_thread.run_sync(
                    lambda n=n: dispatcher.submit(spell, f"greet {n}")
                )
                state, outcome = await trio.to_thread.run_sync(
                    lambda work=work: dispatcher.wait(work, timeout=60)
                )
                assert state == "done", outcome
                results.append(outcome["result"])
            nursery.cancel_scope.cancel()
        dispatcher.close()
        return results

    assert trio.run(main) == ["I greeted the world."] * 3


RESTARTED_SPEC = """
[llm]
provider = "scripted"
responses = [
    { tool_calls = [{ gate = "echo", args = { text = "Hello, world!" } }] },
    { tool_calls = [{ gate = "done", args = { answer = "Greeted." } }], delay_ms = 2000 },
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 5 }]

[loom]
path = "loom.db"
"""


def test_a_cast_killed_midway_continues_at_its_own_next_answer(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(RESTARTED_SPEC)
    first = subprocess.Popen(
        [CANTRIP, "cast", str(spec), "Greet the world."],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until the first turn is in the loom, then kill the process
            assert time.monotonic() < deadline, "the first turn never reached the loom"
            if (tmp_path / "loom.db").exists():
                loom = cantrip.Loom.open(tmp_path / "loom.db")
                turns = list(loom.turns)
                loom.close()
                if turns:
                    break
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    (entity_id,) = {t.entity_id for t in turns}

    # A new process: a fresh scripted LLM from the same spec, the same loom file.
    spell = build_cantrip(load_spec_file(spec), base_dir=tmp_path)
    recorded = spell.loom.entity_turns(entity_id)
    assert [t.utterance for t in recorded] == ['echo({"text": "Hello, world!"})']

    async def continue_cast() -> cantrip.CastResult:
        async with spell.resume(entity_id) as entity:
            return await entity.resume_cast("Greet the world.", recorded)

    result = trio.run(continue_cast)
    assert result.result == "Greeted."
    thread = spell.loom.entity_turns(entity_id)
    assert [t.utterance for t in thread] == [
        'echo({"text": "Hello, world!"})',
        'done({"answer": "Greeted."})',
    ]
    spell.loom.close()
