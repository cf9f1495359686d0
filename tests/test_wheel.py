"""The built distribution works outside the repository (issue 30.3).

``python -m build`` makes the sdist and, from it, the wheel (so the sdist is complete
too); the wheel goes into a fresh virtual environment in a temporary folder, and the
``cantrip`` command it installs runs ``--version``, ``init`` and a scripted cast there.
Its dependencies are the core's alone (issue 47.2: no extra), linked from this test's
environment (tests/core_env.py), so no download is needed; ``.ci/run`` does the same
with a plain ``pip install`` of the wheel, dependencies and all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import core_env
import pytest

from cantrip._version import DISTRIBUTION, __version__

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_distribution_name_is_ours() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "cantrip-runtime"
    assert project["license"] == "MIT"  # an SPDX expression, not the deprecated table
    assert project["license-files"] == ["LICENSE"]  # MIT asks for its text in every copy
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_every_install_line_names_the_distribution() -> None:
    """``pip install cantrip`` would install somebody else's project."""
    wrong = re.compile(r"pip install\s+['\"]?cantrip(?!-runtime)\b")
    texts = [ROOT / "README.md", ROOT / "SPEC.md", *ROOT.glob("docs/**/*.md")]
    texts += [*ROOT.glob("cantrip/**/*.py"), *ROOT.glob("bench/*.py")]
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in texts
        for line in path.read_text(encoding="utf-8").splitlines()
        if wrong.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.soak  # a build and a venv: about a minute under load
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    [wheel] = dist.glob("cantrip_runtime-*.whl")
    assert len(list(dist.glob("cantrip_runtime-*.tar.gz"))) == 1
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "cantrip/examples/hello.toml",
        "cantrip/examples/evals/hello.recording.jsonl",
        "cantrip/examples/data/notes.txt",
        "cantrip/examples/providers/openai.toml",
        "gates/__init__.py",
        "mediums/__init__.py",
    ):
        assert shipped in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=tmp_path)  # fmt: skip
    core_env.link(core_env.purelib(python))  # the core's dependencies, and nothing else

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    cantrip = venv / "bin" / "cantrip"
    assert _run(cantrip, "--version", cwd=work, env=env).strip() == f"cantrip {__version__}"
    where = _run(python, "-c", "import cantrip, gates; print(cantrip.__file__, gates.__file__)",
                 cwd=work, env=env)  # fmt: skip
    assert all(Path(p).is_relative_to(venv) for p in where.split()), where
    _run(cantrip, "init", cwd=work, env=env)
    answer = _run(cantrip, "cast", "hello.toml", "Greet the world, then finish.", cwd=work, env=env)
    assert answer.strip() == "I greeted the world."
