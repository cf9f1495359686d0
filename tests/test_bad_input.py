"""Every command, walked with the bad inputs people really type, pipe or point at (issue 20).

Each row: a command line (and what is piped to stdin), the exit code, and a piece of the
one line the user must see. No row may print a traceback, and no file that is not a
loom may change. ``--debug`` / ``CANTRIP_DEBUG=1`` show the traceback on request, and a
real bug still shows one, with a line saying it is a bug.
"""

from __future__ import annotations

import io
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import gates
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip._failure import EXIT_BUG
from cantrip.cli import _conformance
from cantrip.cli import _main as _cli

CANTRIP = str(Path(sys.executable).with_name("cantrip"))

GOOD_SPEC = """
[llm]
provider = "scripted"
responses = [{ tool_calls = [{ gate = "done", args = { answer = "hi" } }] }]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 2 }]
"""


def make_loom(path: Path, turns: int) -> None:
    script = [
        {"tool_calls": [{"gate": "echo", "args": {"text": f"step {i} " + "x" * 300}}]}
        for i in range(turns - 1)
    ] + [{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]
    loom = Loom.open(path)
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(),
        circle=Circle([gates.done, gates.echo], [max_turns(turns + 1)]),
        loom=loom,
    )
    trio.run(spell.cast_async, "go")
    loom.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-input")
    (root / "good.toml").write_text(GOOD_SPEC)
    (root / "bad.toml").write_text("[llm\nprovider = ")
    (root / "typo.toml").write_text(GOOD_SPEC + "\n[circel]\nmedium = 'js'\n")
    (root / "nan.toml").write_text(GOOD_SPEC + "\n[identity]\ntemperature = nan\n")
    (root / "notes.txt").write_text("my notes, not a loom\n")
    (root / "notes.jsonl").write_text("just words\n")
    (root / "folder").mkdir()
    (root / "cases.yaml").write_text("- name: [unclosed\n")
    (root / "scalar.yaml").write_text("just a sentence\n")
    other = sqlite3.connect(root / "other.db")
    other.execute("CREATE TABLE invoices (n INTEGER)")
    other.commit()
    other.close()
    make_loom(root / "good.db", 3)
    make_loom(root / "big.db", 120)
    data = (root / "big.db").read_bytes()
    (root / "half.db").write_bytes(data[: len(data) * 6 // 10])
    return root


ROWS: list[tuple[str, list[str], bytes | None, int, str]] = [
    # (name, argv, stdin, exit code, a piece of the one line)
    ("missing spec", ["cast", "missing.toml", "hi"], None, 1, "spec file not found"),
    ("not TOML", ["cast", "bad.toml", "hi"], None, 1, "not valid TOML"),
    ("unknown key", ["cast", "typo.toml", "hi"], None, 1, "circel"),
    ("NaN hyperparameter", ["cast", "nan.toml", "hi"], None, 1,
     "temperature must be a finite number"),
    ("spec is a folder", ["cast", "folder", "hi"], None, 1, "Is a directory"),
    ("binary stdin", ["cast", "good.toml"], os.urandom(3000) + b"\xff", 1, "not UTF-8 text"),
    ("undecodable argv", ["cast", "good.toml", "caf\udce9"], None, 1, "not valid UTF-8 text"),
    ("text file as loom", ["cast", "good.toml", "hi", "--loom", "notes.txt"], None, 1,
     "notes.txt is not a loom"),
    ("jsonl that is not a loom", ["cast", "good.toml", "hi", "--loom", "notes.jsonl"], None, 1,
     "first line is not a loom record"),
    ("another program's db", ["cast", "good.toml", "hi", "--loom", "other.db"], None, 1,
     "SQLite database of something else"),
    ("damaged loom", ["cast", "good.toml", "hi", "--loom", "half.db"], None, 1,
     "damaged loom"),
    ("folder as loom", ["cast", "good.toml", "hi", "--loom", "folder"], None, 1, "is a folder"),
    ("invoke: missing spec", ["invoke", "missing.toml"], b"", 1, "spec file not found"),
    ("invoke: resume without loom", ["invoke", "good.toml", "--resume", "x"], b"", 1,
     "--resume needs a loom file"),
    ("invoke: text file as loom", ["invoke", "good.toml", "--loom", "notes.txt"], b"", 1,
     "not a loom"),
    ("loom: text file", ["loom", "notes.txt", "list"], None, 1, "not a loom"),
    ("loom: truncated", ["loom", "half.db", "list"], None, 1, "half.db check"),
    ("loom: other db", ["loom", "other.db", "show", "#1"], None, 1, "something else"),
    ("loom: missing", ["loom", "missing.db", "list"], None, 1, "no loom file"),
    ("loom: folder", ["loom", "folder", "list"], None, 1, "is a folder"),
    ("loom: bad ref", ["loom", "good.db", "show", "nope"], None, 1, "no turn or entity"),
    ("loom: bad reward", ["loom", "good.db", "reward", "#1", "lots"], None, 1,
     "reward must be a number"),
    ("loom: fork, missing spec", ["loom", "good.db", "fork", "#1", "missing.toml", "x"], None,
     1, "spec file not found"),
    ("loom: recover over a file", ["loom", "half.db", "recover", "notes.txt"], None, 1,
     "recover writes a new file"),
    ("loom: check a text file", ["loom", "notes.txt", "check"], None, 1, "not a loom"),
    ("conformance: missing", ["conformance", "missing.yaml"], None, 1, "missing.yaml"),
    ("conformance: not YAML", ["conformance", "cases.yaml"], None, 1, "cases.yaml"),
    ("conformance: not cases", ["conformance", "scalar.yaml"], None, 1, "scalar.yaml"),
    ("acp: missing spec", ["acp", "missing.toml"], None, 1, "spec file not found"),
    ("acp: bad spec", ["acp", "bad.toml", "--check"], None, 1, "not valid TOML"),
    ("serve: bad spec", ["serve", "typo.toml"], None, 1, "circel"),
    ("serve: no token beyond loopback", ["serve", "good.toml", "--host", "0.0.0.0"], None, 1,
     "needs a token"),
    ("serve: no sessions", ["serve", "good.toml", "--max-sessions", "0"], None, 1,
     "max_sessions"),
    ("serve: impossible port", ["serve", "good.toml", "--port", "70000"], None, 1, "70000"),
    ("serve: no heartbeat", ["serve", "good.toml", "--heartbeat-s", "0"], None, 1,
     "--heartbeat-s 0.0 is not a positive number"),
    ("serve: NaN heartbeat", ["serve", "good.toml", "--heartbeat-s", "nan"], None, 1,
     "--heartbeat-s nan is not a positive number"),
]  # fmt: skip


def run_main(
    argv: list[str],
    stdin: bytes | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b"")))
    code = _cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("name", "argv", "stdin", "code", "says"), ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_and_loses_nothing(
    files: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    argv: list[str],
    stdin: bytes | None,
    code: int,
    says: str,
) -> None:
    monkeypatch.chdir(files)
    monkeypatch.delenv("CANTRIP_DEBUG", raising=False)
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    exit_code, _, err = run_main(argv, stdin, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("cantrip: "), err
    assert says in lines[0], lines[0]
    assert exit_code == code
    after = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    assert after == before, "no file was written, least of all one that is not a loom"


def test_random_bytes_on_stdin_from_a_real_pipe(files: Path) -> None:
    """The report's own reproduction: three megabytes of noise piped into ``cast``."""
    done = subprocess.run(
        [CANTRIP, "cast", "good.toml"],
        input=os.urandom(3_000_000),
        capture_output=True,
        cwd=files,
        timeout=120,
        env={**os.environ, "CANTRIP_DEBUG": ""},
    )
    assert done.returncode == 1
    assert done.stderr.decode().startswith("cantrip: the intent on stdin is not UTF-8 text")
    assert done.stderr.count(b"\n") == 1


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(
    files: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    monkeypatch.chdir(files)
    argv = ["cast", "missing.toml", "hi"]
    if how == "flag":
        argv.insert(1, "--debug")
    else:
        monkeypatch.setenv("CANTRIP_DEBUG", "1")
    code, _, err = run_main(argv, None, monkeypatch, capsys)
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("cantrip: spec file not found")


def test_a_bug_shows_its_traceback_and_says_it_is_a_bug(
    files: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(args: object) -> int:
        raise TypeError("an internal mistake")

    monkeypatch.setattr(_conformance, "run_conformance", broken)
    code, _, err = run_main(["conformance"], None, monkeypatch, capsys)
    assert code == EXIT_BUG == 70
    assert "Traceback (most recent call last)" in err
    assert "TypeError: an internal mistake" in err
    assert "this is a bug in cantrip" in err.strip().splitlines()[-1]


def test_a_bug_inside_an_exception_group_is_still_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cantrip._failure import report

    group = BaseExceptionGroup(
        "nursery", [FileNotFoundError(2, "No such file", "x"), KeyError("k")]
    )
    assert report(group, debug=False, stream=sys.stderr) == 70
    only_users = ExceptionGroup("nursery", [FileNotFoundError(2, "No such file", "x.toml")])
    assert report(only_users, debug=False, stream=sys.stderr) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "cantrip: x.toml: No such file"


def test_a_damaged_loom_can_be_checked_and_its_complete_turns_recovered(
    files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(files)
    half = (files / "half.db").read_bytes()
    code, out, _ = run_main(["loom", "half.db", "check"], None, monkeypatch, capsys)
    assert code == 1 and "DAMAGED" in out
    out_path = files.parent / "recovered.db"
    code, out, _ = run_main(
        ["loom", "half.db", "recover", str(out_path)], None, monkeypatch, capsys
    )
    assert code == 0, out
    assert (files / "half.db").read_bytes() == half, "the damaged file is only read"
    recovered = Loom.open(out_path)
    try:
        turns = recovered.turns
        assert 10 < len(turns) < 120, "some turns were lost with the missing pages"
        assert [t.sequence for t in turns] == list(range(1, len(turns) + 1)), "a clean prefix"
        assert turns[0].intent == "go"
    finally:
        recovered.close()
    code, out, _ = run_main(["loom", str(out_path), "check"], None, monkeypatch, capsys)
    assert code == 0 and "intact" in out
    code, out, _ = run_main(["loom", "good.db", "check", "--json"], None, monkeypatch, capsys)
    assert code == 0 and '"intact": true' in out and '"complete_turns": 3' in out


def test_serve_on_a_taken_port_is_one_line(
    files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    monkeypatch.chdir(files)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_main(
            ["serve", "good.toml", "--port", str(port)], None, monkeypatch, capsys
        )
    assert code == 1
    assert err.strip().splitlines() == [
        f"cantrip: cannot serve on 127.0.0.1:{port}: Address already in use"
    ]


def test_invoke_refuses_a_line_that_is_not_utf8_and_goes_on(files: Path) -> None:
    done = subprocess.run(
        [CANTRIP, "invoke", "good.toml", "-q"],
        input=b"\xff\xfe not text\nhello\n",
        capture_output=True,
        cwd=files,
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stdout.decode().strip() == "hi", "the next line was cast"
    err = done.stderr.decode()
    assert "Traceback" not in err
    assert "that line is not valid UTF-8 text" in err and "nothing was cast" in err
