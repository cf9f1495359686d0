"""``cantrip init`` writes the starter spec shipped in the package, which casts offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
    assert refused.stderr.strip() == f"cantrip: {Path('hello.toml')} exists; --force overwrites it"
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
