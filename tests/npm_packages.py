"""JavaScript packages a test needs (official protocol clients run under node), installed
once per checkout with ``npm ci`` from the folder's lock file.

Several pytest-xdist workers may reach the first test that needs them at once; two
``npm ci`` runs in one folder delete each other's files, so the install holds an
exclusive lock on a file beside the lock file and the check is made again under it.
Whether an install is whole is told by a stamp written after ``npm ci`` succeeds, never
by a package's folder: npm makes those early, and a worker that saw one mid-install
ran node against half a ``node_modules``."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import trio

INSTALL_TIMEOUT_S = 240.0


STAMP = ".cantrip-npm-ci-done"
"""Written into ``node_modules`` once ``npm ci`` has finished there."""


def _installed(folder: Path, needed: str) -> bool:
    modules = folder / "node_modules"
    return (modules / STAMP).is_file() and (modules / needed).is_dir()


async def ensure_npm_packages(folder: Path, needed: str) -> None:
    """``folder``'s packages (``needed`` among them) are wholly installed when this
    returns (``npm ci`` if they were not)."""
    if _installed(folder, needed):
        return
    npm = shutil.which("npm")
    assert npm is not None, f"node and npm are needed for the tests using {folder.name}"
    with (folder / ".npm-install.lock").open("w") as lock, trio.fail_after(INSTALL_TIMEOUT_S):
        while True:  # another worker may be installing: poll the lock, never block the loop
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await trio.sleep(0.2)
        if _installed(folder, needed):
            return  # installed by another worker while this one waited
        await trio.run_process(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            capture_stdout=True,
        )
        (folder / "node_modules" / STAMP).write_text("npm ci finished\n")
