"""The ``cantrip`` command as a person uses it: cast and invoke, on a terminal and not.

Terminal tests run the command on a pseudo-terminal (stdlib ``pty``), type
into it -- Ctrl-C is the byte 0x03, turned into SIGINT by the terminal, as
for a person -- and read what the screen shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cantrip import Loom

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A command on a pseudo-terminal: type into it, wait for what it shows."""

    def __init__(self, *args: str, cwd: Path) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the terminal is its controlling terminal
            os.chdir(cwd)
            env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
            os.execve(CANTRIP, [CANTRIP, *args], env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.screen = b""
        self.unread = 0
        self.exit_code: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child closed the terminal
            return False
        self.screen += data
        return bool(data)

    def expect(self, pattern: str, timeout: float = 20.0) -> str:
        """Wait until ``pattern`` shows in what was printed since the last match."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode(), re.S)
        while True:
            text = ANSI.sub(b"", self.screen[self.unread :])
            match = regex.search(text)
            if match:
                self.unread = len(self.screen)
                return text.decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.1)):
                raise AssertionError(
                    f"{pattern!r} not shown; the screen ends with {text[-1500:]!r}"
                )

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                while self._read(0.05) and len(self.screen) < 10_000_000:
                    pass
                return self.exit_code
            self._read(0.05)
        self.close()
        raise AssertionError("the command did not exit")

    def close(self) -> None:
        if self.exit_code is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.exit_code = -9
        os.close(self.fd)

    def all(self) -> str:
        return ANSI.sub(b"", self.screen).decode(errors="replace")


@pytest.fixture
def terminals() -> Any:
    opened: list[Terminal] = []

    def open_terminal(*args: str, cwd: Path) -> Terminal:
        terminal = Terminal(*args, cwd=cwd)
        opened.append(terminal)
        return terminal

    yield open_terminal
    for terminal in opened:
        terminal.close()


def spec_file(
    folder: Path, script: str, *, loom: str | None = None, wards: str = "5", shared: bool = False
) -> Path:
    """A spec with this script; ``shared``: one cursor through the whole session
    (``script = "shared"``) instead of each cast playing it from the start."""
    path = folder / "spec.toml"
    mode = 'script = "shared"' if shared else ""
    text = f"""
    [llm]
    provider = "scripted"
    {mode}
    responses = [
    {textwrap.indent(textwrap.dedent(script).strip(), "    ")}
    ]

    [circle]
    medium = "conversation"
    gates = ["done", "echo"]
    wards = [{{ max_turns = {wards} }}]
    """
    if loom:
        text += f'\n    [loom]\n    path = "{loom}"\n'
    path.write_text(textwrap.dedent(text))
    return path


GREETING = (
    '{ content = "Greeting first.", tool_calls = [{ gate = "echo", args = { text = "Hello!" } }], '
    "usage = { prompt_tokens = 120, completion_tokens = 30 } },\n"
    '{ tool_calls = [{ gate = "done", args = { answer = "I greeted the world." } }], '
    "usage = { prompt_tokens = 200, completion_tokens = 10 } },\n"
)


def run(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CANTRIP, *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60
    )


# -- cast, not on a terminal ----------------------------------------------------------


def test_cast_prints_only_the_result_when_not_on_a_terminal(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, GREETING)
    done = run("cast", str(spec), "Greet the world", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "I greeted the world.\n", "")


def test_cast_json_reports_the_outcome_and_the_loom(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, GREETING)
    done = run("cast", str(spec), "--json", "--loom", "cast.jsonl", cwd=tmp_path, stdin="Greet")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["result"] == "I greeted the world."
    assert (outcome["terminated"], outcome["reason"], outcome["turns"]) == (True, "done", 2)
    assert outcome["usage"]["total_tokens"] == 360 and outcome["stop_reason"] == "end_turn"
    assert outcome["loom"].endswith("cast.jsonl")
    loom = Loom.open(tmp_path / "cast.jsonl")
    assert loom.turns[0].intent == "Greet"  # the intent came from stdin
    loom.close()


def test_cast_exits_2_when_a_ward_truncates(tmp_path: Path) -> None:
    spec = spec_file(
        tmp_path, '{ tool_calls = [{ gate = "echo", args = { text = "again" } }] },', wards="1"
    )
    cut = run("cast", str(spec), "Loop", cwd=tmp_path)
    assert cut.returncode == 2 and cut.stdout == ""
    assert "Truncated by max_turns" in cut.stderr
    cut_json = run("cast", str(spec), "Loop", "--json", cwd=tmp_path)
    assert cut_json.returncode == 2
    assert json.loads(cut_json.stdout)["stop_reason"] == "max_turn_requests"


@pytest.mark.parametrize(
    ("spec_text", "message"),
    [
        (None, "spec file not found"),
        ("[circle]\nmedium = 'conversation'\ngates = ['done', 'teleport']\n", "unknown gate"),
        (
            "[llm]\nprovider = 'scripted'\n[circle]\nmedium = 'conversation'\ngates = ['done']\n"
            "wards = [{ max_turns = 2 }]\n[cirkle]\n",
            "unknown key 'cirkle'",
        ),
        ("not = [valid toml", "not valid TOML"),
    ],
)
def test_cast_exits_1_on_a_bad_spec(tmp_path: Path, spec_text: str | None, message: str) -> None:
    spec = tmp_path / "bad.toml"
    if spec_text is not None:
        spec.write_text(spec_text)
    failed = run("cast", str(spec), "anything", cwd=tmp_path)
    assert failed.returncode == 1 and failed.stdout == ""
    assert message in failed.stderr and "Traceback" not in failed.stderr


def test_cast_exits_1_when_the_llm_fails(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, '{ error = { status = 401, message = "bad key" } },')
    failed = run("cast", str(spec), "anything", cwd=tmp_path)
    assert failed.returncode == 1 and "bad key" in failed.stderr


def test_acp_check_reports_the_spec(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, GREETING, loom="acp.db")
    ok = run("acp", str(spec), "--check", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout == ""
    assert "loads (medium conversation; gates done, echo; loom" in ok.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[circle]\nmedium = 'conversation'\ngates = ['done', 'teleport']\n")
    failed = run("acp", str(bad), "--check", cwd=tmp_path)
    assert failed.returncode == 1 and "unknown gate 'teleport'" in failed.stderr


# -- cast, on a terminal ---------------------------------------------------------------


def test_cast_on_a_terminal_shows_progress_then_the_result(tmp_path: Path, terminals: Any) -> None:
    spec = spec_file(tmp_path, GREETING)
    terminal = terminals("cast", str(spec), "Greet the world", cwd=tmp_path)
    assert terminal.wait() == 0
    screen = terminal.all()
    assert "Greeting first." in screen  # streamed text
    assert '→ echo({"text": "Hello!"})' in screen and "✓ echo Hello!" in screen
    assert "turn 2 · 2 gate call(s) · 360 tokens" in screen  # the final status line
    assert screen.rstrip().endswith("I greeted the world.")


def test_ctrl_c_cancels_a_cast_and_the_loom_records_it(tmp_path: Path, terminals: Any) -> None:
    spec = spec_file(
        tmp_path,
        """
        { tool_calls = [{ gate = "echo", args = { text = "started" } }] },
        { content = "this takes forever", delay_ms = 60000 },
        """,
        loom="cast.db",
    )
    terminal = terminals("cast", str(spec), "Take your time", cwd=tmp_path)
    terminal.expect("✓ echo started")
    terminal.expect("turn 2")
    terminal.type("\x03")
    assert terminal.wait() == 130
    assert "recorded as cancelled" in terminal.all()
    loom = Loom.open(tmp_path / "cast.db")
    assert [t.reason for t in loom.turns] == [None, "cancelled"]
    loom.close()


# -- invoke --------------------------------------------------------------------------


INVOKE_SCRIPT = """
{ tool_calls = [{ gate = "echo", args = { text = "noted: blue" } }] },
{ tool_calls = [{ gate = "done", args = { answer = "I will remember blue." } }] },
{ content = "hmm, let me think about this for a long time", delay_ms = 60000 },
{ tool_calls = [{ gate = "done", args = { answer = "Your colour is blue." } }] },
"""


def test_invoke_keeps_one_entity_cancels_on_ctrl_c_and_resumes(
    tmp_path: Path, terminals: Any
) -> None:
    spec = spec_file(tmp_path, INVOKE_SCRIPT, loom="invoke.db", shared=True)
    terminal = terminals("invoke", str(spec), cwd=tmp_path)
    banner = terminal.expect("cantrip> ")
    entity = re.search(r"entity-[0-9a-f]+", banner)
    assert entity is not None and "summoned" in banner
    entity_id = entity.group(0)

    terminal.type("My colour is blue.\r")
    terminal.expect(r"✓ echo noted: blue.*I will remember blue\..*cantrip> ")
    terminal.type("Think hard about it.\r")
    terminal.expect("turn 3")  # the entity's third turn, as the loom counts (issue 47.7)
    terminal.type("\x03")  # Ctrl-C during the cast: that cast is cancelled
    terminal.expect(r"cancelled.*the entity is still here.*cantrip> ")
    terminal.type("What is my colour?\r")
    terminal.expect(r"Your colour is blue\..*cantrip> ")
    terminal.type("\x03")  # at the prompt: a hint, not an exit
    terminal.expect("Ctrl-C again")
    terminal.type("\x03")
    assert terminal.wait() == 0
    assert "3 cast(s) this session" in terminal.all()

    loom = Loom.open(tmp_path / "invoke.db")
    turns = loom.entity_turns(entity_id)
    assert [t.intent for t in turns if t.intent] == [
        "My colour is blue.",
        "Think hard about it.",
        "What is my colour?",
    ]
    assert [t.reason for t in turns] == [None, "done", "cancelled", "done"]
    loom.close()

    # A new process continues the same entity from the loom file.
    spec_file(
        tmp_path,
        '{ tool_calls = [{ gate = "done", args = { answer = "Still blue." } }] },',
        loom="invoke.db",
    )
    again = terminals("invoke", str(spec), "--resume", entity_id, cwd=tmp_path)
    assert "resumed with 4 turn(s)" in again.expect("cantrip> ")
    again.type("And now?\r")
    again.expect(r"Still blue\..*cantrip> ")
    again.type("\x04")  # Ctrl-D: end of input
    assert again.wait() == 0
    loom = Loom.open(tmp_path / "invoke.db")
    turns = loom.entity_turns(entity_id)
    assert turns[-1].result == "Still blue." and turns[-1].parent_id == turns[-2].id
    loom.close()


def test_invoke_reads_intents_from_a_pipe(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, INVOKE_SCRIPT.replace(", delay_ms = 60000", ""), shared=True)
    done = run(
        "invoke", str(spec), cwd=tmp_path, stdin="My colour is blue.\n\nThink.\nWhat is it?\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (  # a text-only reply ends a cast too (LOOP-6)
        "I will remember blue.\n"
        "hmm, let me think about this for a long time\n"
        "Your colour is blue.\n"
    )
    assert "3 cast(s) this session" in done.stderr


def test_invoke_resume_needs_a_loom_file_and_a_known_entity(tmp_path: Path) -> None:
    no_loom = spec_file(tmp_path, GREETING)
    failed = run("invoke", str(no_loom), "--resume", "entity-00", cwd=tmp_path, stdin="")
    assert failed.returncode == 1 and "--resume needs a loom file" in failed.stderr
    with_loom = spec_file(tmp_path, GREETING, loom="l.db")
    failed = run("invoke", str(with_loom), "--resume", "entity-00", cwd=tmp_path, stdin="")
    assert failed.returncode == 1 and "no entity 'entity-00'" in failed.stderr


def test_python_dash_m_runs_the_same_command(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, GREETING)
    done = subprocess.run(
        [sys.executable, "-m", "cantrip", "cast", str(spec), "hi"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout == "I greeted the world.\n"


# -- the pieces behind the commands, in process ----------------------------------------


async def test_progress_counts_turns_gate_calls_tokens_and_reported_cost() -> None:
    import io

    from rich.console import Console

    import cantrip
    from cantrip.protocols.terminal._progress import Progress
    from gates import done, echo

    class Priced:
        name = "priced"

        def __init__(self) -> None:
            self.calls = 0

        async def query(self, *args: Any, **kwargs: Any) -> cantrip.Response:
            self.calls += 1
            call = ("echo", {"text": "hi"}) if self.calls == 1 else ("done", {"answer": "ok"})
            return cantrip.Response(
                tool_calls=(cantrip.ToolCall(f"c{self.calls}", *call),),
                usage=cantrip.Usage(100, 20),
                metadata={"cost": 0.0015},
            )

    spell = cantrip.Cantrip(
        llm=Priced(),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
    )
    screen = io.StringIO()
    progress = Progress(Console(file=screen, force_terminal=True, width=120))
    with progress:
        outcome = await spell.cast_async("go", on_event=progress)
    assert outcome.result == "ok"
    assert progress.status().startswith("turn 2 · 2 gate call(s) · 240 tokens · $0.003000 ")
    assert f"${outcome.cost_usd:.6f}" in progress.status()  # as the loom and --json say
    text = ANSI.sub(b"", screen.getvalue().encode()).decode()
    assert "✓ echo hi" in text and "✓ done ok" in text


async def test_the_progress_line_says_cost_unknown_when_any_query_had_no_price() -> None:
    """One unpriced query makes the cast's cost unknown in the progress line, as in the
    loom and ``cast --json`` (issue 47.7): not the sum of the priced ones, not "n/a"."""
    import io

    from rich.console import Console

    import cantrip
    from cantrip.protocols.terminal._progress import Progress
    from gates import done, echo

    class HalfPriced:
        name = "half"

        def __init__(self) -> None:
            self.calls = 0

        async def query(self, *args: Any, **kwargs: Any) -> cantrip.Response:
            self.calls += 1
            call = ("echo", {"text": "hi"}) if self.calls == 1 else ("done", {"answer": "ok"})
            priced = {"cost": 0.0015} if self.calls == 1 else {}
            return cantrip.Response(
                tool_calls=(cantrip.ToolCall(f"c{self.calls}", *call),),
                usage=cantrip.Usage(100, 20),  # the second: tokens at no known price
                metadata=priced,
            )

    spell = cantrip.Cantrip(
        llm=HalfPriced(),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
    )
    progress = Progress(Console(file=io.StringIO(), force_terminal=True, width=120))
    with progress:
        outcome = await spell.cast_async("go", on_event=progress)
    assert outcome.cost_usd is None
    assert " · cost unknown · " in progress.status()
    assert "$" not in progress.status() and "n/a" not in progress.status()


async def test_entity_server_streams_events_and_cancels_the_running_cast() -> None:
    import trio

    import cantrip
    from cantrip._events import StepStart
    from cantrip._server import EntityServer
    from cantrip._supervisor import Supervisor
    from cantrip.llm._stream import Event
    from gates import done

    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {"content": "slow", "delay_ms": 60_000},
                {"tool_calls": [{"gate": "done", "args": {"answer": "fine"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
    )
    events: list[Event] = []
    server = EntityServer(spell, on_event=events.append)
    assert server.cancel() is False  # nothing runs yet
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Supervisor([server.child_spec()]).run)
        outcomes: list[Any] = []

        async def ask() -> None:
            outcomes.append(await server.ask("take your time"))

        nursery.start_soon(ask)
        with trio.fail_after(5):
            while not any(isinstance(e, StepStart) for e in events):
                await trio.sleep(0.01)
        assert server.cancel() is True
        with trio.fail_after(5):
            while not outcomes:
                await trio.sleep(0.01)
        assert outcomes[0].reason == "cancelled"
        assert (await server.ask("again")).result == "fine"  # the entity lives on
        server.close()
    assert [t.reason for t in spell.loom.turns] == ["cancelled", "done"]


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``cantrip ARGS`` with standard output a pipe whose reader is gone before the
    command writes (what ``| head -c 300`` becomes once head has its bytes)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "cantrip", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


def test_a_reader_that_went_away_ends_every_command_quietly(tmp_path: Path) -> None:
    """Issue 39: ``cantrip loom X list --json | head -c 300`` printed "cantrip: Broken
    pipe". Every command writing to a closed pipe now stops quietly (exit 141, as a
    process killed by SIGPIPE), whatever it was writing."""
    import trio

    from cantrip import Cantrip, Circle, Identity, ScriptedLLM, max_turns
    from gates import done

    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    spell = Cantrip(
        llm=ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "x" * 5000}}]}]),
        identity=Identity(system_prompt="s"),
        circle=Circle([done], [max_turns(2)]),
        loom=loom,
    )
    trio.run(spell.cast_async, "go")
    loom.close()
    for command in (
        ["loom", str(path), "list", "--json"],
        ["loom", str(path), "list"],
        ["loom", str(path), "export"],
        ["loom", str(path), "show", "#1"],
        ["loom", str(path), "stats"],
    ):
        out = run_into_closed_pipe(*command)
        assert (out.returncode, out.stderr) == (141, ""), command
    out = run_into_closed_pipe("loom", "--help")  # argparse stops writing by itself
    assert (out.returncode, out.stderr) == (0, "")


def test_a_broken_pipe_that_is_not_standard_output_is_still_reported() -> None:
    """Only a closed standard output is quiet: the same error elsewhere is reported."""
    from cantrip._failure import is_closed_pipe

    assert not is_closed_pipe(BrokenPipeError(32, "Broken pipe"))  # stdout is not gone here


def test_text_that_is_not_valid_unicode_is_printed_escaped_by_every_command(
    tmp_path: Path,
) -> None:
    """A provider may answer with a lone surrogate (JSON allows ``"\\ud800"``), and the
    loom keeps it as it came. Printing it to a UTF-8 standard output raised
    UnicodeEncodeError: ``loom X list`` and ``show`` ended as "internal error", exit 70.
    Every command now writes such a character as its visible escape (``\\udfff``), as
    the JUnit report does, and the rest of its output is unchanged."""
    import trio

    from cantrip import Cantrip, Circle, Identity, ScriptedLLM, max_turns
    from gates import done, echo

    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    spell = Cantrip(
        llm=ScriptedLLM(
            [
                {
                    "content": "a \ud800 b",
                    "tool_calls": [{"gate": "echo", "args": {"text": "c \udc00"}}],
                },
                {"tool_calls": [{"gate": "done", "args": {"answer": "ok \udfff"}}]},
            ]
        ),
        identity=Identity(system_prompt="s"),
        circle=Circle([done, echo], [max_turns(4)]),
        loom=loom,
    )
    trio.run(spell.cast_async, "go")
    loom.close()
    for command, shown in (
        (["loom", str(path), "list"], "ok \\udfff"),
        (["loom", str(path), "show", "#1"], "ok \\udfff"),
        (["loom", str(path), "show", "#1", "--full"], "c \\udc00"),
        (["loom", str(path), "export"], "\\ud800"),
    ):
        out = run(*command, cwd=tmp_path)
        assert out.returncode == 0, (command, out.stderr)
        assert shown in out.stdout, (command, out.stdout)
        assert "internal error" not in out.stderr


# -- --json when the command fails (issue 47.6) ----------------------------------------


def _json_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON object on stdout of a failed ``--json`` command."""
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    error = json.loads(lines[0])["error"]
    assert isinstance(error, dict)
    return error


def test_cast_json_prints_an_error_object_when_the_spec_is_missing(tmp_path: Path) -> None:
    done = run("cast", "--json", "missing.toml", "hi", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == "cantrip: spec file not found: missing.toml\n"
    error = _json_error(done)
    assert error == {
        "exit_code": 1,
        "kind": "error",
        "message": "spec file not found: missing.toml",
        "problems": ["spec file not found: missing.toml"],
    }


def test_cast_json_error_lists_every_problem_of_a_spec(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(
        "[circle]\nmedium = 'conversation'\ngates = ['done', 'teleport', 'beam']\n",
        encoding="utf-8",
    )
    done = run("cast", "--json", str(spec), "hi", cwd=tmp_path)
    assert done.returncode == 1
    error = _json_error(done)
    assert error["kind"] == "error" and error["exit_code"] == 1
    assert len(error["problems"]) >= 2, error
    assert any("teleport" in p for p in error["problems"])
    assert any("beam" in p for p in error["problems"])
    for problem in error["problems"]:  # the same lines the human reads on stderr
        assert problem in done.stderr


def test_cast_db_json_prints_an_error_object_when_postgres_is_unreachable(
    tmp_path: Path,
) -> None:
    spec = spec_file(tmp_path, GREETING)
    done = run("cast", "--json", "--db", "postgresql://127.0.0.1:1/x", str(spec), "hi",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    error = _json_error(done)
    assert error["kind"] == "error" and error["exit_code"] == 1
    assert "cannot connect to PostgreSQL" in error["message"]
    assert done.stderr == f"cantrip: {error['message']}\n"


def test_a_failure_without_json_leaves_stdout_empty(tmp_path: Path) -> None:
    done = run("cast", "missing.toml", "hi", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
