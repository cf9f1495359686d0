"""tests/npm_packages.py: a folder's JavaScript packages are installed whole before a
test runs node on them, however many xdist workers ask at once.

A real ``npm`` on a real folder whose one dependency is a local ``file:`` package (no
registry needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from npm_packages import ensure_npm_packages


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder depending on one local package, ``needed``, with its lock file."""
    root = tmp_path
    npm = shutil.which("npm")
    assert npm is not None
    source = root / "needed-src"
    source.mkdir()
    (source / "package.json").write_text(json.dumps({"name": "needed", "version": "1.0.0"}))
    (source / "index.js").write_text("export const ok = 1;\n")
    project = {"name": "t", "version": "1.0.0", "private": True}
    (root / "package.json").write_text(
        json.dumps({**project, "dependencies": {"needed": "file:needed-src"}})
    )
    subprocess.run(
        [npm, "install", "--package-lock-only", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=root,
        check=True,
        capture_output=True,
    )
    return root


@pytest.mark.loop_watch
async def test_a_half_made_install_is_finished_not_taken_for_done(folder: Path) -> None:
    """What another worker's ``npm ci`` shows while it runs: the package's folder made,
    its files not yet. That is no install (two agui client tests failed on it, node
    finding no ``index.js``): the install runs, and the package is whole after."""
    (folder / "node_modules" / "needed").mkdir(parents=True)  # mid-install
    await ensure_npm_packages(folder, "needed")
    assert (folder / "node_modules" / "needed" / "index.js").is_file()


@pytest.mark.loop_watch
async def test_workers_asking_at_once_get_one_whole_install(folder: Path) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ensure_npm_packages, folder, "needed")
    assert (folder / "node_modules" / "needed" / "index.js").is_file()
    await ensure_npm_packages(folder, "needed")  # whole already: nothing to do
