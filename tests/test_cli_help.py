"""Every command's ``--help`` is plain text a user can read (issue 30.4).

The argparse tree is walked, so a command or option added later is covered too: each
``--help`` is rendered through the real ``cantrip`` entry point, and must be free of
reST markup and spec rule ids, and every option and positional must say what it is.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from cantrip._version import __version__
from cantrip.cli import main
from cantrip.cli._parser import build_parser

MARKUP = re.compile(r":(class|mod|func|meth|attr|data|exc|ref):`|``|`[^`\n]+`_")
RULE_ID = re.compile(r"\b(?!UTF-)[A-Z]{2,}-\d+\b")  # LOOP-2, CIRCLE-10; not UTF-8


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _argv(path: tuple[str, ...]) -> list[str]:
    """The command line reaching ``path``'s help (``loom`` takes its FILE first)."""
    argv: list[str] = []
    for word in path:
        argv.append(word)
        if word in ("loom", "memory"):
            argv.append("x.db")
    return [*argv, "--help"]


COMMANDS = list(_commands(build_parser()[0]))


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"cast", "serve", "loom", "loom export", "worker", "mcp", "init", "eval"} <= names


@pytest.mark.parametrize(
    ("path", "parser"), COMMANDS, ids=[" ".join(p) or "cantrip" for p, _ in COMMANDS]
)
def test_help_is_plain_and_complete(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(_argv(path))
    assert exited.value.code == 0
    text = out.getvalue()
    assert text.startswith("usage: cantrip")
    assert not MARKUP.search(text), f"reST markup in `cantrip {' '.join(path)} --help`:\n{text}"
    assert not RULE_ID.search(text), f"a rule id in `cantrip {' '.join(path)} --help`:\n{text}"
    assert parser.description, f"`cantrip {' '.join(path)}` has no description"
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if isinstance(action, argparse._SubParsersAction):
            missing = [c.dest for c in action._choices_actions if not c.help]
            assert not missing, f"subcommands with no help: {missing}"
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"{name} has no help text"


def test_export_format_explains_each_format() -> None:
    text = subprocess.run(
        [sys.executable, "-m", "cantrip", "loom", "x.db", "export", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for word in ("jsonl", "chat", "otlp"):
        assert re.search(rf"{word}\b.*\S", text), text
    assert "training" in text and "OpenTelemetry" in text


def test_version() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cantrip", "--version"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"cantrip {__version__}"


def _cantrip(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cantrip", *argv], capture_output=True, text=True, timeout=60
    )


def test_a_wrong_flag_shows_the_subcommands_usage_and_a_close_flag() -> None:
    """A misspelt option names the subcommand it was given to and the option meant
    (issue 47.6), not the top-level usage; the exit code stays argparse's 2."""
    run = _cantrip("cast", "--lom", "x", "spec.toml", "hi")
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("usage: cantrip cast "), run.stderr
    assert "unrecognized arguments: --lom" in run.stderr
    assert "did you mean --loom?" in run.stderr
    assert run.stdout == ""


def test_a_wrong_flag_of_a_nested_command_shows_its_usage() -> None:
    run = _cantrip("loom", "x.db", "export", "--formt", "chat")
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("usage: cantrip loom FILE export "), run.stderr
    assert "did you mean --format?" in run.stderr


def test_a_flag_close_to_nothing_gets_no_suggestion() -> None:
    run = _cantrip("cast", "--zzzzzz", "spec.toml", "hi")
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("usage: cantrip cast "), run.stderr
    assert "unrecognized arguments: --zzzzzz" in run.stderr
    assert "did you mean" not in run.stderr


def test_conformance_without_vectors_says_where_they_are(tmp_path: Path) -> None:
    """In a folder without tests.yaml the command names what to pass, not a path inside
    the installed package (issue 47.6)."""
    run = subprocess.run(
        [sys.executable, "-m", "cantrip", "conformance"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stderr
    assert "no tests.yaml in this folder" in run.stderr
    assert "cantrip conformance PATH/tests.yaml" in run.stderr
    assert "site-packages" not in run.stderr and "/cantrip/tests.yaml" not in run.stderr
