"""JavaScript packages a test needs (official protocol clients run under node), installed
once per checkout with ``npm ci`` from the folder's lock file.

Several pytest-xdist workers may reach the first test that needs them at once; two
``npm ci`` runs in one folder delete each other's files, so the install holds an
exclusive lock on a file beside the lock file and the check is made again under it."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import trio

INSTALL_TIMEOUT_S = 240.0


async def ensure_npm_packages(folder: Path, needed: str) -> None:
    """``folder/node_modules/needed`` exists when this returns (``npm ci`` if it did not)."""
    if (folder / "node_modules" / needed).is_dir():
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
        if (folder / "node_modules" / needed).is_dir():
            return  # installed by another worker while this one waited
        await trio.run_process(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            capture_stdout=True,
        )
