"""``cantrip init`` writes the examples shipped in the package (issue 47.3): the starter by
default, which casts offline, and any other by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _cantrip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cantrip", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_init_writes_a_starter_that_casts(tmp_path: Path) -> None:
    made = _cantrip("init", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "hello.toml").exists()
    cast = _cantrip("cast", "hello.toml", "Greet the world, then finish.", cwd=tmp_path)
    assert cast.returncode == 0, cast.stderr
    assert cast.stdout.strip() == "I greeted the world."
    assert (tmp_path / "hello-loom.db").exists()


def test_init_never_overwrites_unless_forced(tmp_path: Path) -> None:
    spec = tmp_path / "hello.toml"
    spec.write_text("# mine\n")
    refused = _cantrip("init", cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"cantrip: {Path('hello.toml')} exists; --force overwrites"
    assert spec.read_text() == "# mine\n"
    forced = _cantrip("init", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "[llm]" in spec.read_text()


def test_init_into_a_folder_or_a_named_file(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    assert _cantrip("init", "work", cwd=tmp_path).returncode == 0
    assert (tmp_path / "work" / "hello.toml").exists()
    assert _cantrip("init", "mine.toml", cwd=tmp_path).returncode == 0
    assert (tmp_path / "mine.toml").read_text() == (tmp_path / "work" / "hello.toml").read_text()


def test_init_lists_the_shipped_examples(tmp_path: Path) -> None:
    listed = _cantrip("init", "--list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"hello", "evals", "read-files", "slow", "openai", "anthropic"} <= set(names)
    assert list(tmp_path.iterdir()) == []  # listing writes nothing


def test_every_listed_example_writes_files_that_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example is written into its own empty folder from the package, and every
    spec in it builds (the provider ones with a made-up key: building calls nobody)."""
    from cantrip.cli._init import EXAMPLES
    from cantrip.spec import build_cantrip, load_spec_file

    for key in ("OPENAI", "ANTHROPIC", "GEMINI", "OPENROUTER"):
        monkeypatch.setenv(f"{key}_API_KEY", "not-a-real-key")

    for name in EXAMPLES:
        folder = tmp_path / name
        made = _cantrip("init", name, str(folder), cwd=tmp_path)
        assert made.returncode == 0, (name, made.stderr)
        assert f"cd {folder} && cantrip " in made.stderr
        for spec in folder.rglob("*.toml"):
            build_cantrip(load_spec_file(spec), base_dir=spec.parent).loom.close()


def test_the_evals_example_replays_offline_from_an_empty_folder(tmp_path: Path) -> None:
    made = _cantrip("init", "evals", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    replay = _cantrip("eval", "evals/hello.yaml", "--replay", cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "2 passed, 0 failed" in replay.stdout


def test_the_read_files_example_reads_its_data(tmp_path: Path) -> None:
    assert _cantrip("init", "read-files", cwd=tmp_path).returncode == 0
    cast = _cantrip("cast", "read_files.toml", "Summarise the notes.", cwd=tmp_path)
    assert cast.returncode == 0, cast.stderr
    assert "three cantrips" in cast.stdout


def test_an_unknown_example_with_a_folder_is_refused_and_nothing_is_kept_over(
    tmp_path: Path,
) -> None:
    wrong = _cantrip("init", "evalz", "here", cwd=tmp_path)
    assert wrong.returncode == 1
    assert "no example named 'evalz' (cantrip init --list shows them)" in wrong.stderr
    (tmp_path / "hello.toml").write_text("# mine\n")
    clash = _cantrip("init", "evals", cwd=tmp_path)
    assert clash.returncode == 1 and "hello.toml exists; --force overwrites" in clash.stderr
    assert (tmp_path / "hello.toml").read_text() == "# mine\n"
    assert not (tmp_path / "evals").exists()  # all or nothing
